"""The cut of a data-dependent output: making one, telling one apart, and the padded buffer behind it.

A cut is the first `length` entries along a dim of a buffer compiled for a padded length (see
`length_buckets`): a narrow view whose chain is marked (`host_cut`), so that a host read copies the
buffer and cuts it there, and ops on the chip can run on the buffer instead (see the package's note).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tputrace.backend.core.memory_formats import contiguous_strides
from tputrace.backend.core.tensor import TpuTensor, view_tensor, whole_buffer
from tputrace.backend.core.views import ViewChain, ViewStep, geometry

aten = torch.ops.aten
# (the cut dim in a value, its length, the shape of the value's padded counterpart)
Layout = tuple[int, int, tuple[int, ...]]
# View ops that only reshape: a chain of them on a cut reads the cut's entries in their order.
_RESHAPES = frozenset({aten.view.default, aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims})

_REMEMBERED_SHAPES = 16
# The shapes of the latest cuts, without leading 1s -> (the cut dim in that shape, the padded length),
# the latest last; empty until the process's first cut, and never again after it.
recent_shapes: dict[tuple[int, ...], tuple[int, int]] = {}
# What runs when the process makes its first cut (`routes.install` adds the routes through cuts).
FIRST_CUT_CALLBACKS: list[Callable[[], None]] = []
_OWN_STRIDES_STEPS: dict[int, ViewStep] = {}  # id(a cut's narrow step) -> its copy (steps live as long as the view plans)


def cut(padded: Any, dim: int, length: int) -> Any:
    """The first `length` entries along `dim` of `padded` (an output compiled for a padded length): a
    view whose chain is marked, so that a host read of any tensor seen through it copies the buffer
    and cuts it there (`host_cut`). A cut along a dim after others has torch's contiguous strides, as
    the op's new tensor has on the CPU (not the padded buffer's): its views are made as of such a tensor
    and read through the chain, whatever its strides."""
    view = padded.narrow(dim, 0, length)  # a whole-length cut too, so its consumers share the padded programs
    if padded._view is None:
        if view.is_contiguous():
            view._view.host_cut = (dim, length)
        else:  # a cut along a later dim (`x[:, mask]`): torch's result is a new tensor
            shape = tuple(view.shape)
            view = view_tensor(view._buf, geometry(shape, contiguous_strides(shape), 0, view.dtype, view._buf.chip), _own_strides_root(view._view, dim, length))
        if not recent_shapes:
            for first_cut in FIRST_CUT_CALLBACKS:
                first_cut()
        shape = tuple(view.shape)
        key = without_leading_ones(shape)
        recent_shapes.pop(key, None)
        if len(recent_shapes) >= _REMEMBERED_SHAPES:
            del recent_shapes[next(iter(recent_shapes))]
        recent_shapes[key] = (dim - (len(shape) - len(key)), padded.shape[dim])
    return view


def _own_strides_root(chain: ViewChain, dim: int, length: int) -> ViewChain:
    """The chain of a cut with strides of its own: the root of a copy of its narrow step, one per step.
    The narrow's own chain is the one every narrow of a tensor of the padded buffer's geometry shares,
    and such a narrow keeps the strides of the tensor it views."""
    step = chain.steps[0]
    own_step = _OWN_STRIDES_STEPS.get(id(step))
    if own_step is None:
        own_step = _OWN_STRIDES_STEPS[id(step)] = dataclasses.replace(step)
    root = ViewChain.root(own_step)
    root.host_cut = (dim, length)
    root.own_strides = True
    return root


def own_strides_cut(value: Any) -> ViewChain | None:
    """The chain of the cut that `value` is, or is a view of, when that cut has strides of its own
    (`cut`: along a dim after others, its contiguous strides are not its padded buffer's); else None.
    An `as_strided` of such a value addresses the cut's entries as they would lie in a tensor of their
    own, so it runs on the cut's value, not on the buffer."""
    view = value._view
    if view is None:
        return None
    root = ViewChain.root(view.steps[0])
    return root if root.own_strides else None


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
    """The layout of a cut, or of a view that reshapes, transposes or expands one (its `unsqueeze`, a
    `view` that merges the cut dim with the dims after it or splits it, as `x[mask].reshape(-1, C)` or
    a linear layer on a 3-D cut do; `x[mask].t()`, the operands einsum permutes; `F.normalize`'s
    `norm.expand_as(x)` along other dims): read as a cut of its padded counterpart (`padded_of`); else None."""
    if type(value) is not TpuTensor or value._view is None:
        return None
    found = _padded_views(value)
    return None if found is None else found[0]


def padded_of(value: TpuTensor, layout: Layout) -> TpuTensor:
    """The padded counterpart of a value of that `cut_layout`: its buffer, seen through the value's
    reshapes and transposes (and expanded as it is) with the padded length in place of the length."""
    padded = whole_buffer(value)
    found = _padded_views(value)
    if found is None or found[0] != layout:
        raise ValueError(f"padded_of: a value of shape {tuple(value.shape)} is not a cut of layout {layout}")
    for kind, argument in found[1]:
        if kind == "permute":
            padded = aten.permute.default(padded, list(argument))
        elif kind == "expand":  # a copy: an `expand` in a backward may itself be read as a cut (`backward_views`)
            padded = aten.expand_copy.default(padded, list(argument))
        else:
            padded = padded.reshape(argument)
    return padded


# (a view's chain, its buffer's shape) -> (its layout, the views that give its padded counterpart), or None
_PADDED_VIEWS: dict[tuple[Any, tuple[int, ...]], tuple[Layout, tuple[tuple[str, tuple[int, ...]], ...]] | None] = {}
_PERMUTES = frozenset({aten.permute.default, aten.t.default, aten.transpose.int})
_VIEWS_READ = _RESHAPES | _PERMUTES | {aten.expand.default}


def _padded_views(value: TpuTensor) -> tuple[Layout, tuple[tuple[str, tuple[int, ...]], ...]] | None:
    """`_chain_views` of the value's chain and buffer, kept per chain and buffer shape."""
    key = (value._view, tuple(value._buf.array.shape))
    if key not in _PADDED_VIEWS:
        _PADDED_VIEWS[key] = _chain_views(value._view.steps, key[1])
    return _PADDED_VIEWS[key]


def _chain_views(steps: Sequence[Any], buffer_shape: tuple[int, ...]) -> tuple[Layout, tuple[tuple[str, tuple[int, ...]], ...]] | None:
    """The layout of a value seen through `steps` from its buffer, and the views (("reshape", shape),
    ("permute", dims) or ("expand", shape)) of the padded buffer that give its padded counterpart: the
    cut itself, or the cut followed by reshapes that keep its entries first along one dim
    (`reshaped_layout`), permutations of its dims and expands that keep the cut dim's length; None
    where a step is anything else."""
    cut_of_root = ViewChain.root(steps[0]).host_cut  # the chain of the first step exists: it was made first
    if cut_of_root is None:
        return None
    dim, length = cut_of_root
    padded_shape = buffer_shape
    views: list[tuple[str, tuple[int, ...]]] = []
    for step in steps[1:]:
        op = step.key[0]
        if step.index is not None or op not in _VIEWS_READ:
            return None
        shape = padded_shape[:dim] + (length,) + padded_shape[dim + 1:]
        if op in _PERMUTES:
            order = _permutation(op, step.args, len(shape))
            if order is None:
                return None
            dim, padded_shape = order.index(dim), tuple(padded_shape[axis] for axis in order)
            if views and views[-1][0] == "permute":  # one permutation of the padded buffer for both
                earlier = views.pop()[1]
                order = tuple(earlier[axis] for axis in order)
            if order != tuple(range(len(order))):
                views.append(("permute", order))
            continue
        out_shape = tuple(op(torch.empty(shape, device="meta"), *step.args, **step.kwargs).shape)
        if op is aten.expand.default:  # `norm.expand_as(x)`: broadcast along dims other than the cut's
            leading = len(out_shape) - len(shape)
            if leading < 0 or out_shape[dim + leading] != length:
                return None
            dim += leading
            padded_shape = out_shape[:dim] + (padded_shape[dim - leading],) + out_shape[dim + 1:]
            views.append(("expand", padded_shape))
            continue
        if op is aten.unsqueeze.default:  # keeps the cut's dims, as a pointwise op's other cuts have them
            at = step.args[0] % len(out_shape)
            dim, padded_shape = dim + (at <= dim), padded_shape[:at] + (1,) + padded_shape[at:]
        else:
            reshaped = reshaped_layout(padded_shape, dim, length, out_shape)
            if reshaped is None:
                return None
            dim, length, padded_shape = reshaped
        if views and views[-1][0] == "reshape":
            views.pop()
        views.append(("reshape", padded_shape))
    if views == [("reshape", buffer_shape)]:
        views = []
    return (dim, length, padded_shape), tuple(views)


def _permutation(op: Any, args: Sequence[Any], rank: int) -> tuple[int, ...] | None:
    """The dims a `permute`, `t` or `transpose` of a value of `rank` dims takes, in their new order."""
    if op is aten.permute.default:
        order = tuple(axis % rank for axis in args[0]) if rank else ()
        return order if sorted(order) == list(range(rank)) else None
    order = list(range(rank))
    first, second = (0, 1) if op is aten.t.default else (args[0] % max(rank, 1), args[1] % max(rank, 1))
    if rank < 2:
        return tuple(order)
    order[first], order[second] = order[second], order[first]
    return tuple(order)


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


def cut_from_end(value: TpuTensor, layout: Layout) -> tuple[int, int, int]:
    """(the cut dim counted from the end, as broadcasting aligns dims; the length; the padded length)
    of a value of that `cut_layout`."""
    dim, length, padded_shape = layout
    return dim - value.dim(), length, padded_shape[dim]
