"""Softmax, losses, normalisation layers, dropout backward and attention.

Half-precision inputs compute in float32 (the dispatcher casts results back), as torch's CPU kernels
accumulate. Backward ops use the saved statistics they are given, so they agree with a forward that
ran elsewhere. `native_batch_norm` is not lowered: in training it updates the running statistics in
place although its schema does not declare the write, so it runs as torch's decomposition, whose
`copy_` into the running statistics reaches the device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import torch

from ._util import PRECISION, UnloweredCase, canon_dim, to_float
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array

_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def _compute(x: Array) -> Array:
    x = to_float(x)
    return x.astype(jnp.float32) if x.dtype in _HALF else x


# --- softmax ------------------------------------------------------------------------------------


def _along(self: Array, dim: int, fn) -> Array:
    if self.ndim == 0:
        return fn(self.reshape(1), 0).reshape(())
    return fn(self, canon_dim(dim, self.ndim))


def _softmax_along(x: Array, axis: int) -> Array:
    peak = jnp.max(x, axis=axis, keepdims=True)
    exps = jnp.exp(x - peak)
    return exps / jnp.sum(exps, axis=axis, keepdims=True)


def _log_softmax_along(x: Array, axis: int) -> Array:
    shifted = x - jnp.max(x, axis=axis, keepdims=True)
    return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True))


@lowers(aten._softmax.default)
def softmax(self: Array, dim: int, half_to_float: bool) -> Array:
    return _along(_compute(self), dim, _softmax_along)


@lowers(aten._log_softmax.default)
def log_softmax(self: Array, dim: int, half_to_float: bool) -> Array:
    return _along(_compute(self), dim, _log_softmax_along)


@lowers(aten._safe_softmax.default)
def safe_softmax(self: Array, dim: int, dtype: torch.dtype | None = None) -> Array:
    def safe(x: Array, axis: int) -> Array:
        all_masked = jnp.all(x == -jnp.inf, axis=axis, keepdims=True)
        return jnp.where(all_masked, jnp.zeros_like(x), _softmax_along(x, axis))

    return _along(_compute(self), dim, safe)


@lowers(aten._softmax_backward_data.default)
def softmax_backward_data(grad_output: Array, output: Array, dim: int, input_dtype: torch.dtype) -> Array:
    def backward(g: Array, axis: int) -> Array:
        y = output.reshape(g.shape)
        return y * (g - jnp.sum(g * y, axis=axis, keepdims=True))

    return _along(grad_output, dim, backward)


@lowers(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(grad_output: Array, output: Array, dim: int, input_dtype: torch.dtype) -> Array:
    def backward(g: Array, axis: int) -> Array:
        y = output.reshape(g.shape)
        return g - jnp.exp(y) * jnp.sum(g, axis=axis, keepdims=True)

    return _along(grad_output, dim, backward)


# --- losses (reduction: 0 none, 1 mean, 2 sum) -------------------------------------------------------


def _reduce(loss: Array, reduction: int) -> Array:
    if reduction == 1:
        return jnp.mean(loss)
    if reduction == 2:
        return jnp.sum(loss)
    return loss


def _reduce_grad(grad: Array, reduction: int, count: int) -> Array:
    return grad / count if reduction == 1 else grad


def _class_last(self: Array, target: Array) -> tuple[Array, Array]:
    """Scores as (samples, classes) and targets as (samples,), for inputs (C), (N, C) or (N, C, d...)."""
    if self.ndim == 1:
        return self.reshape(1, -1), target.reshape(1)
    return jnp.moveaxis(self, 1, -1).reshape(-1, self.shape[1]), target.reshape(-1)


def _nll_terms(self: Array, target: Array, weight: Array | None, ignore_index: int) -> tuple[Array, Array, Array]:
    scores, labels = _class_last(self, target)
    valid = labels != ignore_index
    safe = jnp.where(valid, labels, 0)
    weights = jnp.ones(labels.shape, scores.dtype) if weight is None else weight[safe].astype(scores.dtype)
    weights = jnp.where(valid, weights, jnp.zeros_like(weights))
    return scores, safe, weights


@lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(self: Array, target: Array, weight: Array | None, reduction: int, ignore_index: int) -> tuple[Array, Array]:
    scores, safe, weights = _nll_terms(self, target, weight, ignore_index)
    losses = -jnp.take_along_axis(scores, safe[:, None], axis=1)[:, 0] * weights
    total_weight = jnp.sum(weights)
    if reduction == 0:
        return losses.reshape(target.shape), jnp.zeros((), scores.dtype)
    total = jnp.sum(losses)
    return (total / total_weight if reduction == 1 else total), total_weight


@lowers(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad_output: Array, self: Array, target: Array, weight: Array | None, reduction: int, ignore_index: int, total_weight: Array) -> Array:
    scores, safe, weights = _nll_terms(self, target, weight, ignore_index)
    if reduction == 0:
        grads = grad_output.reshape(-1)
    elif reduction == 1:
        grads = jnp.broadcast_to(grad_output / total_weight, safe.shape)
    else:
        grads = jnp.broadcast_to(grad_output, safe.shape)
    rows = jnp.arange(safe.shape[0])
    grad_scores = jnp.zeros(scores.shape, scores.dtype).at[rows, safe].set(-weights * grads)
    if self.ndim == 1:
        return grad_scores.reshape(self.shape)
    moved_shape = (self.shape[0],) + self.shape[2:] + (self.shape[1],)
    return jnp.moveaxis(grad_scores.reshape(moved_shape), -1, 1)


@lowers(aten.mse_loss.default)
def mse_loss(self: Array, target: Array, reduction: int = 1) -> Array:
    return _reduce((self - target) ** 2, reduction)


@lowers(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output: Array, self: Array, target: Array, reduction: int) -> Array:
    return _reduce_grad(2.0 * (self - target) * grad_output, reduction, self.size)


@lowers(aten.smooth_l1_loss.default)
def smooth_l1_loss(self: Array, target: Array, reduction: int = 1, beta: float = 1.0) -> Array:
    diff = jnp.abs(self - target)
    if beta == 0:
        return _reduce(diff, reduction)
    return _reduce(jnp.where(diff < beta, 0.5 * diff * diff / beta, diff - 0.5 * beta), reduction)


@lowers(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output: Array, self: Array, target: Array, reduction: int, beta: float) -> Array:
    diff = self - target
    slope = jnp.sign(diff) if beta == 0 else jnp.where(jnp.abs(diff) < beta, diff / beta, jnp.sign(diff))
    return _reduce_grad(slope * grad_output, reduction, self.size)


@lowers(aten.huber_loss.default)
def huber_loss(self: Array, target: Array, reduction: int = 1, delta: float = 1.0) -> Array:
    diff = jnp.abs(self - target)
    return _reduce(jnp.where(diff < delta, 0.5 * diff * diff, delta * (diff - 0.5 * delta)), reduction)


@lowers(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output: Array, self: Array, target: Array, reduction: int, delta: float) -> Array:
    slope = jnp.clip(self - target, -delta, delta)
    return _reduce_grad(slope * grad_output, reduction, self.size)


@lowers(aten.soft_margin_loss.default)
def soft_margin_loss(self: Array, target: Array, reduction: int = 1) -> Array:
    return _reduce(jnp.log1p(jnp.exp(-target * self)), reduction)


@lowers(aten.soft_margin_loss_backward.default)
def soft_margin_loss_backward(grad_output: Array, self: Array, target: Array, reduction: int) -> Array:
    z = jnp.exp(-target * self)
    return _reduce_grad(-target * z / (1.0 + z) * grad_output, reduction, self.size)


@lowers(aten.binary_cross_entropy.default)
def binary_cross_entropy(self: Array, target: Array, weight: Array | None = None, reduction: int = 1) -> Array:
    log_p = jnp.maximum(jnp.log(self), -100.0)
    log_q = jnp.maximum(jnp.log1p(-self), -100.0)
    loss = -(target * log_p + (1.0 - target) * log_q)
    return _reduce(loss if weight is None else loss * weight, reduction)


@lowers(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output: Array, self: Array, target: Array, weight: Array | None = None, reduction: int = 1) -> Array:
    grad = grad_output * (self - target) / jnp.maximum((1.0 - self) * self, 1e-12)
    return _reduce_grad(grad if weight is None else grad * weight, reduction, self.size)


@lowers(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(self: Array, target: Array, weight: Array | None = None, pos_weight: Array | None = None, reduction: int = 1) -> Array:
    log_sigmoid = jnp.minimum(self, 0) - jnp.log1p(jnp.exp(-jnp.abs(self)))
    if pos_weight is None:
        loss = (1.0 - target) * self - log_sigmoid
    else:
        loss = (1.0 - target) * self - ((pos_weight - 1.0) * target + 1.0) * log_sigmoid
    return _reduce(loss if weight is None else loss * weight, reduction)


@lowers(aten.multi_margin_loss.default)
def multi_margin_loss(self: Array, target: Array, p: object = 1, margin: object = 1, weight: Array | None = None, reduction: int = 1) -> Array:
    scores = self.reshape(1, -1) if self.ndim <= 1 else self
    labels = target.reshape(-1)
    picked = jnp.take_along_axis(scores, labels[:, None], axis=1)
    hinge = jnp.maximum(margin - picked + scores, 0.0)
    hinge = jnp.where(p == 2, hinge * hinge, hinge)
    if weight is not None:
        hinge = hinge * weight[labels][:, None]
    hinge = jnp.where(jnp.arange(scores.shape[1])[None, :] == labels[:, None], jnp.zeros_like(hinge), hinge)
    losses = jnp.sum(hinge, axis=1) / scores.shape[1]
    return _reduce(losses if self.ndim == 2 else losses.reshape(()), reduction)


# --- normalisation ------------------------------------------------------------------------------


@lowers(aten.native_layer_norm.default)
def native_layer_norm(input: Array, normalized_shape: Sequence[int], weight: Array | None, bias: Array | None, eps: float) -> tuple[Array, Array, Array]:  # noqa: A002
    x = _compute(input)
    dims = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    mean = jnp.mean(x, axis=dims, keepdims=True)
    centered = x - mean
    rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=dims, keepdims=True) + eps)
    out = centered * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


@lowers(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out: Array, input: Array, normalized_shape: Sequence[int], mean: Array, rstd: Array, weight: Array | None, bias: Array | None, output_mask: Sequence[bool]) -> tuple[Array | None, Array | None, Array | None]:  # noqa: A002
    x, grad = _compute(input), _compute(grad_out)
    axis = input.ndim - len(normalized_shape)
    norm_dims, batch_dims = tuple(range(axis, input.ndim)), tuple(range(axis))
    x_hat = (x - mean) * rstd
    scaled = grad if weight is None else grad * weight
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        grad_input = rstd * (
            scaled - jnp.mean(scaled, axis=norm_dims, keepdims=True) - x_hat * jnp.mean(scaled * x_hat, axis=norm_dims, keepdims=True)
        )
    if output_mask[1] and weight is not None:
        grad_weight = jnp.sum(grad * x_hat, axis=batch_dims)
    if output_mask[2] and bias is not None:
        grad_bias = jnp.sum(grad, axis=batch_dims)
    return grad_input, grad_weight, grad_bias


def _channel(v: Array, ndim: int) -> Array:
    """A per-channel vector shaped to broadcast over (N, C, ...)."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


