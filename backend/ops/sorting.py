"""Sorting and order statistics: sort, topk, kthvalue, median, searchsorted/bucketize.

torch orders every NaN above +inf and treats -0.0 and 0.0 as equal; XLA's sort uses IEEE total
order (a NaN with its sign bit set sorts first, -0.0 before 0.0), so keys are canonicalised first.
Descending sorts reverse, sort ascending stably and reverse back, which keeps equal elements in their
original order as torch's stable sort does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ._util import canon_dim, is_float
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _sort_key(x: Array) -> Array:
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    if is_float(x):
        x = jnp.where(x == 0, jnp.zeros_like(x), x)
        return jnp.where(jnp.isnan(x), jnp.full_like(x, jnp.nan), x)
    return x


def sort_along(x: Array, axis: int, descending: bool) -> tuple[Array, Array]:
    """Values and int64 indices of a stable sort of x along axis."""
    positions = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    if x.shape[axis] <= 1:
        return x, positions
    source, order = (jnp.flip(x, axis), jnp.flip(positions, axis)) if descending else (x, positions)
    _, indices = lax.sort((_sort_key(source), order), dimension=axis, is_stable=True, num_keys=1)
    if descending:
        indices = jnp.flip(indices, axis)
    return jnp.take_along_axis(x, indices, axis=axis), indices


def _sort(self: Array, dim: int, descending: bool) -> tuple[Array, Array]:
    if self.ndim == 0:
        canon_dim(dim, 0)
        return self, jnp.zeros((), jnp.int64)
    return sort_along(self, canon_dim(dim, self.ndim), descending)


@lowers(aten.sort.default)
def sort(self: Array, dim: int = -1, descending: bool = False) -> tuple[Array, Array]:
    return _sort(self, dim, descending)


@lowers(aten.sort.stable)
def sort_stable(self: Array, *, stable: bool | None = None, dim: int = -1, descending: bool = False) -> tuple[Array, Array]:
    return _sort(self, dim, descending)


@lowers(aten.topk.default)
def topk(self: Array, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Array, Array]:  # noqa: A002
    values, indices = _sort(self, dim, descending=largest)
    if self.ndim == 0:
        return values, indices
    axis = canon_dim(dim, self.ndim)
    return lax.slice_in_dim(values, 0, k, axis=axis), lax.slice_in_dim(indices, 0, k, axis=axis)


def _pick(values: Array, indices: Array, position: Array | int, axis: int, keepdim: bool) -> tuple[Array, Array]:
    """The element at `position` (per row, or one for all) of sorted values and indices along axis."""
    position = jnp.broadcast_to(jnp.asarray(position), values.shape[:axis] + (1,) + values.shape[axis + 1:])
    value = jnp.take_along_axis(values, position, axis=axis)
    index = jnp.take_along_axis(indices, position, axis=axis)
    if not keepdim:
        value, index = jnp.squeeze(value, axis), jnp.squeeze(index, axis)
    return value, index


@lowers(aten.kthvalue.default)
def kthvalue(self: Array, k: int, dim: int = -1, keepdim: bool = False) -> tuple[Array, Array]:
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    axis = canon_dim(dim, self.ndim)
    values, indices = sort_along(self, axis, descending=False)
    return _pick(values, indices, k - 1, axis, keepdim)


def _median_position(values: Array, axis: int, ignore_nan: bool) -> Array:
    """Where the lower median sits in an ascending sort; NaNs (sorted last) decide it when present."""
    length = values.shape[axis]
    if not is_float(values):
        return jnp.asarray((length - 1) // 2)
    nan_count = jnp.sum(jnp.isnan(values), axis=axis, keepdims=True)
    valid = length - nan_count
    if ignore_nan:
        return jnp.maximum((valid - 1) // 2, 0)
    return jnp.where(nan_count > 0, valid, (length - 1) // 2)


def _median_dim(self: Array, dim: int, keepdim: bool, ignore_nan: bool) -> tuple[Array, Array]:
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    axis = canon_dim(dim, self.ndim)
    values, indices = sort_along(self, axis, descending=False)
    return _pick(values, indices, _median_position(values, axis, ignore_nan), axis, keepdim)


@lowers(aten.median.dim)
def median_dim(self: Array, dim: int, keepdim: bool = False) -> tuple[Array, Array]:
    return _median_dim(self, dim, keepdim, ignore_nan=False)


@lowers(aten.nanmedian.dim)
def nanmedian_dim(self: Array, dim: int, keepdim: bool = False) -> tuple[Array, Array]:
    return _median_dim(self, dim, keepdim, ignore_nan=True)


def _median_all(self: Array, ignore_nan: bool) -> Array:
    """The median of every element; of no elements, NaN as torch gives (the lowest value for integers)."""
    if self.size == 0:
        if is_float(self):
            return jnp.asarray(jnp.nan, self.dtype)
        return jnp.asarray(False if self.dtype == jnp.bool_ else jnp.iinfo(self.dtype).min, self.dtype)
    return _median_dim(self.reshape(-1), 0, False, ignore_nan=ignore_nan)[0]


@lowers(aten.median.default)
def median(self: Array) -> Array:
    return _median_all(self, ignore_nan=False)


@lowers(aten.nanmedian.default)
def nanmedian(self: Array) -> Array:
    return _median_all(self, ignore_nan=True)


def _searchsorted(boundaries: Array, values: Array, right: bool, side: str | None, sorter: Array | None) -> Array:
    side = side or ("right" if right else "left")
    if sorter is not None:
        boundaries = jnp.take_along_axis(boundaries, sorter, axis=-1)
    if boundaries.ndim <= 1:
        return jnp.searchsorted(boundaries, values, side=side).astype(jnp.int64)
    search = jax.vmap(lambda b, v: jnp.searchsorted(b, v, side=side))
    batch = boundaries.shape[:-1]
    flat = search(boundaries.reshape(-1, boundaries.shape[-1]), values.reshape(-1, values.shape[-1]))
    return flat.reshape(batch + values.shape[-1:]).astype(jnp.int64)


@lowers(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(sorted_sequence: Array, self: Array, *, out_int32: bool = False, right: bool = False, side: str | None = None, sorter: Array | None = None) -> Array:
    return _searchsorted(sorted_sequence, jnp.asarray(self), right, side, sorter)


@lowers(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(self: Array, boundaries: Array, *, out_int32: bool = False, right: bool = False) -> Array:
    return _searchsorted(boundaries, jnp.asarray(self), right, None, None)



@lowers(aten.mode.default)
def mode(self: Array, dim: int = -1, keepdim: bool = False) -> tuple[Array, Array]:
    """Most frequent value (the smallest among ties) and the last index holding it, from one sort:
    equal values form runs in the sorted order, and run lengths come from running max/min positions."""
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    axis = canon_dim(dim, self.ndim)
    values, indices = sort_along(self, axis, descending=False)
    length = values.shape[axis]
    if length == 0:
        return jnp.squeeze(values, axis) if not keepdim else values, jnp.squeeze(indices, axis) if not keepdim else indices
    moved_values, moved_indices = jnp.moveaxis(values, axis, -1), jnp.moveaxis(indices, axis, -1)
    position = lax.broadcasted_iota(jnp.int64, moved_values.shape, moved_values.ndim - 1)
    same_as_previous = jnp.concatenate([jnp.zeros(moved_values.shape[:-1] + (1,), bool), moved_values[..., 1:] == moved_values[..., :-1]], -1)
    same_as_next = jnp.concatenate([moved_values[..., :-1] == moved_values[..., 1:], jnp.zeros(moved_values.shape[:-1] + (1,), bool)], -1)
    run_start = lax.cummax(jnp.where(same_as_previous, 0, position), axis=moved_values.ndim - 1)
    run_end = lax.cummin(jnp.where(same_as_next, length - 1, position), axis=moved_values.ndim - 1, reverse=True)
    best = jnp.argmax(run_end - run_start, axis=-1)[..., None]
    value = jnp.take_along_axis(moved_values, best, axis=-1)[..., 0]
    index = jnp.take_along_axis(moved_indices, jnp.take_along_axis(run_end, best, axis=-1), axis=-1)[..., 0]
    if keepdim:
        value, index = jnp.expand_dims(value, axis), jnp.expand_dims(index, axis)
    return value, index
