"""Ops that rearrange elements into new tensors: cat/stack, flips and rolls, padding, triangles,
scatters through views (`slice_scatter`, ...) and the backward ops of views.

A scatter through a view is computed by applying the view's own lowering to an array of flat
positions, then writing the source into those positions; one mechanism covers every view. Slices and
selects, whose views are strided boxes, are written with a pad instead (and a mask of the box where
the base is kept): XLA:CPU compiles a pad into the loop that consumes it, and a scatter into a
kernel of its own plus the index arithmetic that feeds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import views
from ._util import UnloweredCase, canon_dim
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


@lowers(aten.cat.default)
def cat(tensors: Sequence[Array], dim: int = 0) -> Array:
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return jnp.concatenate(list(tensors), axis=0)
    dtype = jnp.result_type(*tensors)
    axis = canon_dim(dim, kept[0].ndim)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=axis)


@lowers(aten.stack.default)
def stack(tensors: Sequence[Array], dim: int = 0) -> Array:
    return jnp.stack(list(tensors), axis=canon_dim(dim, tensors[0].ndim + 1))


@lowers(aten.flip.default)
def flip(self: Array, dims: Sequence[int]) -> Array:
    if self.ndim == 0:
        return self
    return jnp.flip(self, axis=tuple(canon_dim(d, self.ndim) for d in dims))


@lowers(aten.roll.default)
def roll(self: Array, shifts: Sequence[int], dims: Sequence[int] = ()) -> Array:
    if not dims:
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return jnp.roll(self, tuple(shifts), axis=tuple(canon_dim(d, self.ndim) for d in dims))


@lowers(aten.rot90.default)
def rot90(self: Array, k: int = 1, dims: Sequence[int] = (0, 1)) -> Array:
    return jnp.rot90(self, k, axes=tuple(canon_dim(d, self.ndim) for d in dims))


@lowers(aten.repeat.default)
def repeat(self: Array, repeats: Sequence[int]) -> Array:
    expanded = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    return jnp.tile(expanded, tuple(repeats))


@lowers(aten.constant_pad_nd.default)
def constant_pad_nd(self: Array, pad: Sequence[int], value: object = 0) -> Array:
    config = [(0, 0, 0)] * self.ndim
    for i in range(len(pad) // 2):
        axis = self.ndim - 1 - i
        config[axis] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(self, jnp.asarray(value).astype(self.dtype), config)


@lowers(aten.triu.default)
def triu(self: Array, diagonal: int = 0) -> Array:
    return jnp.triu(self, diagonal)


@lowers(aten.tril.default)
def tril(self: Array, diagonal: int = 0) -> Array:
    return jnp.tril(self, diagonal)


@lowers(aten.narrow_copy.default)
def narrow_copy(self: Array, dim: int, start: int, length: int) -> Array:
    axis = canon_dim(dim, self.ndim)
    start = start + self.shape[axis] if start < 0 else start
    return lax.slice_in_dim(self, start, start + length, axis=axis)


@lowers(aten.trace.default)
def trace(self: Array) -> Array:
    total = jnp.trace(self)
    return total.astype(jnp.int64) if jnp.issubdtype(self.dtype, jnp.integer) or self.dtype == jnp.bool_ else total


@lowers(aten.diag_embed.default)
def diag_embed(self: Array, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Array:
    length = self.shape[-1]
    size = length + abs(offset)
    rows = np.arange(length) + max(-offset, 0)
    cols = np.arange(length) + max(offset, 0)
    result = jnp.zeros(self.shape[:-1] + (size, size), self.dtype).at[..., rows, cols].set(self)
    rank = self.ndim + 1
    return jnp.moveaxis(result, (-2, -1), (canon_dim(dim1, rank), canon_dim(dim2, rank)))


@lowers(aten.block_diag.default)
def block_diag(tensors: Sequence[Array]) -> Array:
    blocks = [t.reshape(1, 1) if t.ndim == 0 else (t.reshape(1, -1) if t.ndim == 1 else t) for t in tensors]
    dtype = jnp.result_type(*blocks)
    rows, cols = sum(b.shape[0] for b in blocks), sum(b.shape[1] for b in blocks)
    result = jnp.zeros((rows, cols), dtype)
    row = col = 0
    for block in blocks:
        result = lax.dynamic_update_slice(result, block.astype(dtype), (row, col))
        row, col = row + block.shape[0], col + block.shape[1]
    return result


# --- scatters through views and the backward ops of views ---------------------------------------


def write_through_view(base: Array, src: Array, view_fn: Callable[[Array], Array], accumulate: bool = False) -> Array:
    """base with the elements a view of it selects replaced by (or increased by) src."""
    positions = view_fn(jnp.arange(base.size, dtype=jnp.int64).reshape(base.shape))
    values = jnp.broadcast_to(src.astype(base.dtype), positions.shape).reshape(-1)
    flat = base.reshape(-1)
    flat = flat.at[positions.reshape(-1)].add(values) if accumulate else flat.at[positions.reshape(-1)].set(values)
    return flat.reshape(base.shape)


def _padded_into_slice(src: Array, shape: Sequence[int], axis: int, start: int, step: int) -> Array:
    """`src` placed at `start::step` along `axis` of an array of `shape`, zeros elsewhere: a pad,
    whose interior padding leaves the `step - 1` gaps between the slice's elements."""
    count = src.shape[axis]
    config = [(0, 0, 0)] * len(shape)
    if count:
        config[axis] = (start, shape[axis] - start - (count - 1) * step - 1, step - 1)
    else:
        config[axis] = (shape[axis], 0, 0)
    return lax.pad(src, jnp.zeros((), src.dtype), config)


