"""Activation functions and their backward ops, written out with torch's formulas (including which
side of a threshold the boundary point falls on). Formulas of more than one step run in float32 for
half-precision inputs and are rounded once (by the dispatcher), as torch's CPU and CUDA kernels do.
Where XLA would lose accuracy torch's CPU kernel keeps, the formula is rearranged: the normal CDF is
erfc(-x/sqrt(2))/2 (1 + erf(x/sqrt(2)) cancels in the lower tail), and a division by a constant,
which XLA may turn into a multiply by its rounded reciprocal, comes after the cancelling sum."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ._util import canon_dim, opmath, to_float
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def _zeros(x: Array) -> Array:
    return jnp.zeros_like(x)


@lowers(aten.relu.default)
def relu(self: Array) -> Array:
    return jnp.maximum(self, jnp.zeros((), self.dtype))


@lowers(aten.gelu.default)
def gelu(self: Array, *, approximate: str = "none") -> Array:
    x = to_float(self)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + jnp.tanh(_SQRT_2_OVER_PI * (x + _GELU_CUBIC * x**3)))
    return 0.5 * x * lax.erfc(-x / math.sqrt(2.0))


@lowers(aten.gelu_backward.default)
def gelu_backward(grad_output: Array, self: Array, *, approximate: str = "none") -> Array:
    grad_output, x = opmath(grad_output), opmath(self)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + _GELU_CUBIC * x**3)
        tanh_inner = jnp.tanh(inner)
        d_inner = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * x * x)
        return grad_output * (0.5 * (1.0 + tanh_inner) + 0.5 * x * (1.0 - tanh_inner**2) * d_inner)
    cdf = 0.5 * lax.erfc(-x / math.sqrt(2.0))
    pdf = jnp.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return grad_output * (cdf + x * pdf)


@lowers(aten.silu.default)
def silu(self: Array) -> Array:
    x = to_float(self)
    return x * jax.nn.sigmoid(x)


@lowers(aten.silu_backward.default)
def silu_backward(grad_output: Array, self: Array) -> Array:
    x = opmath(self)
    gate = jax.nn.sigmoid(x)
    return opmath(grad_output) * gate * (1.0 + x * (1.0 - gate))


@lowers(aten.mish.default)
def mish(self: Array) -> Array:
    x = to_float(self)
    return x * jnp.tanh(jax.nn.softplus(x))


@lowers(aten.mish_backward.default)
def mish_backward(grad_output: Array, self: Array) -> Array:
    x = opmath(self)
    tanh_softplus = jnp.tanh(jax.nn.softplus(x))
    return opmath(grad_output) * (tanh_softplus + x * jax.nn.sigmoid(x) * (1.0 - tanh_softplus * tanh_softplus))


@lowers(aten.hardswish.default)
def hardswish(self: Array) -> Array:
    x = opmath(self)
    return x * jnp.clip(x + 3.0, 0.0, 6.0) / 6.0


@lowers(aten.hardswish_backward.default)
def hardswish_backward(grad_output: Array, self: Array) -> Array:
    middle = opmath(grad_output) * ((opmath(self) + 1.5) / 3.0)
    return jnp.where(self <= -3.0, _zeros(grad_output), jnp.where(self < 3.0, middle, grad_output))


@lowers(aten.hardsigmoid.default)
def hardsigmoid(self: Array) -> Array:
    return jnp.clip(opmath(self) + 3.0, 0.0, 6.0) / 6.0


@lowers(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad_output: Array, self: Array) -> Array:
    return jnp.where((self > -3.0) & (self < 3.0), grad_output / 6.0, _zeros(grad_output))


@lowers(aten.elu.default)
def elu(self: Array, alpha: object = 1, scale: object = 1, input_scale: object = 1) -> Array:
    x = opmath(self)
    negative = alpha * scale * jnp.expm1(x * input_scale)
    return jnp.where(x > 0, x * scale, negative)


@lowers(aten.elu_backward.default)
def elu_backward(grad_output: Array, alpha: object, scale: object, input_scale: object, is_result: bool, self_or_result: Array) -> Array:
    grad_output, x = opmath(grad_output), opmath(self_or_result)
    if is_result:
        negative = grad_output * input_scale * (x + alpha * scale)
    else:
        negative = grad_output * input_scale * alpha * scale * jnp.exp(x * input_scale)
    return jnp.where(x <= 0, negative, grad_output * scale)


@lowers(aten.celu.default)
def celu(self: Array, alpha: object = 1.0) -> Array:
    x = opmath(self)
    return jnp.where(x > 0, x, alpha * jnp.expm1(x / alpha))


@lowers(aten.leaky_relu.default)
def leaky_relu(self: Array, negative_slope: object = 0.01) -> Array:
    return jnp.where(self > 0, self, self * negative_slope)


@lowers(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad_output: Array, self: Array, negative_slope: object, self_is_result: bool) -> Array:
    return jnp.where(self > 0, grad_output, grad_output * negative_slope)


@lowers(aten.softplus.default)
def softplus(self: Array, beta: object = 1, threshold: object = 20) -> Array:
    """In float32 at least (torch's opmath): exp overflows float16 from 11.1 on."""
    x = to_float(self)
    scaled = x * beta
    return jnp.where(scaled > threshold, x, jnp.log1p(jnp.exp(scaled)) / beta).astype(self.dtype)


@lowers(aten.softplus_backward.default)
def softplus_backward(grad_output: Array, self: Array, beta: object, threshold: object) -> Array:
    grad, scaled = to_float(grad_output), to_float(self) * beta
    z = jnp.exp(scaled)
    return jnp.where(scaled > threshold, grad, grad * z / (z + 1.0)).astype(grad_output.dtype)


@lowers(aten.hardtanh.default)
def hardtanh(self: Array, min_val: object = -1, max_val: object = 1) -> Array:
    return jnp.minimum(jnp.maximum(self, min_val), max_val)


@lowers(aten.hardtanh_backward.default)
def hardtanh_backward(grad_output: Array, self: Array, min_val: object, max_val: object) -> Array:
    return jnp.where((self <= min_val) | (self >= max_val), _zeros(grad_output), grad_output)


@lowers(aten.threshold.default)
def threshold(self: Array, threshold: object, value: object) -> Array:
    return jnp.where(self <= threshold, jnp.asarray(value).astype(self.dtype), self)


@lowers(aten.threshold_backward.default)
def threshold_backward(grad_output: Array, self: Array, threshold: object) -> Array:
    return jnp.where(self <= threshold, _zeros(grad_output), grad_output)


@lowers(aten._prelu_kernel.default)
def prelu_kernel(self: Array, weight: Array) -> Array:
    return jnp.where(self > 0, self, weight * self)


@lowers(aten._prelu_kernel_backward.default)
def prelu_kernel_backward(grad_output: Array, self: Array, weight: Array) -> tuple[Array, Array]:
    positive = self > 0
    grad_input = jnp.where(positive, grad_output, weight * grad_output)
    grad_weight = jnp.where(positive, _zeros(grad_output), self * grad_output)
    return grad_input, grad_weight


@lowers(aten.glu.default)
def glu(self: Array, dim: int = -1) -> Array:
    first, second = jnp.split(opmath(self), 2, axis=canon_dim(dim, self.ndim))
    return first * jax.nn.sigmoid(second)


@lowers(aten.glu_backward.default)
def glu_backward(grad_output: Array, self: Array, dim: int) -> Array:
    axis = canon_dim(dim, self.ndim)
    grad_output = opmath(grad_output)
    first, second = jnp.split(opmath(self), 2, axis=axis)
    gate = jax.nn.sigmoid(second)
    return jnp.concatenate([grad_output * gate, grad_output * first * gate * (1.0 - gate)], axis=axis)


@lowers(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(self: Array) -> tuple[Array, Array]:
    x = opmath(self)
    buffer = jnp.exp(-jnp.abs(x))
    return jnp.minimum(x, 0) - jnp.log1p(buffer), buffer


@lowers(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad_output: Array, self: Array, buffer: Array) -> Array:
    return opmath(grad_output) * jax.nn.sigmoid(-opmath(self))


@lowers(aten.softshrink.default)
def softshrink(self: Array, lambd: object = 0.5) -> Array:
    return jnp.where(self > lambd, self - lambd, jnp.where(self < -lambd, self + lambd, _zeros(self)))


@lowers(aten.softshrink_backward.default)
def softshrink_backward(grad_output: Array, self: Array, lambd: object) -> Array:
    return jnp.where((self >= -lambd) & (self <= lambd), _zeros(grad_output), grad_output)


@lowers(aten.hardshrink.default)
def hardshrink(self: Array, lambd: object = 0.5) -> Array:
    return jnp.where((self >= -lambd) & (self <= lambd), _zeros(self), self)


@lowers(aten.hardshrink_backward.default)
def hardshrink_backward(grad_out: Array, self: Array, lambd: object) -> Array:
    return jnp.where((self >= -lambd) & (self <= lambd), _zeros(grad_out), grad_out)


@lowers(aten.logit_backward.default)
def logit_backward(grad_output: Array, self: Array, eps: float | None = None) -> Array:
    grad_output, self = opmath(grad_output), opmath(self)
    gradient = grad_output / (self * (1.0 - self))
    if eps is None:
        return jnp.where((self < 0) | (self > 1), jnp.full_like(gradient, jnp.nan), gradient)
    return jnp.where((self < eps) | (self > 1.0 - eps), _zeros(gradient), gradient)
