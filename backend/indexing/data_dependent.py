"""`nonzero`, `unique` (`_unique`, `_unique2`, `unique_dim`, `unique_consecutive`), `bincount` and
`repeat_interleave` without `output_size` on the chip, as CUDA runs them.

Their output's length depends on the values, and XLA compiles for fixed shapes. Before this they
ran as CPU fallbacks: the whole input was copied to the host and the result copied back. Now the
chip computes what fixes the length (the nonzero count; the number of distinct values, next to the
sorted values; the sum, min and max of the values), the host reads only that (one data-dependent sync, as
CUDA's kernels sync to size their output; in DEFER_AND_FUSE it flushes the pending graph), and a
program compiled for that length, rounded up (see `length_buckets`), computes the result on the chip
(see `ops.sized`), which is then cut to the length (`cuts.layout.cut`: read on the host, with no
program per length). Inputs with no element, or one, need no read.

Calls torch refuses for their shapes or dtypes keep the host fallback, which raises torch's error;
errors that depend on the values (a negative value in `bincount` or in `repeat_interleave`'s
repeats) are raised here once the values are read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tputrace.backend.core.entries import OpEntry, bound
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.indexing.cuts.layout import cut
from tputrace.backend.indexing.length_buckets import padded_length
from tputrace.backend.indexing.mask_counts import SYNC_KIND, count_set
from tputrace.backend.ops import sized
from tputrace.backend.ops.registry import Lowering

aten = torch.ops.aten

_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_REPEATS_DTYPES = (torch.int32, torch.int64)

Route = Callable[[Any, Sequence[Any], dict], Any | None]  # (dispatcher, args, kwargs) -> result, or None for the host


def sized_step(op: Any, fn: Callable) -> OpEntry:
    """A program of `op`'s run on the chip, recorded under its name; its output shapes come from
    `fn`'s static arguments (the op's own meta kernel cannot say them)."""
    return OpEntry(op, str(op), "lowered", lowering=Lowering(op, fn), shapes_from_lowering=True)


def _read(dispatcher: DispatcherApi, measured: Any) -> Any:
    """A measured value as Python numbers: the op's one data-dependent sync."""
    return dispatcher.to_host(measured, SYNC_KIND).tolist()


def nonzero(dispatcher: DispatcherApi, args: Sequence[Any], kwargs: dict) -> Any:
    """`nonzero`: the chip counts the nonzero elements, then lists them with `nonzero_static`."""
    (self,) = bound(aten.nonzero.default, args, kwargs)
    count = count_set(dispatcher.to_host, self)
    return cut(aten.nonzero_static.default(self, size=padded_length(count, self.numel())), 0, count)


_EXTREMES = {op: sized_step(op, sized.extremes) for op in (aten.repeat_interleave.Tensor, aten.bincount.default)}


