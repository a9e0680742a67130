"""Sparse layouts on `tpu`: XLA has no sparse tensors.

- `nn.Embedding(sparse=True)` / `nn.EmbeddingBag(sparse=True)`: the weight's gradient is computed
  dense on the chip (warned once), where torch would build a sparse COO gradient (which crashed
  the process: autograd's C++ worker cannot make a sparse tpu tensor). The op is recorded under its
  sparse name (`aten.embedding_sparse_backward`), so a trace tells the layout the script asked for.
  A CPU fallback's sparse output comes back dense too.
- Optimizers that take dense gradients (SGD, Adam, Adagrad, ...) train as they would. `SparseAdam`,
  which refuses dense gradients, updates a tpu parameter as it would the sparse gradient: only the rows
  whose gradient is nonzero (the rows looked up) have their moments and values updated, as torch
  documents its masked update, on the chip and without reading the gradient on the host.
- A sparse tensor moved to `tpu` arrives dense (torch builds it from its indices and values, which
  the CPU fallback densifies); a factory of a sparse layout on `tpu` is a one-line error.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from tputrace.backend.core import routing

aten = torch.ops.aten
_library: torch.library.Library | None = None
_warned = False


def warn_dense(layout: Any) -> None:
    """Say once that a sparse result (a gradient, or a CPU fallback's output) is held dense."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"tputrace: {layout} tensors are not supported on tpu (XLA has no sparse tensors); "
            "sparse results such as an embedding's sparse gradient are held dense "
            "(SparseAdam updates the rows whose gradient is nonzero)",
            RuntimeWarning,
            stacklevel=3,
        )


def _dense_as(op: Any, recorded_name: str, args: tuple) -> Any:
    """`op` (a dense backward) run on the chip and recorded as `recorded_name`; through torch's own
    dispatch (which keeps an error on autograd's worker thread) when the dispatcher cannot run it."""
    try:
        dispatcher = routing.active()
        return dispatcher.compute(dispatcher._entry(op), args, {}, record_as=recorded_name)
    except Exception:  # noqa: BLE001 - the dispatch route below reports the error where the user sees it
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)


def _embedding_sparse_backward(grad: Any, indices: Any, num_weights: int, padding_idx: int, scale_grad_by_freq: bool) -> Any:
    warn_dense(torch.sparse_coo)
    return _dense_as(aten.embedding_dense_backward.default, "aten.embedding_sparse_backward.default",
                     (grad, indices, num_weights, padding_idx, scale_grad_by_freq))


def _embedding_bag_sparse_backward(
    grad: Any, indices: Any, offsets: Any, offset2bag: Any, bag_size: Any, num_weights: int,
    scale_grad_by_freq: bool, mode: int, per_sample_weights: Any, padding_idx: int = -1,
) -> Any:
    warn_dense(torch.sparse_coo)
    no_maximum_indices = torch.empty((0,), dtype=indices.dtype, device=indices.device)  # only mode "max" reads it
    return _dense_as(
        aten._embedding_bag_dense_backward.default, "aten._embedding_bag_sparse_backward.default",
        (grad, indices, offset2bag, bag_size, no_maximum_indices, num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx),
    )


def _embedding_bag_backward(
    grad: Any, indices: Any, offsets: Any, offset2bag: Any, bag_size: Any, maximum_indices: Any, num_weights: int,
    scale_grad_by_freq: bool, mode: int, sparse: bool, per_sample_weights: Any, padding_idx: int = -1,
) -> Any:
    """A bag's weight gradient (the lowering computes it dense), recorded under the sparse name for `sparse=True`."""
    args = (grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode, sparse,
            per_sample_weights, padding_idx)
    if not sparse:
        with torch._C._AutoDispatchBelowAutograd():
            return aten._embedding_bag_backward.default(*args)
    warn_dense(torch.sparse_coo)
    return _dense_as(aten._embedding_bag_backward.default, "aten._embedding_bag_sparse_backward.default", args)


def empty_layout_error(layout: Any) -> None:
    """Raise if a tpu tensor of a sparse `layout` is asked for."""
    if layout is not None and layout != torch.strided:
        raise _layout_error(layout)


def _layout_error(layout: Any) -> RuntimeError:
    return RuntimeError(f"{layout} tensors are not supported on tpu (XLA has no sparse tensors); convert with .to_dense() first")


def register() -> None:
    """Register the dense-gradient kernels once, ahead of torch's sparse ones for tpu tensors, and let
    `SparseAdam` step on the dense gradients of tpu parameters."""
    global _library
    if _library is None:
        _library = torch.library.Library("aten", "IMPL")
        _library.impl("embedding_sparse_backward", _embedding_sparse_backward, "AutogradPrivateUse1")
        _library.impl("_embedding_bag_sparse_backward", _embedding_bag_sparse_backward, "AutogradPrivateUse1")
        _library.impl("_embedding_bag_backward", _embedding_bag_backward, "AutogradPrivateUse1")
        _library.impl("empty.memory_format", _sparse_empty, "SparsePrivateUse1")
        _install_sparse_adam()


def _sparse_empty(size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None, memory_format: Any = None) -> Any:
    """A factory of a sparse layout on tpu (torch routes it to the SparsePrivateUse1 key)."""
    raise _layout_error(layout or torch.sparse_coo)


def _install_sparse_adam() -> None:
    """`SparseAdam.step` that also takes a tpu parameter's dense gradient (see the module's docstring);
    a step with no such gradient is torch's own."""
    sparse_adam = torch.optim.SparseAdam
    torch_step: Callable[..., Any] = sparse_adam.step

    def step(self: torch.optim.SparseAdam, closure: Callable[[], Any] | None = None) -> Any:
        if not any(_dense_on_tpu(param) for group in self.param_groups for param in group["params"]):
            return torch_step(self, closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for group in self.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        _masked_adam_step(self, group, param)
        return loss

    step.__doc__ = torch_step.__doc__
    sparse_adam.step = step  # type: ignore[method-assign]


def _dense_on_tpu(param: torch.Tensor) -> bool:
    grad = param.grad
    return grad is not None and not grad.is_sparse and grad.device.type == "tpu"


def _masked_adam_step(optimizer: torch.optim.SparseAdam, group: dict[str, Any], param: torch.Tensor) -> None:
    """One SparseAdam update of `param` from its dense gradient: the moments and values of the rows (the
    elements, for a vector) whose gradient is nonzero, as the sparse gradient of those rows would give."""
    grad = param.grad
    assert grad is not None
    if grad.is_sparse or grad.device.type != "tpu":
        raise RuntimeError("SparseAdam does not support dense gradients, please consider Adam instead")
    state = optimizer.state[param]
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    state["step"] += 1
    beta1, beta2 = group["betas"]
    lr = group["lr"]
    lr = float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)
    if group.get("maximize", False):
        grad = -grad
    touched = grad.ne(0)
    if grad.dim() > 1:
        touched = touched.flatten(1).any(1).reshape((-1,) + (1,) * (grad.dim() - 1))
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    exp_avg.copy_(torch.where(touched, exp_avg.lerp(grad, 1 - beta1), exp_avg))
    exp_avg_sq.copy_(torch.where(touched, exp_avg_sq.mul(beta2).addcmul(grad, grad, value=1 - beta2), exp_avg_sq))
    step = state["step"]
    step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    update = exp_avg.div(exp_avg_sq.sqrt().add(group["eps"])).mul(step_size)
    param.sub_(torch.where(touched, update, torch.zeros_like(update)))
