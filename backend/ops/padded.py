"""Losses and means of a data-dependent result run on its padded buffer (see `padded_reads`).

Each takes the buffer's leading dim padded and the true length as a traced number (one program per
padded length, not per length): rows at `length` and past are made neutral (a loss target of
`ignore_index`, a difference of zero) before the op's own lowering runs, and a mean divides by the
count of real elements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ._util import canon_dim, jax_dtype, opmath, to_float
from .nn import nll_loss_backward, nll_loss_forward

Array = jax.Array
_MEAN = 1


def real_rows(padded: Array, length: Array, dim: int = 0) -> Array:
    """Whether each entry of `padded` lies before `length` along `dim`."""
    return lax.broadcasted_iota(jnp.int32, padded.shape, dim) < length


def _real_labels(target: Array, length: Array, ignore_index: int) -> Array:
    """`target` with its rows at `length` and past set to `ignore_index`."""
    return jnp.where(real_rows(target, length), target, jnp.asarray(ignore_index, target.dtype))


def _real_difference(self: Array, target: Array, length: Array, cut_dim: int) -> Array:
    """`self - target` in the op's math dtype, zero at `length` and past along `cut_dim`."""
    return jnp.where(real_rows(self, length, cut_dim), opmath(self) - opmath(target), 0)


def nll_loss_forward_padded(self: Array, target: Array, weight: Array | None, length: Array, *, reduction: int, ignore_index: int) -> tuple[Array, Array]:
    """`nll_loss_forward` of the first `length` rows: the rest get `ignore_index` (and zero scores,
    so that no padded score reaches a sum)."""
    scores = jnp.where(real_rows(self, length), self, jnp.zeros_like(self))
    labels = _real_labels(target, length, ignore_index)
    return nll_loss_forward(scores, labels, weight, reduction, ignore_index)


def nll_loss_backward_padded(grad_output: Array, self: Array, target: Array, weight: Array | None, total_weight: Array, length: Array, *, reduction: int, ignore_index: int) -> Array:
    """`nll_loss_backward` of the first `length` rows; the padded rows' gradient is zero."""
    labels = _real_labels(target, length, ignore_index)
    return nll_loss_backward(grad_output, self, labels, weight, reduction, ignore_index, total_weight)


def _real_count(shape: Sequence[int], length: Array, cut_dim: int) -> Array:
    """How many elements a tensor of the padded `shape` has once cut to `length` along `cut_dim`."""
    return length * math.prod(size for axis, size in enumerate(shape) if axis != cut_dim)


def mse_loss_padded(self: Array, target: Array, length: Array, *, cut_dim: int, reduction: int) -> Array:
    """`mse_loss` (mean or sum) of `self` and `target` cut to `length` along `cut_dim`."""
    difference = _real_difference(self, target, length, cut_dim)
    total = jnp.sum(difference * difference)
    if reduction == _MEAN:
        total = total / _real_count(self.shape, length, cut_dim)
    return total.astype(self.dtype)


def mse_loss_backward_padded(grad_output: Array, self: Array, target: Array, length: Array, *, cut_dim: int, reduction: int) -> Array:
    """`mse_loss_backward` (mean or sum) of the cut inputs; the padded entries' gradient is zero."""
    difference = _real_difference(self, target, length, cut_dim)
    grad = 2.0 * difference * opmath(grad_output)
    if reduction == _MEAN:
        grad = grad / _real_count(self.shape, length, cut_dim)
    return grad.astype(self.dtype)


def mean_padded(self: Array, length: Array, *, cut_dim: int, dims: Sequence[int] | None, keepdim: bool = False, dtype: torch.dtype | None = None) -> Array:
    """`mean` over `dims` (all when None or empty) of a floating `self` cut to `length` along
    `cut_dim`, which `dims` includes: a sum with the padding zeroed, over the count of real elements."""
    axes = tuple(range(self.ndim)) if not dims else tuple(sorted({canon_dim(axis, self.ndim) for axis in dims}))
    summed = jnp.where(real_rows(self, length, cut_dim), to_float(self if dtype is None else self.astype(jax_dtype(dtype))), 0)
    total = jnp.sum(summed, axis=axes, keepdims=keepdim)
    count = _real_count([self.shape[axis] for axis in axes], length, axes.index(cut_dim))
    return (total / count).astype(jax_dtype(dtype) or self.dtype)
