"""Reads of a data-dependent output without a program per length.

`nonzero`, `x[mask]`, `unique` and the like run a program compiled for a padded length (see
`length_buckets`) and return the first `length` entries of its output: a narrow view (`cut`). Read on
the chip, that view is a slice program compiled for each distinct length, which is what bucketing
avoids. Read on the host (`.cpu()`, `.tolist()`, `.item()`, `print`), it needs no program: the padded
buffer is copied (at most a quarter more bytes, see `length_buckets`) and cut on the host. A pointwise
op on the chip (`x[mask] * 2`, `torch.where(x[mask] > 0, ...)`) runs on the padded buffers and its
result is cut in turn (`on_padded`): each entry depends only on the entries at its position, so
the first `length` are the op's on the cut, and the program is the padded length's. A sum, `amax`
or `amin` of a cut (`x[mask].sum()`) reduces the padded buffer, its padding first set to the
reduction's identity by a program that takes the length as a traced number.

A masked loss and its backward (`F.cross_entropy(logits[mask], tokens[mask])` with or without
`label_smoothing`, `x[mask].mean()`, `F.mse_loss(a[mask], b[mask])`, a linear layer on `x[mask]`)
run on the padded buffers too: a mean divides the zero-padded sum by the count; `nll_loss`,
`mse_loss`, a softmax along the cut dim and the weight gradient of a matmul (a sum over the rows)
leave the padded rows out (`ops.padded`), each program taking the length as a traced number; a
matmul of the rows, a softmax along another dim, a cumulative sum, `zeros_like` and `new_zeros`
compute row by row (or prefix by prefix) or read only the dtype; `masked_fill_` of a cut writes
its buffer before the length only; the gradient of `x[mask]` scatters its padded rows through the
mask (the k-th set element takes the k-th row, so rows past the count are never read), the
`expand` of a gradient to the cut's length is broadcast to the padded length
(`expand_in_backward`) and its `squeeze` copies the padded buffer (`squeeze_in_backward`), and a
pointwise op reads a cut's `unsqueeze` (`weights.unsqueeze(-1) * rows`) as the padded buffer's.
Other ops that read the view (a reshape, a matmul with the cut on the right) need the exact shape,
and compile for it as the op itself does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd.graph import _engine_run_backward

import jax.numpy as jnp
from jax import Array, lax

from tputrace.backend.arg_checks import check_write
from tputrace.backend.entries import OpEntry
from tputrace.backend.mask_counts import MASK_DTYPES
from tputrace.backend.op_routes import bound
from tputrace.backend.ops import padded
from tputrace.backend.ops.registry import Lowering
from tputrace.backend.tensor import TpuTensor, whole_buffer
from tputrace.backend.views import ViewChain

aten = torch.ops.aten
_BACKEND_DIR = os.path.dirname(os.path.abspath(__file__))  # this module's package: the frames of the dispatch
_ENGINE_RUN_BACKWARD = _engine_run_backward.__code__  # where `backward()` and `autograd.grad` enter the engine

_pointwise: dict[Any, bool] = {}  # op entry -> whether it is a deterministic pointwise op of one output
# Whether this process has made a cut yet: until it has, no op's inputs need looking at for one.
cuts_made = False


_REMEMBERED_LENGTHS = 16
_padded_lengths: dict[int, int] = {}  # the lengths of the latest cuts -> the padded length each was cut from


def cut(padded: Any, dim: int, length: int) -> Any:
    """The first `length` entries along `dim` of `padded` (an output compiled for a padded length): a
    view whose chain is marked, so that a host read of any tensor seen through it copies the buffer
    and cuts it there (`host_cut`)."""
    global cuts_made
    view = padded.narrow(dim, 0, length)  # a whole-length cut too, so its consumers share the padded programs
    if padded._view is None:
        view._view.host_cut = (dim, length)
        if not cuts_made:
            _route_through_cuts()
        cuts_made = True
        _padded_lengths.pop(length, None)
        if len(_padded_lengths) >= _REMEMBERED_LENGTHS:
            del _padded_lengths[next(iter(_padded_lengths))]
        _padded_lengths[length] = padded.shape[dim]
    return view


def _route_through_cuts() -> None:
    """From the process's first cut on, `expand` tries `expand_in_backward` first, `squeeze(dim)`
    `squeeze_in_backward` and `masked_fill_` `masked_fill_on_cut`; until then they take their plain
    routes, at no cost to processes that never cut."""
    from tputrace.backend.dispatch import dispatcher  # dispatch imports this module

    def first(op: Any, on_cut: Any) -> None:
        handler, entry = dispatcher.routes.get(id(op)) or dispatcher._route(op)

        def route(args: Sequence[Any], kwargs: dict) -> Any:
            result = on_cut(dispatcher, op, args, kwargs)
            return handler(entry, args, kwargs) if result is None else result

        dispatcher.register_special(op, route)

    first(aten.expand.default, lambda dispatcher, op, args, kwargs: expand_in_backward(dispatcher, args, kwargs))
    first(aten.squeeze.dim, squeeze_in_backward)
    for op in (aten.masked_fill_.Scalar, aten.masked_fill_.Tensor):
        first(op, masked_fill_on_cut)


def expand_in_backward(dispatcher: Any, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`expand` run by autograd's backward to the length of a recent cut along a new or size-1 dim
    (the backward of `x[mask].mean()` or `.sum()`: `grad.expand(x[mask].shape)`; of the latest cut's
    length where several dims have such lengths), or of a cut (or its `unsqueeze`) along another
    dim: the tensor broadcast to the padded length, then cut, so that the gradient's ops run on the
    padded buffer (the same values, whichever dim is taken).
    None (a plain view) elsewhere: outside a backward the result must alias its input, and so must
    that of an expand called from Python code in a backward (a custom Function's, a hook), which may
    write into it (torch refuses a write into an expanded tensor); autograd's own formulas, which
    call it from C++, do not write into an expanded gradient."""
    if type(args[0]) is not TpuTensor or torch._C._current_graph_task_id() == -1 or not _called_by_a_formula():
        return None
    self, size = args[0], list(args[1] if len(args) > 1 else kwargs["size"])
    leading = len(size) - self.dim()
    if leading < 0:
        return None
    size = [self.shape[dim - leading] if target == -1 and dim >= leading else target for dim, target in enumerate(size)]
    source = _cut_or_unsqueezed(self)
    if source is not None:  # the backward of a reduction along another dim (`x[mask].sum(1)`)
        padded_self, cut_dim, length = source
        cut_dim += leading
        if size[cut_dim] != length:
            return None
        size[cut_dim] = padded_self.shape[cut_dim - leading]
        return cut(aten.expand_copy.default(padded_self, size), cut_dim, length)
    dims = [dim for dim, target in enumerate(size) if target in _padded_lengths and target > 1 and (dim < leading or self.shape[dim - leading] == 1)]
    if not dims:
        return None
    recent = list(_padded_lengths)  # the latest cut last
    dim = max(dims, key=lambda dim: (recent.index(size[dim]), -dim))
    length = size[dim]
    size[dim] = _padded_lengths[length]
    return cut(aten.expand_copy.default(self, size), dim, length)