@lowers(aten.native_group_norm.default)
def native_group_norm(input: Array, weight: Array | None, bias: Array | None, N: int, C: int, HxW: int, group: int, eps: float) -> tuple[Array, Array, Array]:  # noqa: A002, N803
    x = _compute(input).reshape(N, group, -1)
    mean = jnp.mean(x, axis=-1)
    centered = x - mean[..., None]
    rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=-1) + eps)
    out = (centered * rstd[..., None]).reshape(input.shape)
    if weight is not None:
        out = out * _channel(weight, input.ndim)
    if bias is not None:
        out = out + _channel(bias, input.ndim)
    return out, mean, rstd


@lowers(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out: Array, input: Array, mean: Array, rstd: Array, weight: Array | None, N: int, C: int, HxW: int, group: int, output_mask: Sequence[bool]) -> tuple[Array | None, Array | None, Array | None]:  # noqa: A002, N803
    x, grad = _compute(input).reshape(N, group, -1), _compute(grad_out)
    x_hat = (x - mean[..., None]) * rstd[..., None]
    scaled = grad if weight is None else grad * _channel(weight, input.ndim)
    scaled = scaled.reshape(N, group, -1)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        grad_input = rstd[..., None] * (
            scaled - jnp.mean(scaled, axis=-1, keepdims=True) - x_hat * jnp.mean(scaled * x_hat, axis=-1, keepdims=True)
        )
        grad_input = grad_input.reshape(input.shape)
    per_channel = grad.reshape(N, C, -1)
    if output_mask[1]:
        grad_weight = jnp.sum(per_channel * x_hat.reshape(N, C, -1), axis=(0, 2))
    if output_mask[2]:
        grad_bias = jnp.sum(per_channel, axis=(0, 2))
    return grad_input, grad_weight, grad_bias


