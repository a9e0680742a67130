"""Advanced indexing, gathers and scatters, embeddings.

Boolean masks in `index` select a data-dependent number of elements, so those calls raise
`UnloweredCase`; the dispatcher then turns the masks into integer indices on the host and indexes
on the chip (`mask_indexing`); `index_put` with a single mask keeps the
input's shape and is lowered (`mask_counts` checks its values against the mask's count first).
Scatters build one full coordinate array per dim and use JAX's `.at[...]` updates; reductions that
exclude `self` first reset the touched positions to the reduction's identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tputrace.backend.compat import import_hooks

from ._util import UnloweredCase, canon_dim, is_float, is_integral
from .compaction import set_positions
from .reduction import vector_norm
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _add_at(base: Array, where: object, values: Array) -> Array:
    """base.at[where] += values; for bools torch's sum is a logical or."""
    if base.dtype == jnp.bool_:
        return base.at[where].max(values.astype(jnp.bool_))
    return base.at[where].add(values)


def _index_tuple(indices: Sequence[Array | None]) -> tuple:
    for index in indices:
        if index is not None and index.dtype in (jnp.bool_, jnp.uint8):
            raise UnloweredCase("indexing with a boolean mask has a data-dependent shape")
    return tuple(slice(None) if index is None else index for index in indices)


@lowers(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(self: Array, indices: Sequence[Array | None]) -> Array:
    return self[_index_tuple(indices)]


def _mask_put(self: Array, mask: Array, values: Array, accumulate: bool) -> Array:
    """self[mask] = values (or +=) for one boolean mask over the leading dims."""
    mask = mask.astype(jnp.bool_)
    rest = self.shape[mask.ndim:]
    wide_mask = mask.reshape(mask.shape + (1,) * len(rest))
    values = values.astype(self.dtype)
    if values.ndim > len(rest) and values.shape[0] == 0:
        return self  # no values: no element is set (`mask_counts` checked the count)
    if values.ndim <= len(rest) or values.shape[0] == 1:
        chosen = jnp.broadcast_to(values.reshape(values.shape[1:]) if values.ndim > len(rest) else values, rest)
        chosen = jnp.broadcast_to(chosen, self.shape)
    else:
        order = jnp.cumsum(mask.reshape(-1)) - 1
        picked = jnp.take(values.reshape(values.shape[0], -1), jnp.clip(order, 0, values.shape[0] - 1), axis=0)
        chosen = jnp.broadcast_to(picked.reshape(mask.shape + values.shape[1:]), self.shape)
    if accumulate:
        return self + jnp.where(wide_mask, chosen, jnp.zeros_like(chosen))
    return jnp.where(wide_mask, chosen, self)


@lowers(aten.index_put.default, aten._unsafe_index_put.default)
def index_put(self: Array, indices: Sequence[Array | None], values: Array, accumulate: bool = False) -> Array:
    present = [index for index in indices if index is not None]
    if len(indices) == 1 and present and present[0].dtype in (jnp.bool_, jnp.uint8):
        return _mask_put(self, present[0], values, accumulate)
    where = _index_tuple(indices)
    values = values.astype(self.dtype)
    return _add_at(self, where, values) if accumulate else self.at[where].set(values)


def zeros_and_scatter(shape: Sequence[int], indices: Sequence[Array], values: Array) -> Array:
    return index_put(jnp.zeros(tuple(shape), values.dtype), indices, values, accumulate=True)


def _lower_flex_zeros_and_scatter(defining_module: ModuleType) -> None:
    """FlexAttention's gradient of a captured tensor read by index in a `score_mod` (`bias[h]`): its
    op exists once Dynamo's module defining it is imported (Dynamo is not loaded before it is used)."""
    lowers(torch.ops.flex_lib.zeros_and_scatter.default)(zeros_and_scatter)


import_hooks.when_imported("torch._dynamo._trace_wrapped_higher_order_op", _lower_flex_zeros_and_scatter)


@lowers(aten._unsafe_masked_index.default)
def unsafe_masked_index(self: Array, mask: Array, indices: Sequence[Array | None], fill: object) -> Array:
    return jnp.where(mask, self[_index_tuple(indices)], jnp.asarray(fill).astype(self.dtype))


@lowers(aten._unsafe_masked_index_put_accumulate.default)
def unsafe_masked_index_put_accumulate(self: Array, mask: Array, indices: Sequence[Array | None], values: Array) -> Array:
    values = jnp.where(mask, values, jnp.zeros_like(values)).astype(self.dtype)
    return _add_at(self, _index_tuple(indices), values)


@lowers(aten.index_select.default)
def index_select(self: Array, dim: int, index: Array) -> Array:
    if self.ndim == 0:
        return jnp.take(self.reshape(1), index.reshape(-1), axis=0)
    return jnp.take(self, index.reshape(-1), axis=canon_dim(dim, self.ndim))


@lowers(aten.take.default)
def take(self: Array, index: Array) -> Array:
    return jnp.take(self.reshape(-1), index)


@lowers(aten.put.default)
def put(self: Array, index: Array, source: Array, accumulate: bool = False) -> Array:
    flat, positions, values = self.reshape(-1), index.reshape(-1), source.reshape(-1).astype(self.dtype)
    flat = _add_at(flat, positions, values) if accumulate else flat.at[positions].set(values)
    return flat.reshape(self.shape)


@lowers(aten.gather.default)
def gather(self: Array, dim: int, index: Array, *, sparse_grad: bool = False) -> Array:
    if index.size == 0:
        return jnp.zeros(index.shape, self.dtype)
    if self.ndim == 0:
        return jnp.take(self.reshape(1), index.reshape(-1)).reshape(index.shape)
    axis = canon_dim(dim, self.ndim)
    trimmed = self[tuple(slice(None) if d == axis else slice(0, index.shape[d]) for d in range(self.ndim))]
    return jnp.take_along_axis(trimmed, index, axis=axis)


# --- scatters -----------------------------------------------------------------------------------


def _coordinates(index: Array, axis: int) -> tuple[Array, ...]:
    """Full coordinates for a scatter: `index` along axis, the position itself along every other dim."""
    return tuple(index if d == axis else lax.broadcasted_iota(jnp.int64, index.shape, d) for d in range(index.ndim))


def _source(src: object, index: Array, dtype: jnp.dtype) -> Array:
    src = jnp.asarray(src).astype(dtype)
    if src.ndim == 0:
        return jnp.broadcast_to(src, index.shape)
    return src[tuple(slice(0, n) for n in index.shape)]


def _identity(reduce: str, dtype: jnp.dtype) -> Array:
    if reduce in ("sum", "mean", "add"):
        return jnp.zeros((), dtype)
    if reduce in ("prod", "multiply"):
        return jnp.ones((), dtype)
    if dtype == jnp.bool_:
        return jnp.asarray(reduce == "amin")
    info = jnp.finfo(dtype) if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype)
    if reduce == "amax":
        return jnp.asarray(-jnp.inf if is_float(jnp.zeros((), dtype)) else info.min, dtype)
    return jnp.asarray(jnp.inf if is_float(jnp.zeros((), dtype)) else info.max, dtype)