def _cut_layout(value: Any) -> tuple[int, int, int | None] | None:
    """(the cut dim in the value, the length, the dim an `unsqueeze` inserted or None) for a cut or an
    `unsqueeze` of one (`weights.unsqueeze(-1)`); else None."""
    if is_cut(value):
        return (*value._view.host_cut, None)
    under = _cut_then(value, aten.unsqueeze.default)
    if under is None:
        return None
    dim, length, step = under
    at = step.args[0] % value.dim()
    return dim + (at <= dim), length, at


def _padded_of(value: TpuTensor, unsqueezed_at: int | None) -> TpuTensor:
    """The padded buffer of a cut, or of the cut an `unsqueeze` at `unsqueezed_at` was applied to, seen
    with the value's dims (`_cut_layout`)."""
    buffer = whole_buffer(value)
    return buffer if unsqueezed_at is None else aten.unsqueeze.default(buffer, unsqueezed_at)


def _cut_or_unsqueezed(value: TpuTensor) -> tuple[TpuTensor, int, int] | None:
    """(the padded buffer with the value's dims, the cut dim, the length) for a cut or an `unsqueeze`
    of one; else None."""
    layout = _cut_layout(value)
    if layout is None:
        return None
    dim, length, unsqueezed_at = layout
    return _padded_of(value, unsqueezed_at), dim, length