def repeat_interleave(dispatcher: DispatcherApi, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`repeat_interleave(repeats)`: the lowered op with `output_size` set to the repeats' sum."""
    op = aten.repeat_interleave.Tensor
    repeats, output_size = bound(op, args, kwargs)
    if output_size is not None or repeats.dim() != 1 or repeats.dtype not in _REPEATS_DTYPES:
        return None
    total = 0
    if repeats.numel():
        total, low, _ = _read(dispatcher, dispatcher.compute(_EXTREMES[op], (repeats,), {}))
        if low < 0:
            raise RuntimeError("repeats can not be negative")
    return cut(op(repeats, output_size=padded_length(total) if total else 0), 0, total)  # padding repeats the last position


_BINCOUNT = sized_step(aten.bincount.default, sized.bincount_sized)


def bincount(dispatcher: DispatcherApi, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`bincount`: the chip finds the largest value (and checks the smallest), then counts into
    max(minlength, largest + 1) bins. An empty input gives int64 zeros, with weights too, as on the CPU."""
    op = aten.bincount.default
    self, weights, minlength = bound(op, args, kwargs)
    if self.dim() != 1 or self.dtype not in _INTEGER_DTYPES or minlength < 0:
        return None
    if weights is not None and (tuple(weights.shape) != tuple(self.shape) or weights.dtype.is_complex):
        return None
    if not self.numel():
        return dispatcher.compute(_BINCOUNT, (self, None), {"size": minlength})
    _, low, high = _read(dispatcher, dispatcher.compute(_EXTREMES[op], (self,), {}))
    if low < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    size = max(minlength, high + 1)
    return cut(dispatcher.compute(_BINCOUNT, (self, weights), {"size": padded_length(size)}), 0, size)


_UNIQUE_OPS = (aten._unique.default, aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default)
_UNIQUE_MEASURES = {op: sized_step(op, sized.unique_measure) for op in _UNIQUE_OPS}
_UNIQUE_SIZED = {op: sized_step(op, sized.unique_sized) for op in _UNIQUE_OPS}


def _unique(dispatcher: DispatcherApi, op: Any, self: Any, dim: int | None, sort: bool, return_inverse: bool, return_counts: bool) -> tuple | None:
    """(values, inverse, counts) of any `unique` op: the chip sorts (unless consecutive; with the
    order only for an inverse) and counts the groups, the host reads the count, then the chip
    gathers the groups' values, inverse and counts. None for what the host must refuse (complex values, a bad dim, a zero-size dim not
    selected)."""
    if self.dtype.is_complex:
        return None
    if dim is not None:
        if self.dim() == 0 or not -self.dim() <= dim < self.dim():
            return None
        dim %= self.dim()
        if not self.numel() and self.shape[dim]:
            return None
    length = self.numel() if dim is None else self.shape[dim]
    arranged = order = None
    size = length
    if length > 1:
        measured = dispatcher.compute(_UNIQUE_MEASURES[op], (self,), {"dim": dim, "sort": sort, "with_order": return_inverse})
        size = _read(dispatcher, measured[-1])
        if sort:
            arranged, order = measured[0], measured[1] if len(measured) == 3 else None
    options = {"size": padded_length(size, length), "dim": dim, "return_inverse": return_inverse, "return_counts": return_counts}
    values, inverse, counts = dispatcher.compute(_UNIQUE_SIZED[op], (self, arranged, order), options)
    return cut(values, 0 if dim is None else dim, size), inverse, cut(counts, 0, size) if return_counts else counts


def unique(dispatcher: DispatcherApi, args: Sequence[Any], kwargs: dict) -> tuple | None:
    """`_unique`: sorted values and, if asked, the inverse."""
    self, _, return_inverse = bound(aten._unique.default, args, kwargs)
    result = _unique(dispatcher, aten._unique.default, self, None, True, return_inverse, False)
    return None if result is None else result[:2]


def unique2(dispatcher: DispatcherApi, args: Sequence[Any], kwargs: dict) -> tuple | None:
    """`_unique2` (`torch.unique` without dim): sorted values, inverse and counts if asked (torch's
    CPU kernel sorts whatever `sorted` says, and so does this)."""
    self, _, return_inverse, return_counts = bound(aten._unique2.default, args, kwargs)
    return _unique(dispatcher, aten._unique2.default, self, None, True, return_inverse, return_counts)


def unique_dim(dispatcher: DispatcherApi, args: Sequence[Any], kwargs: dict) -> tuple | None:
    """`torch.unique(x, dim=d)`: sorted distinct slices along `dim`; the inverse and counts always
    come back, as torch's kernel returns them."""
    self, dim, _, _, _ = bound(aten.unique_dim.default, args, kwargs)
    return _unique(dispatcher, aten.unique_dim.default, self, dim, True, True, True)


def unique_consecutive(dispatcher: DispatcherApi, args: Sequence[Any], kwargs: dict) -> tuple | None:
    """`unique_consecutive`: runs of equal values (slices along `dim`, with the inverse and counts
    always, as torch returns them then)."""
    self, return_inverse, return_counts, dim = bound(aten.unique_consecutive.default, args, kwargs)
    if dim is not None:
        return_inverse = return_counts = True
    return _unique(dispatcher, aten.unique_consecutive.default, self, dim, False, return_inverse, return_counts)


# The ops whose calls run here rather than as a CPU fallback (see `Dispatcher.fallback`).
ROUTES: dict[Any, Route] = {
    aten.nonzero.default: nonzero,
    aten.repeat_interleave.Tensor: repeat_interleave,
    aten.bincount.default: bincount,
    aten._unique.default: unique,
    aten._unique2.default: unique2,
    aten.unique_dim.default: unique_dim,
    aten.unique_consecutive.default: unique_consecutive,
}
