"""Layer, group and batch normalisation, forward and backward.

Statistics are computed in float32 for half-precision inputs. Backward ops use the saved statistics
they are given, so they agree with a forward that ran elsewhere. `native_batch_norm` is not lowered:
in training it updates the running statistics in place although its schema does not declare the
write, so it runs as torch's decomposition, whose `copy_` into the running statistics reaches the
device. Eval-mode saved statistics follow torch's meta kernel (shape (C,)), not its CPU kernel (empty).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import torch

from ._util import to_float
from .ordering import computed_after
from .reduction import vector_norm
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array

@lowers(aten.native_layer_norm.default)
def native_layer_norm(input: Array, normalized_shape: Sequence[int], weight: Array | None, bias: Array | None, eps: float) -> tuple[Array, Array, Array]:  # noqa: A002
    x = to_float(input)
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
    x, grad = to_float(input), to_float(grad_out)
    axis = input.ndim - len(normalized_shape)
    norm_dims, batch_dims = tuple(range(axis, input.ndim)), tuple(range(axis))
    x_hat = (computed_after(x, grad) - mean) * rstd
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
    x = to_float(input).reshape(N, group, -1)
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
    x, grad = to_float(input).reshape(N, group, -1), to_float(grad_out)
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
    x = to_float(input)
    out = _batch_normalize(x, running_mean, jax.lax.rsqrt(running_var + eps), weight, bias)
    channels = input.shape[1]
    return out, jnp.zeros((channels,), x.dtype), jnp.zeros((channels,), x.dtype)


@lowers(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(input: Array, weight: Array | None, bias: Array | None, training: bool, momentum: float, eps: float) -> tuple[Array, Array, Array]:  # noqa: A002
    x = to_float(input)
    mean, var = _batch_stats(x)
    invstd = jax.lax.rsqrt(var + eps)
    return _batch_normalize(x, mean, invstd, weight, bias), mean, invstd


@lowers(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(input: Array, weight: Array | None, bias: Array | None, running_mean: Array, running_var: Array, training: bool, momentum: float, eps: float) -> tuple[Array, ...]:  # noqa: A002
    x = to_float(input)
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
    x, grad = to_float(input), to_float(grad_out)
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


# ----------------------------------------------------------------- SyncBatchNorm's pieces (CUDA's kernels)
def _reduced_dims(x: Array) -> tuple[int, ...]:
    return (0,) + tuple(range(2, x.ndim))


@lowers(aten.batch_norm_stats.default)
def batch_norm_stats(input: Array, eps: float) -> tuple[Array, Array]:  # noqa: A002
    """This rank's per-channel mean and 1 / sqrt(biased variance + eps), in float32 for half inputs."""
    mean, var = _batch_stats(to_float(input))
    return mean, jax.lax.rsqrt(var + eps)


@lowers(aten.batch_norm_elemt.default)
def batch_norm_elemt(input: Array, weight: Array | None, bias: Array | None, mean: Array, invstd: Array, eps: float) -> Array:  # noqa: A002
    return _batch_normalize(to_float(input), mean, invstd, weight, bias).astype(input.dtype)


@lowers(aten.batch_norm_backward_reduce.default)
def batch_norm_backward_reduce(
    grad_out: Array, input: Array, mean: Array, invstd: Array, weight: Array | None, input_g: bool, weight_g: bool, bias_g: bool  # noqa: A002
) -> tuple[Array | None, Array | None, Array | None, Array | None]:
    """This rank's sums of dy and dy * (x - mean) per channel, and its weight and bias gradients."""
    x, grad = to_float(input), to_float(grad_out)
    dims = _reduced_dims(x)
    sum_dy = jnp.sum(grad, axis=dims)
    sum_dy_xmu = jnp.sum(grad * (x - _channel(mean, x.ndim)), axis=dims)
    param_dtype = input.dtype if weight is None else weight.dtype
    return (
        sum_dy.astype(mean.dtype) if input_g else None,
        sum_dy_xmu.astype(mean.dtype) if input_g else None,
        (sum_dy_xmu * invstd).astype(param_dtype) if weight_g else None,
        sum_dy.astype(param_dtype) if bias_g else None,
    )


@lowers(aten.batch_norm_backward_elemt.default)
def batch_norm_backward_elemt(
    grad_out: Array, input: Array, mean: Array, invstd: Array, weight: Array | None, sum_dy: Array, sum_dy_xmu: Array, count: Array  # noqa: A002
) -> Array:
    """The input gradient from the sums every rank's `batch_norm_backward_reduce` gave, all-reduced."""
    x, grad = to_float(input), to_float(grad_out)
    total = jnp.sum(count.astype(jnp.float32))
    mean_dy, mean_dy_xmu = sum_dy / total, sum_dy_xmu / total
    scale = invstd if weight is None else invstd * weight
    centered = (x - _channel(mean, x.ndim)) * _channel(invstd * invstd * mean_dy_xmu, x.ndim)
    return ((grad - _channel(mean_dy, x.ndim) - centered) * _channel(scale, x.ndim)).astype(input.dtype)


def _weight_norm(v: Array, g: Array, dim: int) -> Array:
    """w = g * v / ||v||, the norm over every dimension but `dim` (torch's `_weight_norm_interface`)."""
    norm = vector_norm(to_float(v), 2, tuple(axis for axis in range(v.ndim) if axis != dim), True)
    return v * (g / norm.astype(g.dtype))


@lowers(aten._weight_norm_interface_backward.default)
def weight_norm_interface_backward(grad_w: Array, saved_v: Array, saved_g: Array, saved_norms: Array, dim: int) -> tuple[Array, Array]:
    _, pullback = jax.vjp(lambda v, g: _weight_norm(v, g, dim), saved_v, saved_g)
    return pullback(grad_w)