def squeeze_in_backward(dispatcher: Any, op: Any, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`squeeze(dim)` of a cut run by autograd's backward (the gradient of `weights.unsqueeze(-1)`)
    along a size-1 dim other than the cut's: a copy of the padded buffer squeezed, cut in turn, so
    that the gradient's ops run on the padded buffer. None (a plain view) elsewhere, as for
    `expand_in_backward`."""
    if not is_cut(args[0]):
        return None
    self, dim = bound(op, args, kwargs)
    if not -self.dim() <= dim < self.dim() or torch._C._current_graph_task_id() == -1 or not _called_by_a_formula():
        return None
    dim %= self.dim()
    cut_dim, length = self._view.host_cut
    if dim == cut_dim or self.shape[dim] != 1:
        return None
    return cut(aten.squeeze_copy.dim(whole_buffer(self), dim), cut_dim - (dim < cut_dim), length)


def masked_fill_on_cut(dispatcher: Any, op: Any, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`masked_fill_` of a cut through a mask cut alike (`cross_entropy` with `label_smoothing` fills
    the ignored rows of its smoothing term): `masked_fill` of the padded buffers, written into the
    cut's buffer before the length only (`ops.padded.keep_past`); None (its plain route) elsewhere."""
    if not is_cut(args[0]):
        return None
    self, mask, value = bound(op, args, kwargs)
    if _shared_cut((self, mask)) is None or is_cut(value):
        return None
    check_write(self, (mask, value), op)
    dim, length = self._view.host_cut
    buffer = whole_buffer(self)
    filled = dispatcher.compute(dispatcher._entry(_OUT_OF_PLACE[op]), (buffer, whole_buffer(mask), value), {}, str(op))
    kept = dispatcher.compute(_KEEP_PAST, (filled, buffer, length), {"dim": dim}, str(op))
    dispatcher.write(buffer, dispatcher.read(kept))
    return self


_OUT_OF_PLACE = {aten.masked_fill_.Scalar: aten.masked_fill.Scalar, aten.masked_fill_.Tensor: aten.masked_fill.Tensor}


def _called_by_a_formula() -> bool:
    """Whether the op being dispatched was called from C++ (one of autograd's built-in backward formulas),
    not from Python code: the first frame below the backend's own is the backward's call into the engine
    (`_engine_run_backward`), or there is none (the engine's worker thread)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_BACKEND_DIR):
        frame = frame.f_back
    return frame is None or frame.f_code is _ENGINE_RUN_BACKWARD


def host_cut(tensor: Any) -> tuple[int, int] | None:
    """(dim, length) when `tensor` is the first `length` entries along `dim` of its buffer's array and
    is read by cutting that array on the host, else None. (A chain belongs to one base geometry, so
    any view of the same steps is such a cut too.)"""
    view = tensor._view
    return None if view is None else view.host_cut


def on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`entry`'s op on the padded buffers of the cuts among its inputs, its result cut in turn where
    it keeps the cut dim; None when the op needs the exact shape (see the module's note)."""
    route = _ROUTES.get(entry.op)
    if route is not None:
        return route(dispatcher, entry, args, kwargs, record_as)
    return _pointwise_on_padded(dispatcher, entry, args, kwargs, record_as)


def _pointwise_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """A pointwise op whose inputs include cuts (or their `unsqueeze`), run on their padded buffers and
    cut to the length; None when it cannot be: an op that is not pointwise (or draws random numbers),
    cuts of different lengths, dims or padded lengths, or another input that does not broadcast along
    the cut dim."""
    if not _is_pointwise(entry) or any(is_cut(value) for value in kwargs.values()):
        return None
    layouts = {position: _cut_layout(value) for position, value in enumerate(args) if type(value) is TpuTensor}
    layouts = {position: layout for position, layout in layouts.items() if layout is not None}
    cuts = {position: _cut_from_end(args[position], layout) for position, layout in layouts.items()}
    if len(set(cuts.values())) != 1:
        return None
    from_end, length, _ = next(iter(cuts.values()))
    others = [tuple(value.shape) for position, value in enumerate(args) if isinstance(value, torch.Tensor) and position not in cuts]
    try:
        shape = torch.broadcast_shapes(*others, *(tuple(args[position].shape) for position in cuts))
    except RuntimeError:  # the op raises torch's error on the cut
        return None
    if shape[from_end] != length or any(len(other) >= -from_end and other[from_end] != 1 for other in others):
        return None
    padded_args = [_padded_of(value, layouts[position][2]) if position in cuts else value for position, value in enumerate(args)]
    result = dispatcher.compute(entry, padded_args, kwargs, record_as)
    return cut(result, result.dim() + from_end, length)


def is_cut(value: Any) -> bool:
    """Whether `value` is a tpu tensor read as a cut of its padded buffer (`cut`)."""
    return type(value) is TpuTensor and value._view is not None and value._view.host_cut is not None


def _cut_from_end(value: TpuTensor, layout: tuple[int, int, int | None]) -> tuple[int, int, int]:
    """(the cut dim counted from the end, as broadcasting aligns dims; the length; the padded length)
    of a value of that `_cut_layout`."""
    dim, length, unsqueezed_at = layout
    return dim - value.dim(), length, value._buf.array.shape[dim - (unsqueezed_at is not None and unsqueezed_at < dim)]


def _is_pointwise(entry: Any) -> bool:
    known = _pointwise.get(entry)
    if known is None:
        op = entry.op
        known = _pointwise[entry] = (
            isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags and torch.Tag.nondeterministic_seeded not in op.tags
            and len(op._schema.returns) == 1 and entry.lowering is not None and not entry.lowering.needs_key
        )
    return known


def _lowest(dtype: torch.dtype) -> float | int | bool:
    if dtype == torch.bool:
        return False
    return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min


def _highest(dtype: torch.dtype) -> float | int | bool:
    if dtype == torch.bool:
        return True
    return float("inf") if dtype.is_floating_point else torch.iinfo(dtype).max


# Reductions run on a padded buffer, by the value that leaves each one unchanged (for the input's dtype).
_IDENTITIES = {
    aten.sum.default: lambda dtype: False if dtype == torch.bool else 0,
    aten.sum.dim_IntList: lambda dtype: False if dtype == torch.bool else 0,
    aten.amax.default: _lowest,
    aten.amin.default: _highest,
}


def fill_past(padded: Array, length: Array, *, dim: int, fill: float | int | bool) -> Array:
    """`padded` with its entries at `length` and past along `dim` set to `fill` (`length` is traced:
    one program per padded length)."""
    position = lax.broadcasted_iota(jnp.int32, padded.shape, dim)
    return jnp.where(position < length, padded, jnp.asarray(fill, padded.dtype))


_FILL_PAST = OpEntry(aten.where.self, "aten.where.self", "lowered", lowering=Lowering(aten.where.self, fill_past), shapes_from_lowering=True, scalar_positions=frozenset({1}))


def _reduction_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """A sum, `amax`, `amin` or mean of a cut: of its padded buffer with the padding set to the
    identity (a mean: zeroed, the sum divided by the count), where it reduces the cut dim; else of the
    buffer as it is, the result cut in turn. None for an empty cut or a complex one."""
    self = args[0]
    if not is_cut(self) or any(is_cut(value) for value in (*args[1:], *kwargs.values())) or self.is_complex():
        return None
    dim, length = self._view.host_cut
    if not length:  # nothing to reduce: `amax` raises torch's error, a sum is zeros
        return None
    reduced = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    dims = range(self.dim()) if not reduced else [axis % self.dim() for axis in reduced]
    padded = whole_buffer(self)
    if dim in dims and entry.op in _MEANS:
        if not (self.dtype.is_floating_point if kwargs.get("dtype") is None else kwargs["dtype"].is_floating_point):
            return None  # torch refuses the mean of integers without a floating dtype
        options = {"cut_dim": dim, "dims": tuple(dims), "keepdim": keepdim, "dtype": kwargs.get("dtype")}
        return dispatcher.compute(_MEANS[entry.op], (padded, length), options, record_as or entry.name)
    if dim in dims:
        padded = dispatcher.compute(_FILL_PAST, (padded, length), {"dim": dim, "fill": _IDENTITIES[entry.op](self.dtype)})
    result = dispatcher.compute(entry, (padded, *args[1:]), kwargs, record_as)
    if dim in dims:
        return result
    return cut(result, dim if keepdim else dim - sum(1 for axis in dims if axis < dim), length)


def _padded_step(op: Any, fn: Any, length_at: int, *, matmul_precision: bool = False) -> OpEntry:
    """A program of `op` on padded buffers, recorded under its name, that takes the length as a
    traced number at `length_at` (one program per padded length)."""
    lowering = Lowering(op, fn, matmul_precision=matmul_precision)
    return OpEntry(op, str(op), "lowered", lowering=lowering, shapes_from_lowering=True, scalar_positions=frozenset({length_at}))


_MEANS = {op: _padded_step(op, padded.mean_padded, 1) for op in (aten.mean.default, aten.mean.dim)}
_NLL_LOSS = _padded_step(aten.nll_loss_forward.default, padded.nll_loss_forward_padded, 3)
_NLL_LOSS_BACKWARD = _padded_step(aten.nll_loss_backward.default, padded.nll_loss_backward_padded, 5)
_MSE_LOSS = _padded_step(aten.mse_loss.default, padded.mse_loss_padded, 2)
_MSE_LOSS_BACKWARD = _padded_step(aten.mse_loss_backward.default, padded.mse_loss_backward_padded, 3)
_MM_OVER_ROWS = _padded_step(aten.mm.default, padded.mm_over_rows_padded, 2, matmul_precision=True)
_KEEP_PAST = _padded_step(aten.where.self, padded.keep_past, 2)
_NO_REDUCTION = 0


def _shared_cut(values: Sequence[Any]) -> tuple[int, int] | None:
    """(dim, length) when every value is a cut of that dim and length, of one shape and one padded
    shape; else None."""
    if not all(is_cut(value) for value in values):
        return None
    first = values[0]
    layout = (first._view.host_cut, tuple(first.shape), tuple(first._buf.array.shape))
    if any((value._view.host_cut, tuple(value.shape), tuple(value._buf.array.shape)) != layout for value in values[1:]):
        return None
    return first._view.host_cut


def _rowwise_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """A softmax, log-softmax or their backward of cuts alike. Along a dim other than the cut's, each
    row of the padded buffers is computed on its own, so the first `length` are the op's on the cuts;
    along the cut dim (a softmax over the selected rows), the padding is left out of the
    normalisation (`ops.padded.softmax_along_cut_padded`)."""
    tensors = [value for value in args if isinstance(value, torch.Tensor)]
    shared = _shared_cut(tensors)
    if shared is None or kwargs or len(args) != len(tensors) + 2:
        return None
    cut_dim, length = shared
    along, last = args[len(tensors):]
    if not -tensors[0].dim() <= along < tensors[0].dim():
        return None
    padded_tensors = [whole_buffer(value) for value in tensors]
    if along % tensors[0].dim() != cut_dim:
        result = dispatcher.compute(entry, [*padded_tensors, along, last], kwargs, record_as)
    else:
        step, last_name, log = _ALONG_CUT[entry.op]
        result = dispatcher.compute(step, (*padded_tensors, length), {"dim": cut_dim, last_name: last, "log": log}, record_as or entry.name)
    return cut(result, cut_dim, length)


_ALONG_CUT = {  # op -> (its program along the cut dim, the name of its last argument, whether it is the log form)
    aten._softmax.default: (_padded_step(aten._softmax.default, padded.softmax_along_cut_padded, 1), "half_to_float", False),
    aten._log_softmax.default: (_padded_step(aten._log_softmax.default, padded.softmax_along_cut_padded, 1), "half_to_float", True),
    aten._softmax_backward_data.default: (
        _padded_step(aten._softmax_backward_data.default, padded.softmax_backward_along_cut_padded, 2), "input_dtype", False
    ),
    aten._log_softmax_backward_data.default: (
        _padded_step(aten._log_softmax_backward_data.default, padded.softmax_backward_along_cut_padded, 2), "input_dtype", True
    ),
}
_FLIP_CUT = _padded_step(aten.flip.default, padded.flip_cut_padded, 1)


def _flip_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`flip` of a cut (the backward of its `cumsum`): along other dims, of its padded buffer; along
    the cut dim, the cut's entries reversed to the front (`ops.padded.flip_cut_padded`); cut in turn."""
    self, dims = bound(entry.op, args, kwargs)
    if not is_cut(self):
        return None
    axes = [axis % self.dim() for axis in dims if -self.dim() <= axis < self.dim()]
    if len(axes) != len(dims) or len(set(axes)) != len(axes):
        return None  # the exact path raises torch's error
    cut_dim, length = self._view.host_cut
    if cut_dim not in axes:
        return cut(dispatcher.compute(entry, (whole_buffer(self), dims), {}, record_as), cut_dim, length)
    options = {"dims": tuple(axes), "cut_dim": cut_dim}
    return cut(dispatcher.compute(_FLIP_CUT, (whole_buffer(self), length), options, record_as or entry.name), cut_dim, length)


def _new_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`new_zeros` and the like of a cut read only its dtype and device: made from its padded buffer."""
    if not is_cut(args[0]) or any(is_cut(value) for value in (*args[1:], *kwargs.values())):
        return None
    return dispatcher.compute(entry, (whole_buffer(args[0]), *args[1:]), kwargs, record_as)


def _prefix_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """An op of one cut whose first `length` entries along the cut dim depend on the cut's only
    (`zeros_like` and the like; a cumulative sum, product or logcumsumexp, each entry on those
    before it): of its padded buffer, cut in turn."""
    if not is_cut(args[0]) or any(is_cut(value) for value in (*args[1:], *kwargs.values())):
        return None
    dim, length = args[0]._view.host_cut
    return cut(dispatcher.compute(entry, (whole_buffer(args[0]), *args[1:]), kwargs, record_as), dim, length)


def _loss_rows(self: Any, target: Any) -> int | None:
    """The length of scores (N, C) and targets (N,), or (N, C, H, W) and (N, H, W) (`nll_loss2d`: the
    samples of a batch kept by a mask), cut to the same number of rows; else None."""
    if self.dim() not in (2, 4) or self.dim() != target.dim() + 1 or tuple(self.shape[2:]) != tuple(target.shape[1:]):
        return None
    if not is_cut(self) or not is_cut(target):
        return None
    (self_dim, length), (target_dim, target_length) = self._view.host_cut, target._view.host_cut
    if self_dim or target_dim or length != target_length or self._buf.array.shape[0] != target._buf.array.shape[0]:
        return None
    return length


def _nll_loss_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`nll_loss_forward` of cut scores and targets: the padded rows get `ignore_index`."""
    self, target, weight, reduction, ignore_index = bound(entry.op, args, kwargs)
    length = _loss_rows(self, target)
    if length is None or is_cut(weight):
        return None
    options = {"reduction": reduction, "ignore_index": ignore_index}
    output, total_weight = dispatcher.compute(_NLL_LOSS, (whole_buffer(self), whole_buffer(target), weight, length), options, record_as or entry.name)
    return (cut(output, 0, length) if reduction == _NO_REDUCTION else output), total_weight


def _nll_loss_backward_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`nll_loss_backward` of cut scores and targets: the padded rows' gradient is zero."""
    grad_output, self, target, weight, reduction, ignore_index, total_weight = bound(entry.op, args, kwargs)
    length = _loss_rows(self, target)
    if length is None or is_cut(weight) or is_cut(total_weight):
        return None
    if is_cut(grad_output):
        if reduction != _NO_REDUCTION or _shared_cut((grad_output, target)) is None:
            return None
        grad_output = whole_buffer(grad_output)
    options = {"reduction": reduction, "ignore_index": ignore_index}
    inputs = (grad_output, whole_buffer(self), whole_buffer(target), weight, total_weight, length)
    return cut(dispatcher.compute(_NLL_LOSS_BACKWARD, inputs, options, record_as or entry.name), 0, length)


def _mse_loss_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`mse_loss` of two cuts alike: the padded entries' difference is zero (a mean divides by the count)."""
    self, target, reduction = bound(entry.op, args, kwargs)
    shared = _shared_cut((self, target))
    if shared is None or self.is_complex():
        return None
    cut_dim, length = shared
    if reduction == _NO_REDUCTION:
        return cut(dispatcher.compute(entry, (whole_buffer(self), whole_buffer(target), reduction), {}, record_as), cut_dim, length)
    options = {"cut_dim": cut_dim, "reduction": reduction}
    return dispatcher.compute(_MSE_LOSS, (whole_buffer(self), whole_buffer(target), length), options, record_as or entry.name)


def _mse_loss_backward_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`mse_loss_backward` of two cuts alike (and of a cut gradient, without reduction)."""
    grad_output, self, target, reduction = bound(entry.op, args, kwargs)
    shared = _shared_cut((self, target))
    if shared is None or self.is_complex():
        return None
    cut_dim, length = shared
    if reduction == _NO_REDUCTION:
        if is_cut(grad_output) and _shared_cut((grad_output, self)) is None:
            return None
        grad_output = whole_buffer(grad_output) if is_cut(grad_output) else grad_output
        return cut(dispatcher.compute(entry, (grad_output, whole_buffer(self), whole_buffer(target), reduction), {}, record_as), cut_dim, length)
    if is_cut(grad_output):
        return None
    options = {"cut_dim": cut_dim, "reduction": reduction}
    inputs = (grad_output, whole_buffer(self), whole_buffer(target), length)
    return cut(dispatcher.compute(_MSE_LOSS_BACKWARD, inputs, options, record_as or entry.name), cut_dim, length)


def _cut_then(value: Any, view_op: Any) -> tuple[int, int, Any] | None:
    """(the cut dim, the length, the step) when `value` is `view_op` applied to a cut (`.t()` of
    `x[mask]`, its `unsqueeze(1)`); else None."""
    if type(value) is not TpuTensor or value._view is None:
        return None
    steps = value._view.steps
    if len(steps) != 2 or steps[1].key[0] is not view_op:
        return None
    under = ViewChain.root(steps[0]).host_cut  # the chain of the first step exists: it was made first
    return None if under is None else (*under, steps[1])


def _matmul_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`mm` or `addmm` of a 2-D row cut by a matrix that is not a cut (a linear layer on `x[mask]`, or
    its input's gradient): each row of the product is its row's, so it runs on the padded rows and is
    cut in turn. `mm` of a transposed row cut by a row cut of the same length (the weight's
    gradient) sums over the rows: the real rows only (`ops.padded.mm_over_rows_padded`)."""
    if entry.op is aten.mm.default:
        bias, (mat1, mat2) = None, bound(entry.op, args, kwargs)
    else:
        bias, mat1, mat2, _, _ = bound(entry.op, args, kwargs)
        if is_cut(bias) or (bias.dim() == 2 and bias.shape[0] != 1):
            return None
    if is_cut(mat1) and mat1.dim() == 2 and mat1._view.host_cut[0] == 0 and not is_cut(mat2):
        padded_args = [whole_buffer(value) if value is mat1 else value for value in args]
        padded_kwargs = {name: whole_buffer(value) if value is mat1 else value for name, value in kwargs.items()}
        return cut(dispatcher.compute(entry, padded_args, padded_kwargs, record_as), 0, mat1._view.host_cut[1])
    transposed = _cut_then(mat1, aten.t.default)
    if bias is not None or transposed is None or not is_cut(mat2) or mat2.dim() != 2:
        return None
    cut_dim, length, _ = transposed
    if cut_dim or mat2._view.host_cut != (0, length) or mat1._buf.array.shape[0] != mat2._buf.array.shape[0]:
        return None
    return dispatcher.compute(_MM_OVER_ROWS, (whole_buffer(mat1), whole_buffer(mat2), length), {}, record_as or entry.name)


def _index_put_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`index_put` through one mask of values cut to the mask's count (the backward of `x[mask]`
    scatters its gradient so): the k-th set element takes the k-th row of the padded values, and
    rows past the count are never read. A cut of one row is left to the exact path (a single row
    broadcasts to every set element)."""
    self, indices, values, *rest = bound(entry.op, args, kwargs)
    if is_cut(self) or len(indices) != 1 or indices[0] is None or indices[0].dtype not in MASK_DTYPES or not is_cut(values):
        return None
    dim, length = values._view.host_cut
    if dim or length <= 1 or values.dim() != self.dim() - indices[0].dim() + 1:
        return None
    return dispatcher.compute(entry, (self, indices, whole_buffer(values), *rest), {}, record_as)


_ROUTES: dict[Any, Any] = {
    **{op: _reduction_on_padded for op in (*_IDENTITIES, *_MEANS)},
    **{op: _rowwise_on_padded for op in (aten._softmax.default, aten._log_softmax.default, aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)},
    **{op: _new_on_padded for op in (aten.new_zeros.default, aten.new_empty.default, aten.new_ones.default, aten.new_full.default, aten.new_empty_strided.default)},
    **{op: _prefix_on_padded for op in (aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default, aten.full_like.default)},
    **{op: _prefix_on_padded for op in (aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default)},
    aten.flip.default: _flip_on_padded,
    aten.mm.default: _matmul_on_padded,
    aten.addmm.default: _matmul_on_padded,
    **{op: _nll_loss_on_padded for op in (aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)},
    **{op: _nll_loss_backward_on_padded for op in (aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)},
    aten.mse_loss.default: _mse_loss_on_padded,
    aten.mse_loss_backward.default: _mse_loss_backward_on_padded,
    **{op: _index_put_on_padded for op in (aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default)},
}
