"""View chains: how a view's value is computed from its buffer, and how a write reaches the buffer.

A view is a chain of ATen view lowerings applied to the buffer's array. Writing a new value into a
view scatters it into the buffer: the same chain applied to the buffer's flat element indices says
which buffer element each view element is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tputrace.backend.core.dtypes import to_torch
from tputrace.backend.core.memory_formats import FORMAT_NAMES, channels_last_format, contiguous_strides
from tputrace.backend.ops.views import permute, view, view_dtype


_aten = torch.ops.aten
# Views that only reorder or relabel dims: a dense chain of them of the buffer's shape is the array itself. (Not the
# value-changing views, `_conj` and `_neg_view`, nor `narrow` or `slice`, which mark a data-dependent cut's chain.)
LAYOUT_VIEWS = frozenset({_aten.t.default, _aten.transpose.int, _aten.permute.default, _aten.detach.default, _aten.alias.default, _aten.view.default,
                          _aten._unsafe_view.default})


@dataclass(frozen=True)
class ViewStep:
    """One view op: its lowering with constant arguments; `index` picks one output of a multi-view op.

    An `absolute` step (as_strided) addresses the buffer itself, so it replaces the chain before it.
    """

    lowering: Callable
    args: tuple
    kwargs: dict = field(hash=False, compare=False)
    index: int | None = None
    key: Any = None
    absolute: bool = False

    def apply(self, array: Any) -> Any:
        result = self.lowering(array, *self.args, **self.kwargs)
        return result if self.index is None else result[self.index]


class ViewChain:
    """The steps from a buffer's array to a view's value.

    Chains are built through `root` and `then`, which return one shared chain per sequence of steps
    (the steps of cached view layouts live as long as the dispatcher), so making a view of a view
    builds no new chain once that sequence has been seen."""

    __slots__ = ("steps", "key", "_next", "plans", "host_cut", "own_strides", "layout_only")

    def __init__(self, steps: tuple[ViewStep, ...]) -> None:
        self.steps = steps
        self.key = tuple(step.key for step in steps)
        # Whether every step only reorders or relabels dims (`LAYOUT_VIEWS`): a dense view of the
        # buffer's shape and dtype seen through such a chain is the buffer's array as it is.
        self.layout_only = all(step.key[0] in LAYOUT_VIEWS for step in steps)
        self._next: dict[int, ViewChain] = {}
        self.plans: dict[tuple, Any] = {}  # the dispatcher's read/write plans of this chain, by buffer signature
        # (dim, length) for a data-dependent output's cut, read on the host without a program (`padded_reads`)
        self.host_cut: tuple[int, int] | None = None
        # Whether such a cut has contiguous strides of its own, not its padded buffer's (`cuts.layout.cut`)
        self.own_strides = False

    @staticmethod
    def root(step: ViewStep) -> "ViewChain":
        """The chain of one step applied to the buffer itself."""
        chain = _ROOTS.get(id(step))
        if chain is None:
            chain = _ROOTS[id(step)] = ViewChain((step,))
        return chain

    def then(self, step: ViewStep) -> "ViewChain":
        """This chain followed by `step` (an absolute step replaces it)."""
        chain = self._next.get(id(step))
        if chain is None:
            chain = ViewChain.root(step) if step.absolute else ViewChain(self.steps + (step,))
            self._next[id(step)] = chain
        return chain

    def function(self) -> Callable[[Any], tuple]:
        steps = self.steps

        def view_of(array: Any) -> tuple:
            for step in steps:
                array = step.apply(array)
            return (array,)

        return view_of

    def scatter_function(self, buffer_shape: tuple[int, ...], buffer_dtype: Any) -> Callable[[Any, Any], tuple]:
        """`write(buffer, value) -> (new buffer,)`: the buffer with the view's elements replaced by `value`.

        A step that reinterprets the dtype (`view_as_real`, `view_as_complex`, `view(dtype)`; `.real`
        and `.imag` are `view_as_real` then a select) is a bijection between its input and output: the
        steps after it are written into its current output, which it maps back to its input, and that
        is written through the steps before it."""
        avals = _avals(self.steps, buffer_shape, buffer_dtype)
        split = _last_dtype_step(avals)
        if split is not None:
            return _write_across_dtype_step(self.steps, split, avals)
        if any(step.key[0] in _VALUE_VIEWS for step in self.steps):
            return _write_through_value_views(self.steps, buffer_shape, buffer_dtype)
        view_of = self.function()
        size = 1
        for dim in buffer_shape:
            size *= dim
        dense = _dense_axis_order(self.steps, buffer_shape, size)
        if dense is not None:
            view_shape, order = dense

            def write_permuted(buffer: Any, value: Any) -> tuple:
                value = jnp.broadcast_to(value.astype(buffer.dtype), view_shape)
                return (value.transpose(order).reshape(buffer_shape),)

            return write_permuted

        def write_through(buffer: Any, value: Any) -> tuple:
            positions = view_of(jnp.arange(size, dtype=jnp.int64).reshape(buffer_shape))[0]
            value = jnp.broadcast_to(value.astype(buffer.dtype), positions.shape)
            flat = buffer.reshape(-1).at[positions.reshape(-1)].set(value.reshape(-1))
            return (flat.reshape(buffer_shape),)

        return write_through


_ROOTS: dict[int, ViewChain] = {}  # by id of a step that a cached view layout keeps alive


def _avals(steps: tuple[ViewStep, ...], shape: tuple[int, ...], dtype: Any) -> list[Any]:
    """The abstract value before the first step and after each step."""
    avals = [jax.ShapeDtypeStruct(shape, dtype)]
    for step in steps:
        avals.append(jax.eval_shape(step.apply, avals[-1]))
    return avals


def _last_dtype_step(avals: list[Any]) -> int | None:
    """The index of the last step whose output dtype differs from its input's (`_avals`), or None."""
    changed = [index for index in range(len(avals) - 1) if avals[index + 1].dtype != avals[index].dtype]
    return changed[-1] if changed else None