def _batch_stats(x: Array) -> tuple[Array, Array]:
    dims = (0,) + tuple(range(2, x.ndim))
    mean = jnp.mean(x, axis=dims)
    centered = x - _channel(mean, x.ndim)
    return mean, jnp.mean(centered * centered, axis=dims)


def _batch_normalize(x: Array, mean: Array, invstd: Array, weight: Array | None, bias: Array | None) -> Array:
    out = (x - _channel(mean, x.ndim)) * _channel(invstd, x.ndim)
    if weight is not None:
        out = out * _channel(weight, x.ndim)
    if bias is not None:
        out = out + _channel(bias, x.ndim)
    return out


@lowers(aten._native_batch_norm_legit_no_training.default)
def batch_norm_no_training(input: Array, weight: Array | None, bias: Array | None, running_mean: Array, running_var: Array, momentum: float, eps: float) -> tuple[Array, Array, Array]:  # noqa: A002
    x = _compute(input)
    out = _batch_normalize(x, running_mean, jax.lax.rsqrt(running_var + eps), weight, bias)
    channels = input.shape[1]
    return out, jnp.zeros((channels,), x.dtype), jnp.zeros((channels,), x.dtype)


@lowers(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(input: Array, weight: Array | None, bias: Array | None, training: bool, momentum: float, eps: float) -> tuple[Array, Array, Array]:  # noqa: A002
    x = _compute(input)
    mean, var = _batch_stats(x)
    invstd = jax.lax.rsqrt(var + eps)
    return _batch_normalize(x, mean, invstd, weight, bias), mean, invstd


@lowers(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(input: Array, weight: Array | None, bias: Array | None, running_mean: Array, running_var: Array, training: bool, momentum: float, eps: float) -> tuple[Array, ...]:  # noqa: A002
    x = _compute(input)
    if not training:
        out, save_mean, save_invstd = batch_norm_no_training(input, weight, bias, running_mean, running_var, momentum, eps)
        return out, save_mean, save_invstd, running_mean, running_var
    mean, var = _batch_stats(x)
    invstd = jax.lax.rsqrt(var + eps)
    count = input.size // input.shape[1]
    unbiased = var * (count / max(count - 1, 1))
    new_mean = (1 - momentum) * running_mean + momentum * mean
    new_var = (1 - momentum) * running_var + momentum * unbiased
    return _batch_normalize(x, mean, invstd, weight, bias), mean, invstd, new_mean, new_var


@lowers(aten._batch_norm_no_update.default)
def batch_norm_no_update(input: Array, weight: Array | None, bias: Array | None, running_mean: Array | None, running_var: Array | None, momentum: float, eps: float) -> tuple[Array, Array, Array, Array]:  # noqa: A002
    if running_mean is None or running_var is None:
        out, mean, invstd = batch_norm_no_stats(input, weight, bias, True, momentum, eps)
    else:
        out, mean, invstd = batch_norm_no_training(input, weight, bias, running_mean, running_var, momentum, eps)
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8)


@lowers(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad_out: Array, input: Array, weight: Array | None, running_mean: Array | None, running_var: Array | None, save_mean: Array | None, save_invstd: Array | None, train: bool, eps: float, output_mask: Sequence[bool]) -> tuple[Array | None, Array | None, Array | None]:  # noqa: A002
    x, grad = _compute(input), _compute(grad_out)
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        mean, invstd = running_mean, jax.lax.rsqrt(running_var + eps)
    dims = (0,) + tuple(range(2, x.ndim))
    x_hat = (x - _channel(mean, x.ndim)) * _channel(invstd, x.ndim)
    scale = invstd if weight is None else weight * invstd
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if train:
            centered = grad - jnp.mean(grad, axis=dims, keepdims=True) - x_hat * jnp.mean(grad * x_hat, axis=dims, keepdims=True)
            grad_input = centered * _channel(scale, x.ndim)
        else:
            grad_input = grad * _channel(scale, x.ndim)
    if output_mask[1]:
        grad_weight = jnp.sum(grad * x_hat, axis=dims)
    if output_mask[2]:
        grad_bias = jnp.sum(grad, axis=dims)
    return grad_input, grad_weight, grad_bias


@lowers(aten.batch_norm_backward.default)
def batch_norm_backward(grad_out: Array, input: Array, weight: Array, running_mean: Array | None, running_var: Array | None, save_mean: Array | None, save_var: Array | None, update: bool, eps: float, output_mask: Sequence[bool], reserve: Array) -> tuple[Array | None, Array | None, Array | None]:  # noqa: A002
    return native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask)