def _slice_box(shape: Sequence[int], dim: int, start: int | None, end: int | None, step: int) -> tuple[int, int, int]:
    """The axis, first index and element count of the slice `start:end:step` along `dim` of `shape`."""
    if step <= 0:
        raise ValueError("slice step must be positive")
    axis = canon_dim(dim, len(shape))
    first, stop = views.slice_bounds(shape[axis], start, end)
    return axis, first, -(-(stop - first) // step)


def _write_into_slice(self: Array, src: Array, axis: int, start: int, step: int) -> Array:
    """`self` with `src` written at `start::step` along `axis` (src already has the slice's shape)."""
    values = _padded_into_slice(src.astype(self.dtype), self.shape, axis, start, step)
    inside = _padded_into_slice(jnp.ones(src.shape, jnp.bool_), self.shape, axis, start, step)
    return jnp.where(inside, values, self)


@lowers(aten.slice_scatter.default)
def slice_scatter(self: Array, src: Array, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1) -> Array:
    axis, first, count = _slice_box(self.shape, dim, start, end, step)
    box = list(self.shape)
    box[axis] = count
    return _write_into_slice(self, jnp.broadcast_to(src, box), axis, first, step)


@lowers(aten.select_scatter.default)
def select_scatter(self: Array, src: Array, dim: int, index: int) -> Array:
    axis = canon_dim(dim, self.ndim)
    views.select(self, dim, index)  # torch's index check
    row = jnp.expand_dims(jnp.broadcast_to(src, self.shape[:axis] + self.shape[axis + 1:]), axis)
    return _write_into_slice(self, row, axis, index % self.shape[axis], 1)


@lowers(aten.diagonal_scatter.default)
def diagonal_scatter(self: Array, src: Array, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Array:
    return write_through_view(self, src, lambda x: views.diagonal(x, offset, dim1, dim2))


@lowers(aten.as_strided_scatter.default)
def as_strided_scatter(self: Array, src: Array, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None) -> Array:
    return write_through_view(self, src, lambda x: views.as_strided(x, size, stride, storage_offset))


@lowers(aten.select_backward.default)
def select_backward(grad_output: Array, input_sizes: Sequence[int], dim: int, index: int) -> Array:
    shape = tuple(input_sizes)
    axis = canon_dim(dim, len(shape))
    if not -shape[axis] <= index < shape[axis]:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(shape)} at dimension {dim}")
    return _padded_into_slice(jnp.expand_dims(grad_output, axis), shape, axis, index % shape[axis], 1)


@lowers(aten.slice_backward.default)
def slice_backward(grad_output: Array, input_sizes: Sequence[int], dim: int, start: int, end: int, step: int) -> Array:
    shape = tuple(input_sizes)
    axis, first, _ = _slice_box(shape, dim, start, end, step)
    return _padded_into_slice(grad_output, shape, axis, first, step)


@lowers(aten.diagonal_backward.default)
def diagonal_backward(grad_output: Array, input_sizes: Sequence[int], offset: int, dim1: int, dim2: int) -> Array:
    zeros = jnp.zeros(tuple(input_sizes), grad_output.dtype)
    return write_through_view(zeros, grad_output, lambda x: views.diagonal(x, offset, dim1, dim2))


@lowers(aten.unfold_backward.default)
def unfold_backward(grad_in: Array, input_sizes: Sequence[int], dim: int, size: int, step: int) -> Array:
    zeros = jnp.zeros(tuple(input_sizes), grad_in.dtype)
    return write_through_view(zeros, grad_in, lambda x: views.unfold(x, dim, size, step), accumulate=True)


# --- channel rearrangements ----------------------------------------------------------------------


@lowers(aten.pixel_shuffle.default)
def pixel_shuffle(self: Array, upscale_factor: int) -> Array:
    r = upscale_factor
    *batch, channels, height, width = self.shape
    out_channels = channels // (r * r)
    x = self.reshape(*batch, out_channels, r, r, height, width)
    n = len(batch)
    x = jnp.transpose(x, (*range(n), n, n + 3, n + 1, n + 4, n + 2))
    return x.reshape(*batch, out_channels, height * r, width * r)


@lowers(aten.pixel_unshuffle.default)
def pixel_unshuffle(self: Array, downscale_factor: int) -> Array:
    r = downscale_factor
    *batch, channels, height, width = self.shape
    x = self.reshape(*batch, channels, height // r, r, width // r, r)
    n = len(batch)
    x = jnp.transpose(x, (*range(n), n, n + 2, n + 4, n + 1, n + 3))
    return x.reshape(*batch, channels * r * r, height // r, width // r)


@lowers(aten.channel_shuffle.default)
def channel_shuffle(self: Array, groups: int) -> Array:
    batch, channels, *rest = self.shape
    x = self.reshape(batch, groups, channels // groups, *rest)
    return jnp.swapaxes(x, 1, 2).reshape(self.shape)


@lowers(aten.repeat_interleave.Tensor)
def repeat_interleave(repeats: Array, *, output_size: int | None = None) -> Array:
    """Position i repeated repeats[i] times; only with `output_size`, which fixes the result's length
    (without it, `data_dependent` reads the repeats' sum first and passes it)."""
    if output_size is None:
        raise UnloweredCase("repeat_interleave without output_size has a data-dependent length")
    repeats = repeats.reshape(-1)
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=jnp.int64), repeats, total_repeat_length=output_size)
