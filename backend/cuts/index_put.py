"""`index_put` through a mask of values cut to its count (the backward of `x[mask]`, of a reshaped
`x[mask]` too) on the padded values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tputrace.backend.cuts.layout import cut_layout, is_cut, padded_of
from tputrace.backend.mask_counts import MASK_DTYPES
from tputrace.backend.op_routes import bound


def index_put_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`index_put` through one mask of values cut to the mask's count (the backward of `x[mask]`
    scatters its gradient so): the k-th set element takes the k-th row of the padded values, and
    rows past the count are never read. A cut of one row is left to the exact path (a single row
    broadcasts to every set element)."""
    self, indices, values, *rest = bound(entry.op, args, kwargs)
    if is_cut(self) or len(indices) != 1 or indices[0] is None or indices[0].dtype not in MASK_DTYPES:
        return None
    layout = cut_layout(values)
    if layout is None or layout[0] or layout[1] <= 1 or values.dim() != self.dim() - indices[0].dim() + 1:
        return None
    return dispatcher.compute(entry, (self, indices, padded_of(values, layout), *rest), {}, record_as)