def scatter_reduced(self: Array, axis: int, index: Array, src: Array, reduce: str, include_self: bool = True) -> Array:
    """torch.scatter_reduce along axis with reduce in sum/prod/mean/amax/amin (and add/multiply)."""
    if self.ndim == 0:
        result = scatter_reduced(self.reshape(1), 0, index.reshape(-1), src.reshape(-1), reduce, include_self)
        return result.reshape(())
    if index.size == 0:
        return self
    where = _coordinates(index, axis)
    values = _source(src, index, self.dtype)
    base = self if include_self else self.at[where].set(_identity(reduce, self.dtype))
    if reduce in ("sum", "add", "mean"):
        total = _add_at(base, where, values)
        if reduce != "mean":
            return total
        counts = jnp.zeros(self.shape, jnp.int64).at[where].add(1) + (1 if include_self else 0)
        safe = jnp.maximum(counts, 1).astype(self.dtype)
        mean = total // safe if is_integral(self) else total / safe
        return jnp.where(counts > 0, mean, self)
    if reduce in ("prod", "multiply"):
        return base.at[where].min(values) if self.dtype == jnp.bool_ else base.at[where].multiply(values)
    if reduce == "amax":
        return base.at[where].max(values)
    if reduce == "amin":
        return base.at[where].min(values)
    raise ValueError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")


@lowers(aten.scatter.src, aten.scatter.value)
def scatter(self: Array, dim: int, index: Array, src: object) -> Array:
    if self.ndim == 0:
        return scatter(self.reshape(1), 0, index.reshape(-1), jnp.asarray(src).reshape(-1)).reshape(())
    if index.size == 0:
        return self
    axis = canon_dim(dim, self.ndim)
    return self.at[_coordinates(index, axis)].set(_source(src, index, self.dtype))


