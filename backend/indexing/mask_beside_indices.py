"""`x[mask, idx]`, `x[idx, mask]` and their writes: one mask beside other indices, without a program
per count.

Torch turns the mask into the positions of its set elements (`nonzero`), which broadcast with the
other index tensors. Those positions have the mask's count as their length, so a program built on
them (the gather, its index check, the slices of the positions) compiles once per distinct count.
Here the mask itself goes into one program compiled for the count rounded up (`length_buckets`),
which finds the positions and indexes: a read is then cut to the count (`cuts.layout.cut`); a write
drops the slots past the count. The count is the one host read (a data-dependent sync; none for a
host mask, which is copied to the chip).

Taken when the padding cannot reach anything but the result: one mask, and every other index
tensor 0-dim or of size 1 in its last dim (so that it broadcasts along the count); for a write,
values that broadcast along the count too. Other calls (two masks; an index or values as long as
the count) keep the exact-length path of `mask_indexing`, whose shapes follow the count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.core.tensor import TpuTensor
from tputrace.backend.indexing.cuts.layout import cut
from tputrace.backend.indexing.data_dependent import sized_step
from tputrace.backend.indexing.length_buckets import padded_length
from tputrace.backend.indexing.mask_counts import MASK_DTYPES, count_set
from tputrace.backend.ops import sized

aten = torch.ops.aten

_INDEX = sized_step(aten.index.Tensor, sized.mask_index)
_INDEX_PUT = sized_step(aten.index_put.default, sized.mask_index_put)
_INPLACE_PUTS = (aten.index_put_.default, aten._index_put_impl_.default)


def result_layout(self_shape: Sequence[int], indices: Sequence[Any], mask_at: int, length: int) -> tuple[tuple[int, ...], int] | None:
    """(shape, dim) of `self[indices]` when the mask at `mask_at` has `length` set elements, and the
    dim that holds them; None when the call is not one this module takes (see the module's note)."""
    mask = indices[mask_at]
    entries: list[tuple[int, ...] | None] = []
    for position, index_tensor in enumerate(indices):
        if position == mask_at:
            entries.extend([(length,)] * mask.dim())
        elif index_tensor is None:
            entries.append(None)
        elif index_tensor.dtype in MASK_DTYPES or (index_tensor.dim() and index_tensor.shape[-1] != 1):
            return None
        else:
            entries.append(tuple(index_tensor.shape))
    if len(entries) > len(self_shape):
        return None
    entries.extend([None] * (len(self_shape) - len(entries)))
    if tuple(self_shape[mask_at:mask_at + mask.dim()]) != tuple(mask.shape):  # each earlier index covers one dim
        return None
    advanced = [dim for dim, entry in enumerate(entries) if entry is not None]
    try:
        broadcast = tuple(torch.broadcast_shapes(*(entry for entry in entries if entry is not None)))
    except RuntimeError:  # indices that do not broadcast: the exact path raises torch's error
        return None
    kept = [self_shape[dim] for dim, entry in enumerate(entries) if entry is None]
    start = advanced[0] if advanced == list(range(advanced[0], advanced[-1] + 1)) else 0
    kept_before = sum(1 for dim in range(start) if entries[dim] is None)
    shape = (*kept[:kept_before], *broadcast, *kept[kept_before:])
    return shape, kept_before + len(broadcast) - 1


def select(dispatcher: DispatcherApi, self: Any, indices: Sequence[Any], mask_at: int) -> Any | None:
    """`self[indices]` with the mask at `mask_at` and other indices beside it, or None (see the note)."""
    mask = indices[mask_at]
    if mask.dim() == 0 or result_layout(tuple(self.shape), indices, mask_at, 1) is None:
        return None
    count = count_set(dispatcher.to_host, mask)
    length = padded_length(count, mask.numel())
    _, dim = result_layout(tuple(self.shape), indices, mask_at, length)
    selected = dispatcher.compute(_INDEX, (self, _on_chip(dispatcher, self, indices)), {"size": length, "mask_at": mask_at})
    return cut(selected, dim, count)


def put(dispatcher: DispatcherApi, op: Any, self: Any, indices: Sequence[Any], values: Any, accumulate: bool, mask_at: int) -> Any | None:
    """`index_put` (or its in-place forms) with the mask at `mask_at` beside other indices, or None
    when the values, or the indices, follow the count (see the note), or the values' dtype is not
    `self`'s (torch refuses it)."""
    mask = indices[mask_at]
    if mask.dim() == 0 or not isinstance(values, TpuTensor) or values.dtype != self.dtype or result_layout(tuple(self.shape), indices, mask_at, 1) is None:
        return None
    count = count_set(dispatcher.to_host, mask)
    shape, dim = result_layout(tuple(self.shape), indices, mask_at, count)
    if not _broadcasts_along(tuple(values.shape), shape, dim):
        return None
    length = padded_length(count, mask.numel())
    options = {"size": length, "mask_at": mask_at, "accumulate": accumulate}
    written = dispatcher.compute(_INDEX_PUT, (self, _on_chip(dispatcher, self, indices), values), options)
    if op in _INPLACE_PUTS:
        return aten.copy_.default(self, written)
    return written


def _broadcasts_along(value_shape: tuple[int, ...], shape: tuple[int, ...], dim: int) -> bool:
    """Whether values of `value_shape` broadcast to `shape` without a dim that faces `dim` and is
    longer than 1 (values that follow the count would need padding)."""
    if len(value_shape) > len(shape):
        return False
    facing = len(value_shape) - (len(shape) - dim)
    if facing >= 0 and value_shape[facing] != 1:
        return False
    return all(size in (1, target) for size, target in zip(reversed(value_shape), reversed(shape)))


def _on_chip(dispatcher: DispatcherApi, self: Any, indices: Sequence[Any]) -> list[Any]:
    """The indices with host tensors copied to `self`'s chip (a 0-dim one too: it indexes, as torch's does)."""
    chip = self._buf.chip
    return [index_tensor if index_tensor is None or isinstance(index_tensor, TpuTensor) else dispatcher.from_host(index_tensor, chip) for index_tensor in indices]
