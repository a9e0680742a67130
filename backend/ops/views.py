"""View ops: each lowering computes the view's value from its input's value.

The dispatcher tracks aliasing itself and writes through views by applying these same lowerings to
integer position arrays, so every lowering here except the dtype-reinterpreting ones (`view.dtype`,
`view_as_real`, `view_as_complex`) must work for any dtype and move elements without changing them.
The `*_copy` variants share the lowering of their view.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tputrace.backend.core.dtypes import to_torch

from ._util import canon_dim, jax_dtype
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array

_INT64_MAX = 2**63 - 1


@lowers(aten.view.default, aten.view_copy.default, aten._unsafe_view.default)
def view(self: Array, size: Sequence[int]) -> Array:
    return jnp.reshape(self, tuple(size))


@lowers(aten._reshape_alias.default)
def reshape_alias(self: Array, size: Sequence[int], stride: Sequence[int]) -> Array:
    return jnp.reshape(self, tuple(size))


@lowers(aten.alias.default, aten.alias_copy.default, aten.detach.default, aten.detach_copy.default,
        aten.lift_fresh.default, aten.lift_fresh_copy.default)
def alias(self: Array) -> Array:
    return self


@lowers(aten.transpose.int, aten.transpose_copy.int)
def transpose(self: Array, dim0: int, dim1: int) -> Array:
    if self.ndim == 0:
        canon_dim(dim0, 0), canon_dim(dim1, 0)
        return self
    return jnp.swapaxes(self, canon_dim(dim0, self.ndim), canon_dim(dim1, self.ndim))


@lowers(aten.permute.default, aten.permute_copy.default)
def permute(self: Array, dims: Sequence[int]) -> Array:
    if self.ndim == 0:
        return self
    return jnp.transpose(self, [canon_dim(d, self.ndim) for d in dims])


@lowers(aten.t.default, aten.t_copy.default)
def t(self: Array) -> Array:
    return self if self.ndim < 2 else self.T


def expanded_shape(shape: Sequence[int], size: Sequence[int]) -> tuple[int, ...]:
    """The shape `expand(size)` gives: -1 keeps the input's size, new leading dims are allowed."""
    offset = len(size) - len(shape)
    return tuple(shape[i - offset] if s == -1 and i >= offset else s for i, s in enumerate(size))


@lowers(aten.expand.default, aten.expand_copy.default)
def expand(self: Array, size: Sequence[int], *, implicit: bool = False) -> Array:
    return jnp.broadcast_to(self, expanded_shape(self.shape, size))


def slice_bounds(length: int, start: int | None, end: int | None) -> tuple[int, int]:
    """torch's clamping of slice bounds: negatives count from the end, then clip to [0, length]."""
    start = 0 if start is None else start
    end = _INT64_MAX if end is None else end
    if start < 0:
        start += length
    if end < 0:
        end += length
    start = min(max(start, 0), length)
    end = min(max(end, start), length)
    return start, end


@lowers(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(self: Array, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1) -> Array:
    axis = canon_dim(dim, self.ndim)
    start, end = slice_bounds(self.shape[axis], start, end)
    return lax.slice_in_dim(self, start, end, stride=step, axis=axis)


@lowers(aten.select.int, aten.select_copy.int)
def select(self: Array, dim: int, index: int) -> Array:
    axis = canon_dim(dim, self.ndim)
    length = self.shape[axis]
    if not -length <= index < length:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(self.shape)} at dimension {dim}")
    return lax.index_in_dim(self, index % length, axis=axis, keepdims=False)


@lowers(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.default,
        aten.squeeze_copy.dim, aten.squeeze_copy.dims)
def squeeze(self: Array, dim: int | Sequence[int] | None = None) -> Array:
    if self.ndim == 0:
        return self
    if dim is None:
        dims = range(self.ndim)
    else:
        dims = [dim] if isinstance(dim, int) else dim
        dims = [canon_dim(d, self.ndim) for d in dims]
    return jnp.squeeze(self, tuple(d for d in set(dims) if self.shape[d] == 1))


