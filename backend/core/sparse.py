"""Sparse layouts on `tpu`: XLA has no sparse tensors.

- `nn.Embedding(sparse=True)` / `nn.EmbeddingBag(sparse=True)`: the weight's gradient is computed
  dense on the chip (warned once), where torch would build a sparse COO gradient (which crashed
  the process: autograd's C++ worker cannot make a sparse tpu tensor). A CPU fallback's sparse
  output comes back dense too. Optimizers that take dense
  gradients (SGD, Adam, ...) train as they would; `SparseAdam` raises its own error on them.
- A sparse tensor moved to `tpu` arrives dense (torch builds it from its indices and values, which
  the CPU fallback densifies); a factory of a sparse layout on `tpu` is a one-line error.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

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
            "sparse results such as an embedding's sparse gradient are held dense",
            RuntimeWarning,
            stacklevel=3,
        )


def _embedding_sparse_backward(grad: Any, indices: Any, num_weights: int, padding_idx: int, scale_grad_by_freq: bool) -> Any:
    warn_dense(torch.sparse_coo)
    return aten.embedding_dense_backward.default(grad, indices, num_weights, padding_idx, scale_grad_by_freq)


def _embedding_bag_sparse_backward(
    grad: Any, indices: Any, offsets: Any, offset2bag: Any, bag_size: Any, num_weights: int,
    scale_grad_by_freq: bool, mode: int, per_sample_weights: Any, padding_idx: int = -1,
) -> Any:
    warn_dense(torch.sparse_coo)
    no_maximum_indices = torch.empty((0,), dtype=indices.dtype, device=indices.device)  # only mode "max" reads it
    return aten._embedding_bag_dense_backward.default(
        grad, indices, offset2bag, bag_size, no_maximum_indices, num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx
    )


def empty_layout_error(layout: Any) -> None:
    """Raise if a tpu tensor of a sparse `layout` is asked for."""
    if layout is not None and layout != torch.strided:
        raise _layout_error(layout)


def _layout_error(layout: Any) -> RuntimeError:
    return RuntimeError(f"{layout} tensors are not supported on tpu (XLA has no sparse tensors); convert with .to_dense() first")


def register() -> None:
    """Register the dense-gradient kernels once, ahead of torch's sparse ones for tpu tensors."""
    global _library
    if _library is None:
        _library = torch.library.Library("aten", "IMPL")
        _library.impl("embedding_sparse_backward", _embedding_sparse_backward, "AutogradPrivateUse1")
        _library.impl("_embedding_bag_sparse_backward", _embedding_bag_sparse_backward, "AutogradPrivateUse1")
        _library.impl("empty.memory_format", _sparse_empty, "SparsePrivateUse1")


def _sparse_empty(size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None, memory_format: Any = None) -> Any:
    """A factory of a sparse layout on tpu (torch routes it to the SparsePrivateUse1 key)."""
    raise _layout_error(layout or torch.sparse_coo)
