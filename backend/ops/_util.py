"""Small helpers shared by the lowering families: dims, dtypes, and torch's argument conventions."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from tputrace.backend.core.dtypes import to_jax, to_torch

# Full float32 precision, for products outside torch's float32 matmul precision setting (linear algebra,
# resampling weights, float8 scaled products): XLA's default may use bf16 passes on TPU or TF32 on GPU.
PRECISION = lax.Precision.HIGHEST

DEFAULT_FLOAT = jnp.float32


class UnloweredCase(NotImplementedError):
    """A lowering met arguments it cannot trace (e.g. a data-dependent output shape)."""


def torch_result_type(*operands: object) -> jnp.dtype:
    """The dtype torch computes these operands in: dim tensors lead, 0-dim tensors and Python numbers
    (weakly typed in a trace) count only with a higher category (bool < integer < float < complex), so
    `uint8_tensor > torch.tensor(-1)` compares in uint8 and `x == torch.tensor(0.1, dtype=torch.float64)`
    in x's float32, where JAX's promotion would widen both to 64 bits."""
    stand_ins = [_promotion_stand_in(operand) for operand in operands]
    _, result = elementwise_dtypes(*stand_ins, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return to_jax(torch.complex64 if result == torch.complex32 else result)  # no complex32 on the chip


def in_result_type(*operands: object) -> list[jax.Array]:
    """The operands cast to `torch_result_type`, as torch casts them before computing."""
    dtype = torch_result_type(*operands)
    return [jnp.asarray(operand).astype(dtype) for operand in operands]


def _promotion_stand_in(operand: object) -> object:
    """A torch value that promotes as `operand` does: a Python number for a weakly typed value, an
    empty tensor of its dtype and rank (0-dim or not) otherwise."""
    aval = jax.typeof(operand)
    if aval.weak_type:
        return {"b": True, "i": 1, "u": 1, "f": 1.0, "c": 1j}[jnp.dtype(aval.dtype).kind]
    return torch.empty((0,) * min(aval.ndim, 1), dtype=to_torch(aval.dtype))


def jax_dtype(dtype: torch.dtype | None) -> jnp.dtype | None:
    """The JAX dtype for an optional torch dtype argument."""
    return None if dtype is None else to_jax(dtype)


def is_float(x: jax.Array) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def is_complex(x: jax.Array) -> bool:
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def is_integral(x: jax.Array) -> bool:
    """Integer or bool: the dtypes torch rounds, floors and divides exactly."""
    return jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_


HALF_DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def to_float(x: jax.Array) -> jax.Array:
    """x in the floating dtype torch computes a float op in: integers and bools as float32 (torch's
    default float), float16/bfloat16 as float32 (torch's CPU "opmath" type, rounded once at the end
    when the dispatcher casts back), other floats and complex unchanged."""
    if not is_float(x) or x.dtype in HALF_DTYPES:
        return x.astype(DEFAULT_FLOAT)
    return x


def opmath(x: object) -> object:
    """A half-precision array as float32 (anything else unchanged), for arithmetic torch rounds once."""
    if isinstance(x, jax.Array) and x.dtype in HALF_DTYPES:
        return x.astype(jnp.float32)
    return x


def canon_dim(dim: int, ndim: int) -> int:
    """A non-negative dim; 0-d tensors accept dims 0 and -1 like torch."""
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})")
    return dim % rank


def reduction_dims(dim: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """The dims a reduction runs over: None or [] mean every dim, as in torch."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(ndim))
    if ndim == 0:
        for d in dim:
            canon_dim(d, 0)
        return ()
    return tuple(sorted({canon_dim(d, ndim) for d in dim}))










def concrete_number(value: object) -> float | int | None:
    """The Python number a Scalar holds if it is known at trace time, else None."""
    if isinstance(value, (bool, int, float)):
        return value
    try:
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 - a tracer refuses conversion
        return None
    return array.item()