@lowers(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output: Array, mask: Array, scale: float) -> Array:
    return grad_output * mask.astype(grad_output.dtype) * scale


# --- attention ----------------------------------------------------------------------------------


def _attention(query: Array, key: Array, value: Array, is_causal: bool, attn_mask: Array | None, scale: float | None) -> tuple[Array, Array]:
    q, k, v = _compute(query), _compute(key), _compute(value)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if k.ndim == q.ndim and q.ndim >= 3 and k.shape[-3] != q.shape[-3] and q.shape[-3] % k.shape[-3] == 0:
        repeats = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, repeats, axis=-3), jnp.repeat(v, repeats, axis=-3)
    scores = jnp.einsum("...qd,...kd->...qk", q, k, precision=PRECISION) * scale
    if is_causal:
        allowed = jnp.tril(jnp.ones((q.shape[-2], k.shape[-2]), jnp.bool_))
        scores = jnp.where(allowed, scores, -jnp.inf)
    if attn_mask is not None:
        scores = jnp.where(attn_mask, scores, -jnp.inf) if attn_mask.dtype == jnp.bool_ else scores + attn_mask
    peak = jnp.max(scores, axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, jnp.zeros_like(peak))
    exps = jnp.exp(scores - peak)
    total = jnp.sum(exps, axis=-1, keepdims=True)
    out = jnp.einsum("...qk,...kd->...qd", exps / total, v, precision=PRECISION)
    logsumexp = (jnp.log(total) + peak)[..., 0]
    return out, logsumexp


