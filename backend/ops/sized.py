"""The two steps of the ops whose output length depends on the data (`unique`, `bincount`,
`repeat_interleave`'s check; see `data_dependent`), lowered as programs of their own.

`x[mask]`'s gather is here too (see `mask_indexing`), and `x[mask, idx]`'s read and write (see
`mask_beside_indices`).

A data-dependent op runs as a *measure* program, whose small result the host reads to learn the
output's length, then a *sized* program, compiled for that length. The measure step of `unique`
also returns the sorted values (and their order, for an inverse), so the sized step does not sort again.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import Array, lax

from .compaction import set_positions

_NO_INDICES = (0,)  # the shape torch gives the inverse or counts that were not asked for
_BITS = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}  # a float's bits as a signed integer, by width


def extremes(values: Array) -> Array:
    """[sum, min, max] of integer values as int64: what bincount and repeat_interleave need to know
    of their input before their output length is fixed (one 24-byte read)."""
    wide = values.astype(jnp.int64)
    return jnp.stack([jnp.sum(wide), jnp.min(wide), jnp.max(wide)])


def mask_select(self: Array, mask: Array, *, size: int, dim: int) -> Array:
    """`self[mask]` for a mask over dims [dim, dim + mask.ndim) of `self`: the slices at the mask's
    first `size` set positions, in one dim at `dim` (slots past the last set position repeat the first slice)."""
    covered = math.prod(mask.shape)
    merged = self.reshape(*self.shape[:dim], covered, *self.shape[dim + mask.ndim:])
    positions, _ = set_positions(mask.reshape(-1), size, 0)
    return jnp.take(merged, positions, axis=dim, mode="clip")


def bincount_sized(self: Array, weights: Array | None, *, size: int) -> Array:
    """Counts (or summed weights) of each value in [0, size); every value is known to lie there.
    Weights are summed in float32 if they are float32 and in float64 otherwise, as on the CPU."""
    if weights is None:
        return jnp.zeros(size, jnp.int64).at[self].add(1)
    accumulator = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64
    return jax.ops.segment_sum(weights.astype(accumulator), self, num_segments=size)


def _rows(self: Array, dim: int | None) -> Array:
    """The elements compared by `unique`: each element as a row of one (dim None), or each slice
    along `dim` flattened into a row."""
    if dim is None:
        return self.reshape(-1, 1)
    return jnp.moveaxis(self, dim, 0).reshape(self.shape[dim], math.prod(self.shape) // max(self.shape[dim], 1))


def _sort_keys(values: Array) -> Array:
    """Integers that sort as the values do, for floats (XLA sorts integers several times faster than
    floats): the bits, with a negative value's other bits flipped; NaNs made one positive NaN, so
    they sort last as torch sorts them. Its own inverse (`_from_sort_keys`)."""
    if not jnp.issubdtype(values.dtype, jnp.floating):
        return values
    bits = lax.bitcast_convert_type(jnp.where(jnp.isnan(values), jnp.nan, values), _BITS[values.dtype.itemsize])
    return bits ^ ((bits >> (8 * values.dtype.itemsize - 1)) & jnp.iinfo(bits.dtype).max)


def _from_sort_keys(keys: Array, dtype: jnp.dtype) -> Array:
    if not jnp.issubdtype(dtype, jnp.floating):
        return keys
    bits = keys ^ ((keys >> (8 * dtype.itemsize - 1)) & jnp.iinfo(keys.dtype).max)
    return lax.bitcast_convert_type(bits, dtype)


def _sorted_rows(rows: Array, with_order: bool) -> tuple[Array, Array | None]:
    """Rows in lexicographic order (first column first; NaNs last, as torch sorts), and the order
    itself when asked: elements (rows of one) are sorted alone when no order is needed."""
    if rows.shape[1] > 1:
        order = jnp.lexsort(tuple(rows[:, column] for column in reversed(range(rows.shape[1]))))
        return rows[order], order
    keys = _sort_keys(rows[:, 0])
    order = None
    if with_order:
        keys, order = lax.sort((keys, jnp.arange(keys.shape[0])), num_keys=1, is_stable=False)
    else:
        keys = jnp.sort(keys)
    return _from_sort_keys(keys, rows.dtype)[:, None], order


def _starts(rows: Array) -> Array:
    """Whether each row differs from the one before it (the first row does): NaN differs from NaN,
    as torch's CPU kernel compares."""
    differs = jnp.any(rows[1:] != rows[:-1], axis=1)
    return jnp.concatenate([jnp.ones(min(rows.shape[0], 1), jnp.bool_), differs])


