"""Elementwise arithmetic, math functions, comparisons, logical and bitwise ops.

Type promotion is left to JAX (the dispatcher casts every result to the dtype torch's meta kernel
gives), but values follow torch: integer division and remainder rules, NaN handling of `sign`,
`clamp`, `maximum`, and integer powers with negative exponents.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ._util import DEFAULT_FLOAT, is_complex, is_float, is_integral, opmath, to_float, in_result_type
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _scaled(value: Array, alpha: object) -> Array:
    """alpha * value, skipping the multiply for the default alpha of 1."""
    if type(alpha) is int and alpha == 1:
        return value
    return alpha * value


# --- unary functions that produce floats (integer inputs compute in float32, like torch) ---------

_FLOAT_UNARY = {
    aten.exp.default: jnp.exp,
    aten.exp2.default: jnp.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.log1p.default: jnp.log1p,
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: jnp.arctanh,
    aten.sigmoid.default: jax.nn.sigmoid,
    aten.reciprocal.default: jnp.reciprocal,
    aten.deg2rad.default: jnp.deg2rad,
    aten.rad2deg.default: jnp.rad2deg,
    aten.sinc.default: jnp.sinc,
    aten.erf.default: lax.erf,
    aten.erfc.default: lax.erfc,
    aten.erfinv.default: lax.erf_inv,
    aten.lgamma.default: lax.lgamma,
}


def _float_unary(fn):
    def lowering(self: Array) -> Array:
        return fn(to_float(self))

    lowering.__qualname__ = f"float_unary[{fn.__name__}]"
    return lowering


# Unary lowerings by ATen name, for the `_foreach_*` family to reuse.
LOWERING_OF: dict[str, object] = {}

for _op, _fn in _FLOAT_UNARY.items():
    LOWERING_OF[_op.__name__.split(".")[0]] = lowers(_op)(_float_unary(_fn))


# --- unary functions that keep the input dtype ----------------------------------------------------


@lowers(aten.abs.default)
def abs_(self: Array) -> Array:
    return jnp.abs(self) if self.dtype != jnp.bool_ else self


@lowers(aten.neg.default, aten._neg_view.default)
def neg(self: Array) -> Array:
    return jnp.negative(self)


def _rounding(fn):
    def lowering(self: Array) -> Array:
        return self if is_integral(self) else fn(self)

    lowering.__qualname__ = f"rounding[{fn.__name__}]"
    return lowering


LOWERING_OF["ceil"] = lowers(aten.ceil.default)(_rounding(jnp.ceil))
LOWERING_OF["floor"] = lowers(aten.floor.default)(_rounding(jnp.floor))
LOWERING_OF["trunc"] = lowers(aten.trunc.default)(_rounding(jnp.trunc))
LOWERING_OF["round"] = lowers(aten.round.default)(_rounding(jnp.round))  # half to even, as torch


@lowers(aten.round.decimals)
def round_decimals(self: Array, *, decimals: int = 0) -> Array:
    if is_integral(self):
        return self
    if decimals >= 0:
        scale = 10.0**decimals
        return jnp.round(self * scale) / scale
    scale = 10.0 ** (-decimals)
    return jnp.round(self / scale) * scale


@lowers(aten.frac.default)
def frac(self: Array) -> Array:
    return self - jnp.trunc(self)


@lowers(aten.sign.default)
def sign(self: Array) -> Array:
    if self.dtype == jnp.bool_:
        return self
    result = jnp.sign(self)
    return jnp.where(jnp.isnan(self), jnp.zeros_like(result), result) if is_float(self) else result


@lowers(aten.sgn.default)
def sgn(self: Array) -> Array:
    if not is_complex(self):
        return sign(self)
    magnitude = jnp.abs(self)
    safe = jnp.where(magnitude == 0, jnp.ones_like(magnitude), magnitude)
    return jnp.where(magnitude == 0, jnp.zeros_like(self), self / safe)


@lowers(aten.signbit.default)
def signbit(self: Array) -> Array:
    return jnp.signbit(self) if is_float(self) else self < 0


@lowers(aten.angle.default)
def angle(self: Array) -> Array:
    if is_complex(self):
        return jnp.angle(self)
    x = to_float(self)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(math.pi, x.dtype), jnp.zeros_like(x)))


@lowers(aten.isnan.default)
def isnan(self: Array) -> Array:
    return jnp.isnan(self) if is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@lowers(aten.isinf.default)
def isinf(self: Array) -> Array:
    return jnp.isinf(self) if is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@lowers(aten.isposinf.default)
def isposinf(self: Array) -> Array:
    return jnp.isposinf(self) if is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@lowers(aten.isneginf.default)
def isneginf(self: Array) -> Array:
    return jnp.isneginf(self) if is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@lowers(aten.nan_to_num.default)
def nan_to_num(self: Array, nan: float | None = None, posinf: float | None = None, neginf: float | None = None) -> Array:
    if not is_float(self):
        return self
    return jnp.nan_to_num(self, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


@lowers(aten.logit.default)
def logit(self: Array, eps: float | None = None) -> Array:
    x = to_float(self)
    if eps is not None:
        x = jnp.clip(x, eps, 1.0 - eps)
    return jnp.log(x / (1.0 - x))


@lowers(aten.bitwise_not.default)
def bitwise_not(self: Array) -> Array:
    return jnp.logical_not(self) if self.dtype == jnp.bool_ else jnp.invert(self)


@lowers(aten.logical_not.default)
def logical_not(self: Array) -> Array:
    return self == 0


@lowers(aten._conj_physical.default, aten._conj.default)
def conj(self: Array) -> Array:
    return jnp.conj(self) if is_complex(self) else self


# --- binary arithmetic -----------------------------------------------------------------------------


@lowers(aten.add.Tensor, aten.add.Scalar)
def add(self: Array, other: Array, *, alpha: object = 1) -> Array:
    return opmath(self) + _scaled(opmath(other), alpha)


@lowers(aten.sub.Tensor, aten.sub.Scalar)
def sub(self: Array, other: Array, *, alpha: object = 1) -> Array:
    if self.dtype == jnp.bool_:
        raise TypeError("Subtraction, the `-` operator, with a bool tensor is not supported.")
    return opmath(self) - _scaled(opmath(other), alpha)


@lowers(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(self: Array, other: Array, alpha: object = 1) -> Array:
    return opmath(other) - _scaled(opmath(self), alpha)


@lowers(aten.mul.Tensor, aten.mul.Scalar)
def mul(self: Array, other: Array) -> Array:
    return opmath(self) * opmath(other)


def _float_divide(a: Array, b: Array) -> Array:
    a, b = opmath(a), opmath(b)
    if not jnp.issubdtype(jnp.result_type(a, b), jnp.inexact):
        a = jnp.asarray(a).astype(DEFAULT_FLOAT)
    return jnp.true_divide(a, b)


def _floor_divide_float(a: Array, b: Array) -> Array:
    """torch's floor division for floats: exact quotient of a - fmod(a, b), rounded like Python."""
    mod = lax.rem(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floor_div = jnp.floor(div)
    floor_div = jnp.where(div - floor_div > 0.5, floor_div + 1, floor_div)
    floor_div = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floor_div)
    return jnp.where(b == 0, a / b, floor_div)


