"""`torch.ops.prims` elementwise ops: torch's reference implementations (`torch._refs`, used by some
decompositions and by forward-mode AD) call them on tpu tensors. Inputs of a binary prim already
share shape and dtype, so each is the plain `jax.numpy` function; the dispatcher casts to the dtype
torch's meta kernel gives."""

from __future__ import annotations

from types import ModuleType

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tputrace.backend.compat import import_hooks
from tputrace.backend.core.dtypes import cast

from ._util import jax_dtype
from .registry import lowers

prims = torch.ops.prims
Array = jax.Array

_ELEMENTWISE = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "maximum": jnp.maximum, "minimum": jnp.minimum,
    "pow": jnp.power, "atan2": jnp.arctan2, "fmod": jnp.fmod, "eq": jnp.equal, "ne": jnp.not_equal,
    "lt": jnp.less, "le": jnp.less_equal, "gt": jnp.greater, "ge": jnp.greater_equal,
    "bitwise_and": jnp.bitwise_and, "bitwise_or": jnp.bitwise_or, "bitwise_xor": jnp.bitwise_xor,
    "neg": jnp.negative, "abs": jnp.abs, "sign": jnp.sign, "exp": jnp.exp, "expm1": jnp.expm1, "log": jnp.log,
    "log1p": jnp.log1p, "log2": jnp.log2, "log10": jnp.log10, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt,
    "reciprocal": jnp.reciprocal, "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "tanh": jnp.tanh,
    "sinh": jnp.sinh, "cosh": jnp.cosh, "asin": jnp.arcsin, "acos": jnp.arccos, "atan": jnp.arctan,
    "floor": jnp.floor, "ceil": jnp.ceil, "trunc": jnp.trunc, "bitwise_not": jnp.invert, "isfinite": jnp.isfinite,
    "erf": jax.scipy.special.erf, "erfc": jax.scipy.special.erfc,
}

for _name, _fn in _ELEMENTWISE.items():
    lowers(getattr(prims, _name).default)(_fn)


@lowers(prims.div.default)
def div(self: Array, other: Array) -> Array:
    """True division for floats; for integers, division rounded toward zero (C's, as the prim defines)."""
    if jnp.issubdtype(self.dtype, jnp.integer):
        return lax.div(self, other)
    return jnp.divide(self, other)


@lowers(prims.where.default)
def where(pred: Array, a: Array, b: Array) -> Array:
    return jnp.where(pred, a, b)


@lowers(prims.convert_element_type.default)
def convert_element_type(a: Array, dtype: torch.dtype) -> Array:
    return cast(a, jax_dtype(dtype))


def fma(a: Array, b: Array, c: Array) -> Array:
    return a * b + c


def _lower_fma(inductor_prims: ModuleType) -> None:
    """`prims.fma`, which Dynamo writes for `addcmul_`/`addcdiv_` with a `value` and `add_` with a
    tensor `alpha` (every compiled optimizer step, whatever the backend); the op exists once
    Inductor's prims module, which Dynamo imports, is loaded."""
    lowers(prims.fma.default)(fma)


import_hooks.when_imported("torch._inductor.inductor_prims", _lower_fma)