def _reinterpret_back(value: Any, source: Any) -> Any:
    """The inverse of a dtype-reinterpreting view step whose input had the abstract value `source`:
    `view_as_real` and `view_as_complex` add or remove a last dim of 2; `view(dtype)` is undone by
    `view(dtype)` back (the lowering handles widths and complex parts)."""
    value_complex = jnp.issubdtype(value.dtype, jnp.complexfloating)
    if not value_complex and value.ndim == len(source.shape) + 1:  # view_as_real: (..., n, 2)
        return lax.complex(value[..., 0], value[..., 1]).astype(source.dtype)
    if value_complex and len(source.shape) == value.ndim + 1:  # view_as_complex of (..., n, 2)
        return jnp.stack([jnp.real(value), jnp.imag(value)], axis=-1).astype(source.dtype)
    return view_dtype(value, to_torch(source.dtype)).reshape(source.shape)


# Views that change values, not positions: each its own inverse, elementwise, so commuting with every
# other view step (`z.conj()`, and `_neg_view`, which torch makes for `z.conj().imag`).
_VALUE_VIEWS = frozenset({torch.ops.aten._conj.default, torch.ops.aten._neg_view.default})


def _write_through_value_views(steps: tuple[ViewStep, ...], buffer_shape: tuple[int, ...], buffer_dtype: Any) -> Callable[[Any, Any], tuple]:
    """A write through a chain with value-changing steps: the value, undone by those steps (each
    undoes itself), written through the chain's other steps, which say where it goes."""
    value_steps = tuple(step for step in steps if step.key[0] in _VALUE_VIEWS)
    position_steps = tuple(step for step in steps if step.key[0] not in _VALUE_VIEWS)
    write_positions = ViewChain(position_steps).scatter_function(buffer_shape, buffer_dtype) if position_steps else None

    def write(buffer: Any, value: Any) -> tuple:
        value = jnp.asarray(value)
        for step in value_steps:
            value = step.apply(value)
        if write_positions is None:
            return (jnp.broadcast_to(value.astype(buffer.dtype), buffer.shape),)
        return write_positions(buffer, value)

    return write


def _write_across_dtype_step(steps: tuple[ViewStep, ...], split: int, avals: list[Any]) -> Callable[[Any, Any], tuple]:
    head, step, tail = steps[:split], steps[split], steps[split + 1:]
    buffer, source, middle = avals[0], avals[split], avals[split + 1]
    head_of = ViewChain(head).function() if head else None
    write_tail = ViewChain(tail).scatter_function(tuple(middle.shape), middle.dtype) if tail else None
    write_head = ViewChain(head).scatter_function(tuple(buffer.shape), buffer.dtype) if head else None

    def write(buffer: Any, value: Any) -> tuple:
        if write_tail is None:
            new_middle = jnp.broadcast_to(value.astype(middle.dtype), middle.shape)
        else:
            current = step.apply(head_of(buffer)[0] if head_of else buffer)
            new_middle = write_tail(current, value)[0]
        new_source = _reinterpret_back(new_middle, source)
        if write_head is None:
            return (new_source,)
        return write_head(buffer, new_source)

    return write


