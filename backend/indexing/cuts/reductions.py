"""A sum, `amax`, `amin`, mean, vector norm or `logsumexp` of a cut on its padded buffer: the padding
set to the reduction's identity (for a mean, zeroed, and the sum divided by the count; for a norm, zero;
for `logsumexp`, -inf) where it reduces the cut dim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.core.entries import bound
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.indexing.cuts.layout import cut, cut_layout, is_cut, padded_of
from tputrace.backend.indexing.cuts.steps import padded_step
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


def reduction_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """A sum, `amax`, `amin` or mean of a cut: of its padded buffer with the padding set to the
    identity (a mean: zeroed, the sum divided by the count), where it reduces the cut dim; else of the
    buffer as it is, the result cut in turn. None for an empty cut or a complex one."""
    self = args[0]
    layout = _reducible_layout(args, kwargs)
    if layout is None:
        return None
    reduced = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    dims = _reduced_dims(self, reduced)
    dim, length, _ = layout
    if dim in dims and entry.op in MEANS:
        if not (self.dtype.is_floating_point if kwargs.get("dtype") is None else kwargs["dtype"].is_floating_point):
            return None  # torch refuses the mean of integers without a floating dtype
        options = {"cut_dim": dim, "dims": tuple(dims), "keepdim": keepdim, "dtype": kwargs.get("dtype")}
        return dispatcher.compute(MEANS[entry.op], (padded_of(self, layout), length), options, record_as or entry.name)
    fill = IDENTITIES[entry.op](self.dtype) if dim in dims else None  # a mean along other dims fills nothing
    return _padding_filled(dispatcher, entry, args, kwargs, record_as, layout, dims, keepdim, fill)


def vector_norm_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`linalg_vector_norm` of a cut (`x[mask].norm()`, `F.normalize(x[mask], dim=-1)`), its padding
    set to zero where it reduces the cut dim (+inf for a negative order, whose terms |x|^ord vanish there)."""
    layout = _reducible_layout(args, kwargs)
    if layout is None:
        return None
    self, order, reduced, keepdim, _ = bound(entry.op, args, kwargs)
    fill = float("inf") if order < 0 else 0
    return _padding_filled(dispatcher, entry, args, kwargs, record_as, layout, _reduced_dims(self, reduced), keepdim, fill)


def logsumexp_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`logsumexp` of a floating cut along given dims, its padding set to -inf where it reduces the cut dim."""
    layout = _reducible_layout(args, kwargs)
    self, reduced, keepdim = bound(entry.op, args, kwargs)
    if layout is None or not reduced or not self.dtype.is_floating_point:
        return None
    return _padding_filled(dispatcher, entry, args, kwargs, record_as, layout, _reduced_dims(self, reduced), keepdim, float("-inf"))


def _reducible_layout(args: Sequence[Any], kwargs: dict) -> Any | None:
    """The layout of a reduction's input that its padded buffer can stand for: a non-empty real cut,
    the op's other arguments no cuts; else None (an empty one: `amax` raises torch's error, a sum is zeros)."""
    self = args[0]
    layout = cut_layout(self)
    if layout is None or any(is_cut(value) for value in (*args[1:], *kwargs.values())) or self.is_complex() or not layout[1]:
        return None
    return layout


def _reduced_dims(self: Any, reduced: Sequence[int] | None) -> range | list[int]:
    """The dims a reduction over `reduced` takes: all of them when it names none."""
    return range(self.dim()) if not reduced else [axis % self.dim() for axis in reduced]


def _padding_filled(
    dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None, layout: Any, dims: Sequence[int], keepdim: bool,
    fill: float | int | bool | None,
) -> Any:
    """`entry` of the padded buffer of `args[0]`, its padding set to `fill` where the op reduces the
    cut dim; else (`fill` unread) of the buffer as it is, the result cut in turn."""
    dim, length, _ = layout
    buffer = padded_of(args[0], layout)
    if dim in dims:
        buffer = dispatcher.compute(_FILL_PAST, (buffer, length), {"dim": dim, "fill": fill})
    result = dispatcher.compute(entry, (buffer, *args[1:]), kwargs, record_as)
    if dim in dims:
        return result
    return cut(result, dim if keepdim else dim - sum(1 for axis in dims if axis < dim), length)
