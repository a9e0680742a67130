"""The cut of a data-dependent output: making one, telling one apart, and the padded buffer behind it.

A cut is the first `length` entries along a dim of a buffer compiled for a padded length (see
`length_buckets`): a narrow view whose chain is marked (`host_cut`), so that a host read copies the
buffer and cuts it there, and ops on the chip can run on the buffer instead (see the package's note).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.tensor import TpuTensor, whole_buffer
from tputrace.backend.views import ViewChain

aten = torch.ops.aten
# (the cut dim in a value, its length, the shape of the value's padded counterpart)
Layout = tuple[int, int, tuple[int, ...]]
# View ops that only reshape: a chain of them on a cut reads the cut's entries in their order.
_RESHAPES = frozenset({aten.view.default, aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims})

_REMEMBERED_LENGTHS = 16
# The lengths of the latest cuts -> the padded length each was cut from (the latest last); empty
# until the process's first cut, and never again after it.
recent_lengths: dict[int, int] = {}
# The shapes of the latest cuts, without leading 1s -> (the cut dim in that shape, the padded length).
recent_shapes: dict[tuple[int, ...], tuple[int, int]] = {}


def cut(padded: Any, dim: int, length: int) -> Any:
    """The first `length` entries along `dim` of `padded` (an output compiled for a padded length): a
    view whose chain is marked, so that a host read of any tensor seen through it copies the buffer
    and cuts it there (`host_cut`)."""
    view = padded.narrow(dim, 0, length)  # a whole-length cut too, so its consumers share the padded programs
    if padded._view is None:
        view._view.host_cut = (dim, length)
        if not recent_lengths:
            from tputrace.backend.cuts.routes import route_through_cuts  # the routes cut: they import this module

            route_through_cuts()
        recent_lengths.pop(length, None)
        if len(recent_lengths) >= _REMEMBERED_LENGTHS:
            del recent_lengths[next(iter(recent_lengths))]
        recent_lengths[length] = padded.shape[dim]
        shape = tuple(view.shape)
        key = without_leading_ones(shape)
        recent_shapes.pop(key, None)
        if len(recent_shapes) >= _REMEMBERED_LENGTHS:
            del recent_shapes[next(iter(recent_shapes))]
        recent_shapes[key] = (dim - (len(shape) - len(key)), padded.shape[dim])
    return view


def without_leading_ones(shape: Sequence[int]) -> tuple[int, ...]:
    """`shape` without its leading size-1 dims (a reduction's gradient may be expanded with them)."""
    start = 0
    while start < len(shape) and shape[start] == 1:
        start += 1
    return tuple(shape[start:])


def host_cut(tensor: Any) -> tuple[int, int] | None:
    """(dim, length) when `tensor` is the first `length` entries along `dim` of its buffer's array and
    is read by cutting that array on the host, else None. (A chain belongs to one base geometry, so
    any view of the same steps is such a cut too.)"""
    view = tensor._view
    return None if view is None else view.host_cut


def is_cut(value: Any) -> bool:
    """Whether `value` is a tpu tensor read as a cut of its padded buffer (`cut`)."""
    return type(value) is TpuTensor and value._view is not None and value._view.host_cut is not None


def is_cut_or_view_of_one(value: Any) -> bool:
    """Whether `value` is a cut or a view of one (which `cut_layout` may read as a cut of its own)."""
    if type(value) is not TpuTensor:
        return False
    view = value._view
    return view is not None and (view.host_cut is not None or (len(view.steps) > 1 and ViewChain.root(view.steps[0]).host_cut is not None))


def shared_cut(values: Sequence[Any]) -> Layout | None:
    """The layout (`cut_layout`) every value has, when they are cuts (or reshapes of cuts) of one
    layout and one shape; else None."""
    layouts = [cut_layout(value) for value in values]
    first = (layouts[0], tuple(values[0].shape))
    if first[0] is None or any((layout, tuple(value.shape)) != first for layout, value in zip(layouts[1:], values[1:])):
        return None
    return first[0]


def cut_layout(value: Any) -> Layout | None:
    """The layout of a cut, or of a view that only reshapes one (its `unsqueeze`, a `view` that merges
    the cut dim with the dims after it or splits it, as `x[mask].reshape(-1, C)` or a linear layer on
    a 3-D cut do): read as a cut of its padded counterpart (`padded_of`); else None."""
    if type(value) is not TpuTensor or value._view is None:
        return None
    return _chain_layout(value._view.steps, tuple(value._buf.array.shape), tuple(value.shape))


def transposed_layout(value: Any) -> Layout | None:
    """The layout of the cut (or reshaped cut) a 2-D value is the transpose of (`.t()` of `x[mask]`,
    the weight gradient's operand); else None."""
    if type(value) is not TpuTensor or value._view is None or value.dim() != 2:
        return None
    steps = value._view.steps
    last = steps[-1]
    if len(steps) < 2 or not (last.key[0] is aten.t.default or (last.key[0] is aten.permute.default and list(last.args[0]) in ([1, 0], [-1, -2]))):
        return None
    return _chain_layout(steps[:-1], tuple(value._buf.array.shape), tuple(reversed(value.shape)))


def _chain_layout(steps: Sequence[Any], buffer_shape: tuple[int, ...], shape: tuple[int, ...]) -> Layout | None:
    """The layout of a value of `shape` seen through `steps` from its buffer: the cut itself, or the
    cut's reshapes (an `unsqueeze` alone keeps the cut's dims, as a pointwise op's other cuts have them)."""
    cut_of_root = ViewChain.root(steps[0]).host_cut  # the chain of the first step exists: it was made first
    if cut_of_root is None or any(step.key[0] not in _RESHAPES for step in steps[1:]):
        return None
    dim, length = cut_of_root
    if len(steps) == 1:
        return dim, length, buffer_shape
    if len(steps) == 2 and steps[1].key[0] is aten.unsqueeze.default:
        at = steps[1].args[0] % len(shape)
        return dim + (at <= dim), length, buffer_shape[:at] + (1,) + buffer_shape[at:]
    return reshaped_layout(buffer_shape, dim, length, shape)


def reshaped_layout(buffer_shape: tuple[int, ...], dim: int, length: int, shape: tuple[int, ...]) -> Layout | None:
    """The layout of the cut (`length` entries along `dim` of a buffer of `buffer_shape`) reshaped to
    `shape`: the dim whose dims before it hold as many entries as those before the cut dim. The cut's
    entries, in order, are the first of each such group in the buffer too, so they are the first
    `shape[at]` along it of the buffer reshaped alike (a padded length of the buffer's times the
    entries after the cut dim, over those after `at`: `padded * T` for a cut of (count, T, H) viewed
    as (count * T, H)). None where no dim does (the cut dim merged with a dim before it) or the
    padded length does not divide."""
    outer, inner, padded = math.prod(buffer_shape[:dim]), math.prod(buffer_shape[dim + 1:]), buffer_shape[dim]
    if not length or not all(shape):
        return None
    fits = [at for at in range(len(shape)) if math.prod(shape[:at]) == outer and (padded * inner) % math.prod(shape[at + 1:]) == 0]
    if not fits:
        return None
    kept = [at for at in fits if math.prod(shape[at + 1:]) == inner]  # the cut dim as it was, where one is
    at = (kept or fits)[-1]
    return at, shape[at], shape[:at] + (padded * inner // math.prod(shape[at + 1:]),) + shape[at + 1:]


def padded_of(value: TpuTensor, layout: Layout) -> TpuTensor:
    """The padded counterpart of a value of that `cut_layout`: its buffer, seen with the layout's shape."""
    buffer = whole_buffer(value)
    if layout[2] == tuple(buffer.shape):
        return buffer
    return aten.view.default(buffer, list(layout[2]))


def cut_from_end(value: TpuTensor, layout: Layout) -> tuple[int, int, int]:
    """(the cut dim counted from the end, as broadcasting aligns dims; the length; the padded length)
    of a value of that `cut_layout`."""
    dim, length, padded_shape = layout
    return dim - value.dim(), length, padded_shape[dim]
