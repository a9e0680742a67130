"""Small helpers shared by the lowering families: dims, dtypes, and torch's argument conventions."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..dtypes import to_jax

# Full float32 precision, for products outside torch's float32 matmul precision setting (linear algebra,
# resampling weights, float8 scaled products): XLA's default may use bf16 passes on TPU or TF32 on GPU.
PRECISION = lax.Precision.HIGHEST

DEFAULT_FLOAT = jnp.float32


class UnloweredCase(NotImplementedError):
    """A lowering met arguments it cannot trace (e.g. a data-dependent output shape)."""


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
