"""Losses, means, matmuls and layer norms of a data-dependent result run on its padded buffer (see `cuts`).

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
from .linalg import mm
from .nn import (
    binary_cross_entropy_with_logits, huber_loss, huber_loss_backward, log_softmax, log_softmax_backward_data, nll_loss_backward,
    nll_loss_forward, smooth_l1_loss, smooth_l1_loss_backward, softmax, softmax_backward_data,
)
from .normalization import native_layer_norm_backward

Array = jax.Array
_NONE, _MEAN = 0, 1


def real_rows(padded: Array, length: Array, dim: int = 0) -> Array:
    """Whether each entry of `padded` lies before `length` along `dim`."""
    return lax.broadcasted_iota(jnp.int32, padded.shape, dim) < length


def _real_labels(target: Array, length: Array, ignore_index: int) -> Array:
    """`target` with its rows at `length` and past set to `ignore_index`."""
    return fill_past(target, length, dim=0, fill=ignore_index)


def _real_difference(self: Array, target: Array, length: Array, cut_dim: int) -> Array:
    """`self - target` in the op's math dtype, zero at `length` and past along `cut_dim`."""
    return jnp.where(real_rows(self, length, cut_dim), opmath(self) - opmath(target), 0)


def nll_loss_forward_padded(self: Array, target: Array, weight: Array | None, length: Array, *, reduction: int, ignore_index: int) -> tuple[Array, Array]:
    """`nll_loss_forward` of the first `length` rows: the rest get `ignore_index` (and zero scores,
    so that no padded score reaches a sum)."""
    scores = fill_past(self, length, dim=0, fill=0)
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


def sum_over_cut(unreduced: Array, length: Array, *, cut_dim: int, reduction: int) -> Array:
    """The sum (a mean for `reduction` mean) of the entries of an entry-by-entry loss before `length`
    along `cut_dim` (counted from either end), half precision summed in float32: the padding may
    hold anything, NaN included."""
    dim = cut_dim % unreduced.ndim
    total = jnp.sum(opmath(fill_past(unreduced, length, dim=dim, fill=0)))
    if reduction == _MEAN:
        total = total / _real_count(unreduced.shape, length, dim)
    return total.astype(unreduced.dtype)


def gradient_over_cut(grad: Array, length: Array, *, cut_dim: int, reduction: int) -> Array:
    """The unreduced gradient of an entry-by-entry loss, zero at `length` and past along `cut_dim`
    (counted from either end), divided by the count of real entries for `reduction` mean."""
    dim = cut_dim % grad.ndim
    real = fill_past(grad, length, dim=dim, fill=0)
    if reduction == _MEAN:
        real = real / _real_count(grad.shape, length, dim)
    return real.astype(grad.dtype)


def binary_cross_entropy_with_logits_padded(self: Array, target: Array, weight: Array | None, pos_weight: Array | None, length: Array, *, cut_dim: int, reduction: int) -> Array:
    """`binary_cross_entropy_with_logits` (mean or sum) of inputs cut to `length` along `cut_dim`."""
    loss = binary_cross_entropy_with_logits(self, target, weight, pos_weight, _NONE)
    return sum_over_cut(loss, length, cut_dim=cut_dim, reduction=reduction)


def smooth_l1_loss_padded(self: Array, target: Array, length: Array, *, cut_dim: int, reduction: int, beta: float) -> Array:
    """`smooth_l1_loss` (mean or sum) of inputs cut to `length` along `cut_dim`."""
    return sum_over_cut(smooth_l1_loss(self, target, _NONE, beta), length, cut_dim=cut_dim, reduction=reduction)


def smooth_l1_loss_backward_padded(grad_output: Array, self: Array, target: Array, length: Array, *, cut_dim: int, reduction: int, beta: float) -> Array:
    """`smooth_l1_loss_backward` (mean or sum) of inputs cut to `length` along `cut_dim`."""
    grad = smooth_l1_loss_backward(grad_output, self, target, _NONE, beta)
    return gradient_over_cut(grad, length, cut_dim=cut_dim, reduction=reduction)


def huber_loss_padded(self: Array, target: Array, length: Array, *, cut_dim: int, reduction: int, delta: float) -> Array:
    """`huber_loss` (mean or sum) of inputs cut to `length` along `cut_dim`."""
    return sum_over_cut(huber_loss(self, target, _NONE, delta), length, cut_dim=cut_dim, reduction=reduction)


def huber_loss_backward_padded(grad_output: Array, self: Array, target: Array, length: Array, *, cut_dim: int, reduction: int, delta: float) -> Array:
    """`huber_loss_backward` (mean or sum) of inputs cut to `length` along `cut_dim`."""
    grad = huber_loss_backward(grad_output, self, target, _NONE, delta)
    return gradient_over_cut(grad, length, cut_dim=cut_dim, reduction=reduction)