@lowers(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(self: Array, dim: int, index: Array, src: object, *, reduce: str) -> Array:
    return scatter_reduced(self, canon_dim(dim, self.ndim), index, jnp.asarray(src), reduce)


@lowers(aten.scatter_add.default)
def scatter_add(self: Array, dim: int, index: Array, src: Array) -> Array:
    return scatter_reduced(self, canon_dim(dim, self.ndim), index, src, "sum")


@lowers(aten.scatter_reduce.two)
def scatter_reduce(self: Array, dim: int, index: Array, src: Array, reduce: str, *, include_self: bool = True) -> Array:
    return scatter_reduced(self, canon_dim(dim, self.ndim), index, src, reduce, include_self)


def _expanded_index(index: Array, source: Array, axis: int) -> Array:
    """An index_* op's 1-D index as a scatter index shaped like source."""
    shape = [1] * source.ndim
    shape[axis] = index.shape[0] if index.ndim else 1
    return jnp.broadcast_to(index.reshape(shape), source.shape)


@lowers(aten.index_add.default)
def index_add(self: Array, dim: int, index: Array, source: Array, *, alpha: object = 1) -> Array:
    if self.ndim == 0:
        return self + alpha * jnp.sum(source)
    axis = canon_dim(dim, self.ndim)
    scaled = source if type(alpha) is int and alpha == 1 else alpha * source
    return scatter_reduced(self, axis, _expanded_index(index, source, axis), scaled, "sum")


@lowers(aten.index_reduce.default)
def index_reduce(self: Array, dim: int, index: Array, source: Array, reduce: str, *, include_self: bool = True) -> Array:
    if self.ndim == 0:
        return index_reduce(self.reshape(1), 0, index, source.reshape(1), reduce, include_self=include_self).reshape(())
    axis = canon_dim(dim, self.ndim)
    return scatter_reduced(self, axis, _expanded_index(index, source, axis), source, reduce, include_self)


@lowers(aten.index_copy.default)
def index_copy(self: Array, dim: int, index: Array, source: Array) -> Array:
    if self.ndim == 0:
        return source.reshape(()).astype(self.dtype)
    axis = canon_dim(dim, self.ndim)
    moved = jnp.moveaxis(self, axis, 0).at[index.reshape(-1)].set(jnp.moveaxis(source, axis, 0).astype(self.dtype))
    return jnp.moveaxis(moved, 0, axis)


@lowers(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(self: Array, dim: int, index: Array, value: object) -> Array:
    if self.ndim == 0:
        return jnp.asarray(value).astype(self.dtype).reshape(())
    axis = canon_dim(dim, self.ndim)
    moved = jnp.moveaxis(self, axis, 0).at[index.reshape(-1)].set(jnp.asarray(value).astype(self.dtype))
    return jnp.moveaxis(moved, 0, axis)


@lowers(aten.masked_scatter.default)
def masked_scatter(self: Array, mask: Array, source: Array) -> Array:
    self, mask = jnp.broadcast_arrays(self, mask.astype(jnp.bool_))
    flat_mask = mask.reshape(-1)
    order = jnp.clip(jnp.cumsum(flat_mask) - 1, 0, max(source.size - 1, 0))
    picked = jnp.take(source.reshape(-1).astype(self.dtype), order) if source.size else jnp.zeros_like(self.reshape(-1))
    return jnp.where(flat_mask, picked, self.reshape(-1)).reshape(self.shape)


@lowers(aten.nonzero_static.default)
def nonzero_static(self: Array, *, size: int, fill_value: int = -1) -> Array:
    """The first `size` nonzero positions, padded with `fill_value`: a static shape, no sync."""
    if self.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    positions, is_set = set_positions((self != 0).reshape(-1), size, 0)
    coordinates = jnp.stack(jnp.unravel_index(positions, self.shape), axis=-1).astype(jnp.int64)
    return jnp.where(is_set[:, None], coordinates, fill_value)


# --- embeddings ----------------------------------------------------------------------------------


@lowers(aten.embedding.default)
def embedding(weight: Array, indices: Array, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False) -> Array:
    return jnp.take(weight, indices, axis=0)


@lowers(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output: Array, indices: Array, num_weights: int, padding_idx: int, scale_grad_by_freq: bool) -> Array:
    flat_indices = indices.reshape(-1)
    grads = grad_output.reshape(flat_indices.shape[0], -1)
    if scale_grad_by_freq:
        counts = jnp.zeros(num_weights, grads.dtype).at[flat_indices].add(1)
        grads = grads / counts[flat_indices][:, None]
    if padding_idx >= 0:
        grads = jnp.where((flat_indices == padding_idx)[:, None], jnp.zeros_like(grads), grads)
    result = jnp.zeros((num_weights, grads.shape[1]), grads.dtype).at[flat_indices].add(grads)
    return result.reshape((num_weights,) + grad_output.shape[indices.ndim:])


@lowers(aten.embedding_renorm.default)
def embedding_renorm(self: Array, indices: Array, max_norm: float, norm_type: float) -> Array:
    """`nn.Embedding(max_norm=...)`: the rows looked up whose norm exceeds max_norm are scaled down to it."""
    looked_up = jnp.zeros(self.shape[0], bool).at[indices.reshape(-1)].set(True)
    norms = vector_norm(self.astype(jnp.float32), norm_type, (1,), False)
    scale = jnp.where(looked_up & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    return (self * scale[:, None].astype(self.dtype)).astype(self.dtype)
