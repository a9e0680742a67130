"""`nn.EmbeddingBag`: rows gathered by index and reduced per bag (sum, mean or max), and the backward.

Bags are given by `offsets` (the first position of each bag; with `include_last_offset` the last
entry closes the final bag, and positions from it on take no part, forward and backward, where
torch's CPU kernel is inconsistent). Entries equal to `padding_idx` take no part. The auxiliary outputs
follow torch's CPU kernel: `offset2bag` (each position's bag), `bag_size` (a bag's entries, for mean
and max; zeros for sum) and `max_indices` (the row each maximum came from, max mode only), with the
shapes torch's meta kernel gives them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from ._util import opmath
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array

_SUM, _MEAN, _MAX = 0, 1, 2


def _bags(indices: Array, offsets: Array, include_last_offset: bool, padding_idx: int) -> tuple[Array, Array, int]:
    """Each position's bag, whether the position takes part (not padding; before the closing offset
    when `include_last_offset`), and the number of bags."""
    starts = offsets[:-1] if include_last_offset else offsets
    positions = jnp.arange(indices.shape[0])
    offset2bag = jnp.maximum(jnp.searchsorted(starts, positions, side="right") - 1, 0).astype(jnp.int64)
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    if include_last_offset:
        valid = valid & (positions < offsets[-1])
    return offset2bag, valid, starts.shape[0]


@lowers(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(
    weight: Array,
    indices: Array,
    offsets: Array,
    scale_grad_by_freq: bool = False,
    mode: int = _SUM,
    sparse: bool = False,
    per_sample_weights: Array | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> tuple[Array, Array, Array, Array]:
    offset2bag, valid, n_bags = _bags(indices, offsets, include_last_offset, padding_idx)
    rows = jnp.take(weight, indices, axis=0)
    counts = jax.ops.segment_sum(valid.astype(jnp.int64), offset2bag, n_bags)
    bag_size = jnp.zeros(offsets.shape[0], jnp.int64).at[:n_bags].set(counts if mode != _SUM else 0)
    empty_max = jnp.zeros((0,), jnp.int64)
    if mode == _MAX:
        masked = jnp.where(valid[:, None], rows, -jnp.inf)
        output = jax.ops.segment_max(masked, offset2bag, n_bags)
        is_max = (masked == output[offset2bag]) & valid[:, None]
        last_row = jnp.where(is_max, indices[:, None], -1)
        max_indices = jax.ops.segment_max(last_row, offset2bag, n_bags)
        empty = (counts == 0)[:, None]
        return jnp.where(empty, 0, output).astype(weight.dtype), offset2bag, bag_size, jnp.where(empty, 0, max_indices).astype(jnp.int64)
    rows = opmath(rows)
    if per_sample_weights is not None:
        rows = rows * opmath(per_sample_weights)[:, None].astype(rows.dtype)
    output = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0), offset2bag, n_bags)
    if mode == _MEAN:
        output = output / jnp.maximum(counts, 1)[:, None].astype(output.dtype)
    return output.astype(weight.dtype), offset2bag, bag_size, empty_max


def _weight_grad(
    grad: Array,
    indices: Array,
    offset2bag: Array,
    bag_size: Array,
    maximum_indices: Array,
    num_weights: int,
    scale_grad_by_freq: bool,
    mode: int,
    per_sample_weights: Array | None,
    padding_idx: int,
    closing_offset: Array | None = None,
) -> Array:
    if mode == _MAX:
        n_bags, width = grad.shape
        occupied = (bag_size[:n_bags] > 0)[:, None]
        columns = jnp.broadcast_to(jnp.arange(width), (n_bags, width))
        return jnp.zeros((num_weights, width), grad.dtype).at[maximum_indices, columns].add(jnp.where(occupied, grad, 0))
    rows = opmath(grad[offset2bag])
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    if mode == _MEAN:
        rows = rows / jnp.maximum(bag_size[offset2bag], 1)[:, None].astype(rows.dtype)
    if scale_grad_by_freq:
        frequency = jnp.zeros(num_weights, rows.dtype).at[indices].add(1)
        rows = rows / frequency[indices][:, None]
    if padding_idx >= 0:
        rows = jnp.where((indices == padding_idx)[:, None], 0, rows)
    if closing_offset is not None:
        rows = jnp.where((jnp.arange(indices.shape[0]) < closing_offset)[:, None], rows, 0)
    return jnp.zeros((num_weights, grad.shape[1]), rows.dtype).at[indices].add(rows)


@lowers(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(
    grad: Array, indices: Array, offset2bag: Array, bag_size: Array, maximum_indices: Array, num_weights: int,
    scale_grad_by_freq: bool, mode: int, per_sample_weights: Array | None, padding_idx: int = -1,
) -> Array:
    return _weight_grad(grad, indices, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lowers(aten._embedding_bag_backward.default)
def embedding_bag_backward(
    grad: Array, indices: Array, offsets: Array, offset2bag: Array, bag_size: Array, maximum_indices: Array, num_weights: int,
    scale_grad_by_freq: bool, mode: int, sparse: bool, per_sample_weights: Array | None, padding_idx: int = -1,
) -> Array:
    """The weight's gradient, dense (a `sparse=True` bag's gradient is held dense on the chip). One
    offset more than bags means `include_last_offset`: positions from the last offset on took no part."""
    closing_offset = offsets[-1] if offsets.shape[0] == grad.shape[0] + 1 else None
    return _weight_grad(grad, indices, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode, per_sample_weights, padding_idx, closing_offset)


@lowers(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad: Array, weight: Array, indices: Array, offsets: Array, offset2bag: Array, mode: int, padding_idx: int = -1) -> Array:
    """Each sample weight's gradient (sum mode): its bag's output gradient dotted with its row."""
    products = jnp.sum(opmath(grad[offset2bag]) * opmath(jnp.take(weight, indices, axis=0)), axis=1)
    return jnp.where(indices == padding_idx, 0, products) if padding_idx >= 0 else products