def mean_padded(self: Array, length: Array, *, cut_dim: int, dims: Sequence[int] | None, keepdim: bool = False, dtype: torch.dtype | None = None) -> Array:
    """`mean` over `dims` (all when None or empty) of a floating `self` cut to `length` along
    `cut_dim`, which `dims` includes: a sum with the padding zeroed, over the count of real elements."""
    axes = tuple(range(self.ndim)) if not dims else tuple(sorted({canon_dim(axis, self.ndim) for axis in dims}))
    summed = jnp.where(real_rows(self, length, cut_dim), to_float(self if dtype is None else self.astype(jax_dtype(dtype))), 0)
    total = jnp.sum(summed, axis=axes, keepdims=keepdim)
    count = _real_count([self.shape[axis] for axis in axes], length, axes.index(cut_dim))
    return (total / count).astype(jax_dtype(dtype) or self.dtype)


def matmul_over_cut_padded(self: Array, other: Array, length: Array, *, self_dim: int, other_dim: int) -> Array:
    """`self @ other` (`mm`, `bmm` or `mv`) of two buffers cut to `length` along the dim the product sums
    over (a weight's gradient of a linear layer on a cut): the sum over their first `length` entries,
    the padded ones zeroed in both (padding may hold anything, NaN included)."""
    real_self = fill_past(self, length, dim=self_dim, fill=0)
    real_other = fill_past(other, length, dim=other_dim, fill=0)
    return mm(real_self, real_other).astype(self.dtype)


def layer_norm_backward_padded(
    grad_out: Array, self: Array, mean: Array, rstd: Array, weight: Array | None, bias: Array | None, length: Array, *,
    cut_dim: int, normalized_shape: Sequence[int], output_mask: Sequence[bool],
) -> tuple[Array, ...]:
    """The gradients `native_layer_norm_backward` gives (those `output_mask` asks for and a weight or
    bias exists for, in order) of rows cut to `length` along `cut_dim`: the padded rows of the
    gradient, input, mean and rstd are zeroed (padding may hold anything, NaN included), so that
    they add nothing to the weight's and bias's gradients."""
    real = [fill_past(value, length, dim=cut_dim, fill=0) for value in (grad_out, self, mean, rstd)]
    grads = native_layer_norm_backward(real[0], real[1], normalized_shape, real[2], real[3], weight, bias, output_mask)
    return tuple(grad for grad in grads if grad is not None)


def fill_past(padded: Array, length: Array, *, dim: int, fill: float | int | bool) -> Array:
    """`padded` with its entries at `length` and past along `dim` set to `fill` (a reduction's identity)."""
    return jnp.where(real_rows(padded, length, dim), padded, jnp.asarray(fill, padded.dtype))


def keep_past(written: Array, original: Array, length: Array, *, dim: int) -> Array:
    """`written` before `length` along `dim` and `original` from there on: an in-place op on a cut
    writes only the cut's entries of its buffer."""
    return jnp.where(real_rows(original, length, dim), written.astype(original.dtype), original)


def softmax_along_cut_padded(self: Array, length: Array, *, dim: int, half_to_float: bool, log: bool) -> Array:
    """`_softmax` (or `_log_softmax`) of `self` cut to `length` along `dim`, the dim it normalises:
    the padding counts as -inf, and is zero in the result (so that no padded entry reaches a sum)."""
    real = real_rows(self, length, dim)
    normalised = (log_softmax if log else softmax)(jnp.where(real, self, jnp.asarray(-jnp.inf, self.dtype)), dim, half_to_float)
    return jnp.where(real, normalised, 0).astype(jnp.float32 if half_to_float else self.dtype)


def softmax_backward_along_cut_padded(grad_output: Array, output: Array, length: Array, *, dim: int, input_dtype: torch.dtype, log: bool) -> Array:
    """The backward of `softmax_along_cut_padded`: the padded entries of the gradient and the output
    are zeroed before the sum along `dim`, and the padded entries' gradient is zero."""
    real = real_rows(output, length, dim)
    grad = jnp.where(real, grad_output, jnp.zeros_like(grad_output))
    result = (log_softmax_backward_data if log else softmax_backward_data)(grad, jnp.where(real, output, jnp.zeros_like(output)), dim, input_dtype)
    return jnp.where(real, result, 0).astype(jax_dtype(input_dtype))


def flip_cut_padded(self: Array, length: Array, *, dims: Sequence[int], cut_dim: int) -> Array:
    """`flip` of `self` cut to `length` along `cut_dim`, which `dims` includes: the first `length`
    entries along it are the cut's in reverse (the entries past them are padding)."""
    others = tuple(axis for axis in dims if axis != cut_dim)
    flipped = jnp.flip(self, axis=others) if others else self
    positions = (length - 1 - jnp.arange(self.shape[cut_dim], dtype=jnp.int32)) % self.shape[cut_dim]
    return jnp.take(flipped, positions, axis=cut_dim)
