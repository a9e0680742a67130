"""A sum, `amax`, `amin` or mean of a cut on its padded buffer: the padding set to the reduction's
identity (for a mean, zeroed, and the sum divided by the count) where it reduces the cut dim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.cuts.layout import cut, cut_layout, is_cut, padded_of
from tputrace.backend.cuts.steps import padded_step
from tputrace.backend.ops import padded

aten = torch.ops.aten


def _lowest(dtype: torch.dtype) -> float | int | bool:
    if dtype == torch.bool:
        return False
    return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min


def _highest(dtype: torch.dtype) -> float | int | bool:
    if dtype == torch.bool:
        return True
    return float("inf") if dtype.is_floating_point else torch.iinfo(dtype).max


# Reductions run on a padded buffer, by the value that leaves each one unchanged (for the input's dtype).
IDENTITIES = {
    aten.sum.default: lambda dtype: False if dtype == torch.bool else 0,
    aten.sum.dim_IntList: lambda dtype: False if dtype == torch.bool else 0,
    aten.amax.default: _lowest,
    aten.amin.default: _highest,
}
MEANS = {op: padded_step(op, padded.mean_padded, 1) for op in (aten.mean.default, aten.mean.dim)}
_FILL_PAST = padded_step(aten.where.self, padded.fill_past, 1)


def reduction_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """A sum, `amax`, `amin` or mean of a cut: of its padded buffer with the padding set to the
    identity (a mean: zeroed, the sum divided by the count), where it reduces the cut dim; else of the
    buffer as it is, the result cut in turn. None for an empty cut or a complex one."""
    self = args[0]
    layout = cut_layout(self)
    if layout is None or any(is_cut(value) for value in (*args[1:], *kwargs.values())) or self.is_complex():
        return None
    dim, length, _ = layout
    if not length:  # nothing to reduce: `amax` raises torch's error, a sum is zeros
        return None
    reduced = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    dims = range(self.dim()) if not reduced else [axis % self.dim() for axis in reduced]
    buffer = padded_of(self, layout)
    if dim in dims and entry.op in MEANS:
        if not (self.dtype.is_floating_point if kwargs.get("dtype") is None else kwargs["dtype"].is_floating_point):
            return None  # torch refuses the mean of integers without a floating dtype
        options = {"cut_dim": dim, "dims": tuple(dims), "keepdim": keepdim, "dtype": kwargs.get("dtype")}
        return dispatcher.compute(MEANS[entry.op], (buffer, length), options, record_as or entry.name)
    if dim in dims:
        buffer = dispatcher.compute(_FILL_PAST, (buffer, length), {"dim": dim, "fill": IDENTITIES[entry.op](self.dtype)})
    result = dispatcher.compute(entry, (buffer, *args[1:]), kwargs, record_as)
    if dim in dims:
        return result
    return cut(result, dim if keepdim else dim - sum(1 for axis in dims if axis < dim), length)
