"""`index_put` through a mask of values cut to its count (the backward of `x[mask]`, of a reshaped
`x[mask]` too, and of `x[:, mask]`) on the padded values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.core.entries import bound
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.indexing.cuts.layout import cut_layout, is_cut, padded_of
from tputrace.backend.indexing.data_dependent import sized_step
from tputrace.backend.indexing.mask_counts import MASK_DTYPES
from tputrace.backend.ops import sized

aten = torch.ops.aten

_MASK_PUT_AFTER_DIMS = sized_step(aten.index_put.default, sized.mask_index_put)


def index_put_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`index_put` through one mask of values cut to the mask's count (the backward of `x[mask]`
    scatters its gradient so): the k-th set element takes the k-th row of the padded values, and
    rows past the count are never read. A mask after whole dims (`x[:, mask]`'s gradient, indices
    `[None, mask]`) scatters the padded values along its dim, the slots past the count dropped
    (`ops.sized.mask_index_put`). A cut of one row is left to the exact path (a single row
    broadcasts to every set element)."""
    self, indices, values, *rest = bound(entry.op, args, kwargs)
    at = [position for position, index_tensor in enumerate(indices) if index_tensor is not None]
    if is_cut(self) or len(at) != 1 or indices[at[0]].dtype not in MASK_DTYPES:
        return None
    mask_at, mask = at[0], indices[at[0]]
    layout = cut_layout(values)
    if layout is None or layout[0] != mask_at or layout[1] <= 1 or values.dim() != self.dim() - mask.dim() + 1:
        return None
    if not mask_at:
        return dispatcher.compute(entry, (self, indices, padded_of(values, layout), *rest), {}, record_as)
    padded_length = layout[2][mask_at]
    selected_shape = (*self.shape[:mask_at], layout[1], *self.shape[mask_at + mask.dim():])
    if entry.op is not aten.index_put.default or tuple(values.shape) != selected_shape or values.dtype != self.dtype or padded_length > mask.numel():
        return None
    options = {"size": padded_length, "mask_at": mask_at, "accumulate": bool(rest and rest[0])}
    return dispatcher.compute(_MASK_PUT_AFTER_DIMS, (self, list(indices), padded_of(values, layout)), options, record_as or entry.name)