@lowers(aten._scaled_dot_product_flash_attention_for_cpu.default)
def sdpa_flash_for_cpu(query: Array, key: Array, value: Array, dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask: Array | None = None, scale: float | None = None) -> tuple[Array, Array]:
    if dropout_p > 0.0:
        raise UnloweredCase("attention dropout needs a random key")
    return _attention(query, key, value, is_causal, attn_mask, scale)


@lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def sdpa_flash_for_cpu_backward(grad_out: Array, query: Array, key: Array, value: Array, out: Array, logsumexp: Array, dropout_p: float, is_causal: bool, *, attn_mask: Array | None = None, scale: float | None = None) -> tuple[Array, Array, Array]:
    if dropout_p > 0.0:
        raise UnloweredCase("attention dropout needs a random key")

    def forward(q: Array, k: Array, v: Array) -> Array:
        return _attention(q, k, v, is_causal, attn_mask, scale)[0]

    _, pullback = jax.vjp(forward, _compute(query), _compute(key), _compute(value))
    return pullback(_compute(grad_out))


@lowers(aten._trilinear.default)
def trilinear(i1: Array, i2: Array, i3: Array, expand1: Sequence[int], expand2: Sequence[int], expand3: Sequence[int], sumdim: Sequence[int], unroll_dim: int = 1) -> Array:
    """i1, i2, i3 each unsqueezed at their `expand` dims, multiplied, and summed over `sumdim`."""
    product = jnp.expand_dims(i1, tuple(expand1)) * jnp.expand_dims(i2, tuple(expand2)) * jnp.expand_dims(i3, tuple(expand3))
    return jnp.sum(product, axis=tuple(sumdim)) if sumdim else product