class Geometry:
    """A tensor's sizes, strides, storage offset, dtype and chip, interned: one object per distinct
    geometry, so a view's cache key hashes it by identity instead of reading the tensor's metadata.

    `memory_format` is channels_last(_3d) for strides torch would call so (None otherwise): an op on
    such a tensor computes its output strides from them (`spec`, the input's part of a plan key,
    names the format, so the same op on a contiguous input has a plan of its own)."""

    __slots__ = ("shape", "strides", "offset", "dtype", "chip", "dense", "memory_format", "spec")

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int, dtype: Any, chip: int) -> None:
        self.shape = shape
        self.strides = strides
        self.offset = offset
        self.dtype = dtype
        self.chip = chip
        self.dense = offset == 0 and strides == contiguous_strides(shape)  # torch's default strides
        self.memory_format = None if self.dense else channels_last_format(shape, strides)
        self.spec = (shape, dtype) if self.memory_format is None else (shape, dtype, FORMAT_NAMES[self.memory_format])


_GEOMETRIES: dict[tuple, Geometry] = {}


def geometry(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, dtype: Any, chip: int) -> Geometry:
    """The interned geometry with these values."""
    key = (shape, strides, offset, dtype, chip)
    found = _GEOMETRIES.get(key)
    if found is None:
        found = _GEOMETRIES[key] = Geometry(shape, strides, offset, dtype, chip)
    return found


_DENSE_CHECK_LIMIT = 1 << 24  # elements; a larger buffer's view is written by a scatter, unchecked


def _dense_axis_order(steps: tuple[ViewStep, ...], buffer_shape: tuple[int, ...], size: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The view's shape and the axis order that lays its elements out as its buffer, when the view
    holds every buffer element exactly once with its axes permuted; else None.

    The view's buffer positions come from its ATen ops applied on the host to the positions 0..size-1
    (the steps' lowerings do what those ops do): no XLA program compiles that the trace would miss."""
    if size == 0 or size > _DENSE_CHECK_LIMIT:
        return None
    positions_tensor = torch.arange(size).reshape(buffer_shape)
    try:
        for step in steps:
            viewed = step.key[0](positions_tensor, *step.args, **step.kwargs)
            positions_tensor = viewed if step.index is None else viewed[step.index]
    except (RuntimeError, TypeError, ValueError, IndexError):
        return None  # written by the general scatter (`write_through`)
    positions = positions_tensor.numpy()
    if positions.size != size or positions.reshape(-1)[0] != 0:
        return None
    strides = [int(np.take(positions, 1, axis=dim).reshape(-1)[0]) if positions.shape[dim] > 1 else 0 for dim in range(positions.ndim)]
    order = tuple(sorted(range(positions.ndim), key=lambda dim: -strides[dim]))
    if not np.array_equal(positions.transpose(order).reshape(-1), np.arange(size)):
        return None
    return positions.shape, order


_STORAGE_CHAINS: dict[Any, ViewChain] = {}
_FLAT_STEP = ViewStep(view, ((-1,),), {}, None, (torch.ops.aten.view.default, ((-1,),), (), None))


def storage_as(dtype: torch.dtype) -> ViewChain:
    """The (shared) chain that reads a buffer's whole storage as a flat array of `dtype`, its bytes
    reinterpreted (`view(-1)` then `view(dtype)`): what an `as_strided` of a tensor viewed as another
    dtype (`x.view(torch.int16)`) addresses, in units of that dtype's elements."""
    chain = _STORAGE_CHAINS.get(dtype)
    if chain is None:
        step = ViewStep(view_dtype, (dtype,), {}, None, (torch.ops.aten.view.dtype, (dtype,), (), None))
        chain = _STORAGE_CHAINS[dtype] = ViewChain.root(_FLAT_STEP).then(step)
    return chain


_PERMUTE_STEPS: dict[tuple[int, ...], ViewStep] = {}


def permute_step(dims: tuple[int, ...]) -> ViewStep:
    """The (shared) view step `permute(dims)`: how a channels-last tensor is seen from its buffer."""
    step = _PERMUTE_STEPS.get(dims)
    if step is None:
        step = _PERMUTE_STEPS[dims] = ViewStep(permute, (dims,), {}, None, (torch.ops.aten.permute.default, (dims,), (), None))
    return step
