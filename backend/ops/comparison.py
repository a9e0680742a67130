"""Comparisons, logical and bitwise ops, and selection: where, clamp, masked_fill, fill, copy.

Shifts follow torch for out-of-range amounts (a left shift by the bit width or more gives 0, a right
shift the sign); clamp applies min then max, so min > max gives max, and NaN propagates from the
input and from either bound.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ._util import in_result_type, is_complex
from .pointwise import promote
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


# --- comparisons, logical and bitwise ops ----------------------------------------------------------

def _comparison(fn):
    def lowering(self: Array, other: Array) -> Array:
        return fn(*in_result_type(self, other))

    lowering.__qualname__ = f"comparison[{fn.__name__}]"
    return lowering


for _name, _fn in (("eq", jnp.equal), ("ne", jnp.not_equal), ("lt", jnp.less), ("le", jnp.less_equal),
                   ("gt", jnp.greater), ("ge", jnp.greater_equal)):
    _packet = getattr(aten, _name)
    lowers(_packet.Tensor, _packet.Scalar)(_comparison(_fn))


def _logical(fn):
    def lowering(self: Array, other: Array) -> Array:
        return fn(self != 0, other != 0)

    lowering.__qualname__ = f"logical[{fn.__name__}]"
    return lowering


lowers(aten.logical_and.default)(_logical(jnp.logical_and))
lowers(aten.logical_or.default)(_logical(jnp.logical_or))
lowers(aten.logical_xor.default)(_logical(jnp.logical_xor))

lowers(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor)(jnp.bitwise_and)
lowers(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor)(jnp.bitwise_or)
lowers(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor)(jnp.bitwise_xor)


def _shift(a: object, b: object, left: bool) -> Array:
    a, b = promote(a, b)
    bits = jnp.iinfo(a.dtype).bits
    out_of_range = (b < 0) | (b >= bits)
    safe = jnp.where(out_of_range, 0, b)
    if left:
        return jnp.where(out_of_range, jnp.zeros_like(a), jnp.left_shift(a, safe))
    # Shifted past its width, a signed value is all sign bits; an unsigned one is 0.
    past_width = jnp.right_shift(a, bits - 1) if jnp.issubdtype(a.dtype, jnp.signedinteger) else jnp.zeros_like(a)
    return jnp.where(out_of_range, past_width, jnp.right_shift(a, safe))


@lowers(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
        aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar)
def left_shift(self: Array, other: Array) -> Array:
    return _shift(self, other, left=True)


@lowers(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
        aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar)
def right_shift(self: Array, other: Array) -> Array:
    return _shift(self, other, left=False)


# --- selection, clamping, filling ------------------------------------------------------------------


@lowers(aten.where.self)
def where(condition: Array, self: Array, other: Array) -> Array:
    return jnp.where(condition.astype(jnp.bool_), self, other)


@lowers(aten.clamp.default, aten.clamp.Tensor)
def clamp(self: Array, min: Array | None = None, max: Array | None = None) -> Array:  # noqa: A002
    result, *bounds = in_result_type(self, *(bound for bound in (min, max) if bound is not None))
    if min is not None:
        result = jnp.maximum(result, bounds.pop(0))
    if max is not None:
        result = jnp.minimum(result, bounds.pop(0))
    return result


@lowers(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(self: Array, min: Array) -> Array:  # noqa: A002
    return jnp.maximum(*in_result_type(self, min))


@lowers(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(self: Array, max: Array) -> Array:  # noqa: A002
    return jnp.minimum(*in_result_type(self, max))


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(self: Array, mask: Array, value: Array) -> Array:
    return jnp.where(mask.astype(jnp.bool_), jnp.asarray(value).astype(self.dtype), self)


@lowers(aten.fill.Scalar, aten.fill.Tensor)
def fill(self: Array, value: Array) -> Array:
    return jnp.broadcast_to(jnp.asarray(value).astype(self.dtype), self.shape)


@lowers(aten.zero.default)
def zero(self: Array) -> Array:
    return jnp.zeros_like(self)


@lowers(aten.clone.default)
def clone(self: Array, *, memory_format: object = None) -> Array:
    return self


@lowers(aten.copy.default)
def copy(self: Array, src: Array, non_blocking: bool = False) -> Array:
    if is_complex(src) and not is_complex(self):
        src = jnp.real(src)
    return jnp.broadcast_to(src.astype(self.dtype), self.shape)


@lowers(aten.complex.default)
def complex_(real: Array, imag: Array) -> Array:
    return lax.complex(*jnp.broadcast_arrays(real, imag))


@lowers(aten.polar.default)
def polar(abs: Array, angle: Array) -> Array:  # noqa: A002
    return lax.complex(abs * jnp.cos(angle), abs * jnp.sin(angle))


@lowers(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def isin(elements: Array, test_elements: Array, *, assume_unique: bool = False, invert: bool = False) -> Array:
    elements, test_elements = jnp.asarray(elements), jnp.asarray(test_elements)
    found = jnp.any(elements[..., None] == test_elements.reshape(-1), axis=-1)
    return jnp.logical_not(found) if invert else found


@lowers(aten.sigmoid_backward.default)
def sigmoid_backward(grad_output: Array, output: Array) -> Array:
    return grad_output * output * (1 - output)


@lowers(aten.tanh_backward.default)
def tanh_backward(grad_output: Array, output: Array) -> Array:
    return grad_output * (1 - output * output)