@lowers(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(self: Array, dim: int) -> Array:
    return jnp.expand_dims(self, canon_dim(dim, self.ndim + 1))


def strided_positions(size: Sequence[int], stride: Sequence[int], storage_offset: int | None) -> np.ndarray:
    """Flat positions an `as_strided` view reads from a contiguous buffer."""
    positions = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for axis, (length, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[axis] = length
        positions = positions + (np.arange(length, dtype=np.int64) * step).reshape(shape)
    return positions


@lowers(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(self: Array, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None) -> Array:
    positions = strided_positions(size, stride, storage_offset)
    return jnp.take(self.reshape(-1), positions, mode="clip") if positions.size else jnp.zeros(tuple(size), self.dtype)


@lowers(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(self: Array, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Array:
    axis1, axis2 = canon_dim(dim1, self.ndim), canon_dim(dim2, self.ndim)
    if axis1 == axis2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    rows, cols = self.shape[axis1], self.shape[axis2]
    length = max(0, min(rows + min(offset, 0), cols - max(offset, 0)))
    if length == 0:
        shape = [s for i, s in enumerate(self.shape) if i not in (axis1, axis2)] + [0]
        return jnp.zeros(shape, self.dtype)
    return jnp.diagonal(self, offset=offset, axis1=axis1, axis2=axis2)


@lowers(aten.unfold.default, aten.unfold_copy.default)
def unfold(self: Array, dimension: int, size: int, step: int) -> Array:
    if self.ndim == 0:
        return self.reshape(1)
    axis = canon_dim(dimension, self.ndim)
    count = (self.shape[axis] - size) // step + 1
    windows = (np.arange(count)[:, None] * step + np.arange(size)[None, :]).astype(np.int64)
    taken = jnp.take(self, windows, axis=axis)
    return jnp.moveaxis(taken, axis + 1, -1)


def split_sizes(length: int, split_size: int) -> list[int]:
    if split_size == 0:
        return [0] if length == 0 else []
    sizes = [split_size] * (length // split_size)
    if length % split_size or length == 0:
        sizes.append(length % split_size)
    return sizes


def _split(self: Array, sizes: Sequence[int], dim: int) -> list[Array]:
    axis = canon_dim(dim, self.ndim)
    pieces, start = [], 0
    for size in sizes:
        pieces.append(lax.slice_in_dim(self, start, start + size, axis=axis))
        start += size
    return pieces


@lowers(aten.split.Tensor, aten.split_copy.Tensor, aten.unsafe_split.Tensor)
def split(self: Array, split_size: int, dim: int = 0) -> list[Array]:
    return _split(self, split_sizes(self.shape[canon_dim(dim, self.ndim)], split_size), dim)


@lowers(aten.split_with_sizes.default, aten.split_with_sizes_copy.default, aten.unsafe_split_with_sizes.default)
def split_with_sizes(self: Array, split_sizes: Sequence[int], dim: int = 0) -> list[Array]:
    return _split(self, split_sizes, dim)


@lowers(aten.unbind.int, aten.unbind_copy.int)
def unbind(self: Array, dim: int = 0) -> list[Array]:
    axis = canon_dim(dim, self.ndim)
    return [lax.index_in_dim(self, i, axis=axis, keepdims=False) for i in range(self.shape[axis])]


# --- views that reinterpret the element type ------------------------------------------------------


@lowers(aten.view_as_real.default, aten.view_as_real_copy.default)
def view_as_real(self: Array) -> Array:
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


@lowers(aten.view_as_complex.default, aten.view_as_complex_copy.default)
def view_as_complex(self: Array) -> Array:
    return lax.complex(self[..., 0], self[..., 1])


def _bitcast(x: Array, dtype: jnp.dtype) -> Array:
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    if dtype == jnp.bool_:
        return lax.bitcast_convert_type(x, jnp.uint8) != 0
    return lax.bitcast_convert_type(x, dtype)


def _real_parts(x: Array) -> Array:
    """A complex array as its real and imaginary parts side by side along the last dim."""
    parts = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)
    return parts.reshape(*x.shape[:-1], x.shape[-1] * 2)


def _from_real_parts(x: Array, dtype: jnp.dtype) -> Array:
    pairs = x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    return lax.complex(pairs[..., 0], pairs[..., 1]).astype(dtype)


@lowers(aten.view.dtype, aten.view_copy.dtype)
def view_dtype(self: Array, dtype: torch.dtype) -> Array:
    """The same bytes read as `dtype`; a complex number's bytes are its real then imaginary part."""
    target = jnp.dtype(jax_dtype(dtype))
    if jnp.issubdtype(self.dtype, jnp.complexfloating) and self.dtype != target:
        return view_dtype(_real_parts(self), dtype) if self.ndim else view_dtype(_real_parts(self.reshape(1)), dtype)
    if jnp.issubdtype(target, jnp.complexfloating) and self.dtype != target:
        component = jnp.finfo(target).dtype
        return _from_real_parts(view_dtype(self, to_torch(component)), target)
    source_size, target_size = self.dtype.itemsize, target.itemsize
    if source_size == target_size:
        return _bitcast(self, target)
    if source_size > target_size:
        ratio = source_size // target_size
        pieces = _bitcast(self, target)
        return pieces.reshape(*self.shape[:-1], self.shape[-1] * ratio)
    ratio = target_size // source_size
    grouped = self.reshape(*self.shape[:-1], self.shape[-1] // ratio, ratio)
    return _bitcast(grouped, target)