def unique_measure(self: Array, *, dim: int | None, sort: bool, with_order: bool) -> tuple[Array, ...]:
    """The number of distinct rows, last; before it, when sorting, the sorted rows and (if
    `with_order`, for an inverse) their order. Not sorting, the number of runs of equal rows."""
    rows = _rows(self, dim)
    if not sort:
        return (jnp.sum(_starts(rows), dtype=jnp.int64),)
    arranged, order = _sorted_rows(rows, with_order)
    count = jnp.sum(_starts(arranged), dtype=jnp.int64)
    return (arranged, count) if order is None else (arranged, order, count)


def unique_sized(
    self: Array, arranged: Array | None, order: Array | None, *, size: int, dim: int | None, return_inverse: bool, return_counts: bool
) -> tuple[Array, Array, Array]:
    """(values, inverse, counts) of `unique` over the sorted rows `arranged` (with their `order` for
    an inverse), or of `unique_consecutive` over `self`'s rows as they are, knowing there are `size`
    groups at most (`size` may be more than the groups: the values and counts past them are padding).
    The inverse has the input's shape (its length along `dim` with a dim); an inverse or counts not
    asked for are empty, as torch's are."""
    if arranged is None:
        arranged = _rows(self, dim)
    starts = _starts(arranged)
    firsts, _ = set_positions(starts, size, arranged.shape[0])
    picked = jnp.take(arranged, firsts, axis=0, mode="clip")
    if dim is None:
        values = picked.reshape(size)
    else:
        moved = (size, *(length for axis, length in enumerate(self.shape) if axis != dim))
        values = jnp.moveaxis(picked.reshape(moved), 0, dim)
    inverse = counts = jnp.zeros(_NO_INDICES, jnp.int64)
    if return_inverse:
        groups = jnp.cumsum(starts, dtype=jnp.int64) - 1
        if order is not None:
            groups = jnp.zeros_like(groups).at[order].set(groups)
        inverse = groups.reshape(self.shape if dim is None else (self.shape[dim],))
    if return_counts:
        counts = jnp.diff(jnp.append(firsts, arranged.shape[0])).astype(jnp.int64)
    return values, inverse, counts


def _mask_coordinates(mask: Array, size: int, fill: int) -> tuple[Array, ...]:
    """The coordinates (one array per mask dim) of the mask's first `size` set elements; in slots
    past the last set one, the first coordinate is `fill` and the others 0."""
    positions, is_set = set_positions(mask.reshape(-1), size, 0)
    coordinates = []
    for length in reversed(mask.shape[1:]):
        coordinates.append(positions % length)
        positions = positions // length
    return (jnp.where(is_set, positions, fill), *reversed(coordinates))


def _index_tuple(indices: list, mask_at: int, coordinates: tuple[Array, ...]) -> tuple:
    """NumPy's index for torch's `indices` with the mask at `mask_at` replaced by its coordinates
    (torch places the result's dims as NumPy does: see `mask_beside_indices`)."""
    entries = (*indices[:mask_at], *coordinates, *indices[mask_at + 1:])
    return tuple(slice(None) if entry is None else entry for entry in entries)


def mask_index(self: Array, indices: list, *, size: int, mask_at: int) -> Array:
    """`self[indices]` where `indices[mask_at]` is a mask and the others are None or integer indices:
    the mask's first `size` set positions stand for it (slots past the last set one index 0)."""
    mask = indices[mask_at]
    return self[_index_tuple(indices, mask_at, _mask_coordinates(mask, size, 0))]


def mask_index_put(self: Array, indices: list, values: Array, *, size: int, mask_at: int, accumulate: bool) -> Array:
    """`self[indices] = values` (or `+=`) as `mask_index` reads them: slots past the mask's last set
    position index past the end of its first dim and are dropped."""
    mask = indices[mask_at]
    where = _index_tuple(indices, mask_at, _mask_coordinates(mask, size, mask.shape[0]))
    values = values.astype(self.dtype)
    if not accumulate:
        return self.at[where].set(values, mode="drop")
    if self.dtype == jnp.bool_:
        return self.at[where].max(values, mode="drop")
    return self.at[where].add(values, mode="drop")