def promote(a: object, b: object) -> tuple[Array, Array]:
    """a and b in torch's common dtype (`torch_result_type`), broadcast to one shape (lax ops need both)."""
    return tuple(jnp.broadcast_arrays(*in_result_type(a, b)))


def _divide(self: object, other: object, rounding_mode: str | None) -> Array:
    if rounding_mode is None:
        return _float_divide(self, other)
    a, b = promote(self, other)
    if a.dtype == jnp.bool_:
        a, b = a.astype(jnp.int64), b.astype(jnp.int64)
    if rounding_mode == "trunc":
        return lax.div(a, b) if is_integral(a) else jnp.trunc(a / b)
    if rounding_mode == "floor":
        return jnp.floor_divide(a, b) if is_integral(a) else _floor_divide_float(a, b)
    raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'")


@lowers(aten.div.Tensor, aten.div.Scalar)
def div(self: Array, other: Array) -> Array:
    return _divide(self, other, None)


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(self: Array, other: Array, *, rounding_mode: str | None) -> Array:
    return _divide(self, other, rounding_mode)


@lowers(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(self: Array, other: Array) -> Array:
    return _divide(self, other, "floor")


@lowers(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(self: Array, other: Array) -> Array:
    a, b = promote(self, other)
    mod = lax.rem(a, b)
    return jnp.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


@lowers(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(self: Array, other: Array) -> Array:
    a, b = promote(self, other)
    return lax.rem(a, b)


def _int_power(base: Array, exponent: Array) -> Array:
    """Integer powers as torch computes them: negative exponents give 0 unless |base| is 1."""
    base, exponent = jnp.broadcast_arrays(*promote(base, exponent))
    positive = jnp.maximum(exponent, 0)
    result = jnp.ones_like(base)
    square = base
    for _ in range(jnp.iinfo(base.dtype).bits):
        result = jnp.where((positive & 1) == 1, result * square, result)
        square = square * square
        positive = positive >> 1
    odd = (exponent & 1) == 1
    negative_power = jnp.where(base == 1, 1, jnp.where(base == -1, jnp.where(odd, -1, 1), 0)).astype(base.dtype)
    return jnp.where(exponent < 0, negative_power, result)


@lowers(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(self: Array, exponent: Array) -> Array:
    a, b = jnp.asarray(self), jnp.asarray(exponent)
    if jnp.result_type(self, exponent) == jnp.bool_:
        a, b = a.astype(jnp.int64), b.astype(jnp.int64)
    if jnp.issubdtype(jnp.result_type(a, b), jnp.integer):
        return _int_power(a, b)
    return jnp.power(opmath(self), opmath(exponent))


@lowers(aten.atan2.default)
def atan2(self: Array, other: Array) -> Array:
    return jnp.arctan2(to_float(self), to_float(other))


@lowers(aten.hypot.default)
def hypot(self: Array, other: Array) -> Array:
    return jnp.hypot(opmath(self), opmath(other))


@lowers(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(self: Array, other: Array) -> Array:
    return jnp.copysign(to_float(self), to_float(jnp.asarray(other)))


@lowers(aten.nextafter.default)
def nextafter(self: Array, other: Array) -> Array:
    return jnp.nextafter(self, other)


@lowers(aten.logaddexp.default)
def logaddexp(self: Array, other: Array) -> Array:
    return jnp.logaddexp(to_float(self), to_float(other))


@lowers(aten.logaddexp2.default)
def logaddexp2(self: Array, other: Array) -> Array:
    return jnp.logaddexp2(to_float(self), to_float(other))


@lowers(aten.ldexp.Tensor)
def ldexp(self: Array, other: Array) -> Array:
    return to_float(self) * jnp.exp2(to_float(other))


@lowers(aten.heaviside.default)
def heaviside(self: Array, values: Array) -> Array:
    return jnp.where(self == 0, values, (self > 0).astype(values.dtype))


@lowers(aten.gcd.default)
def gcd(self: Array, other: Array) -> Array:
    return jnp.gcd(self, other)


@lowers(aten.lcm.default)
def lcm(self: Array, other: Array) -> Array:
    return jnp.lcm(self, other)


def _xlog(log_fn):
    def lowering(self: Array, other: Array) -> Array:
        x, y = to_float(jnp.asarray(self)), to_float(jnp.asarray(other))
        product = jnp.where(x == 0, jnp.zeros_like(x * y), x * log_fn(y))
        return jnp.where(jnp.isnan(y), y * jnp.ones_like(x), product)

    lowering.__qualname__ = f"xlog[{log_fn.__name__}]"
    return lowering


lowers(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)(_xlog(jnp.log))
lowers(aten.special_xlog1py.default, aten.special_xlog1py.self_scalar, aten.special_xlog1py.other_scalar)(
    _xlog(jnp.log1p)
)


@lowers(aten.maximum.default)
def maximum(self: Array, other: Array) -> Array:
    return jnp.maximum(*in_result_type(self, other))


@lowers(aten.minimum.default)
def minimum(self: Array, other: Array) -> Array:
    return jnp.minimum(*in_result_type(self, other))


@lowers(aten.fmax.default)
def fmax(self: Array, other: Array) -> Array:
    return jnp.fmax(*in_result_type(self, other))


@lowers(aten.fmin.default)
def fmin(self: Array, other: Array) -> Array:
    return jnp.fmin(*in_result_type(self, other))


@lowers(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(self: Array, end: Array, weight: Array) -> Array:
    self, end, weight = opmath(self), opmath(end), opmath(jnp.asarray(weight))
    small = self + weight * (end - self)
    large = end - (end - self) * (1 - weight)
    return jnp.where(jnp.abs(weight) < 0.5, small, large)


@lowers(aten.addcmul.default)
def addcmul(self: Array, tensor1: Array, tensor2: Array, *, value: object = 1) -> Array:
    return opmath(self) + _scaled(opmath(tensor1) * opmath(tensor2), value)


@lowers(aten.addcdiv.default)
def addcdiv(self: Array, tensor1: Array, tensor2: Array, *, value: object = 1) -> Array:
    return opmath(self) + _scaled(opmath(tensor1) / opmath(tensor2), value)
