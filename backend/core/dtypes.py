"""Mapping between torch dtypes and the JAX/NumPy dtypes that hold them on a chip."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

TORCH_TO_JAX: dict[torch.dtype, jnp.dtype] = {
    torch.float32: jnp.dtype(jnp.float32),
    torch.float64: jnp.dtype(jnp.float64),
    torch.float16: jnp.dtype(jnp.float16),
    torch.bfloat16: jnp.dtype(jnp.bfloat16),
    torch.int8: jnp.dtype(jnp.int8),
    torch.int16: jnp.dtype(jnp.int16),
    torch.int32: jnp.dtype(jnp.int32),
    torch.int64: jnp.dtype(jnp.int64),
    torch.uint8: jnp.dtype(jnp.uint8),
    torch.uint16: jnp.dtype(jnp.uint16),
    torch.uint32: jnp.dtype(jnp.uint32),
    torch.uint64: jnp.dtype(jnp.uint64),
    torch.bool: jnp.dtype(jnp.bool_),
    torch.complex64: jnp.dtype(jnp.complex64),
    torch.complex128: jnp.dtype(jnp.complex128),
    torch.float8_e4m3fn: jnp.dtype(jnp.float8_e4m3fn),
    torch.float8_e5m2: jnp.dtype(jnp.float8_e5m2),
    torch.float8_e4m3fnuz: jnp.dtype(jnp.float8_e4m3fnuz),
    torch.float8_e5m2fnuz: jnp.dtype(jnp.float8_e5m2fnuz),
}
FLOAT8: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
JAX_TO_TORCH: dict[jnp.dtype, torch.dtype] = {value: key for key, value in TORCH_TO_JAX.items()}

SHORT_NAMES: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.uint16: "u16",
    torch.uint32: "u32",
    torch.uint64: "u64",
    torch.bool: "bool",
    torch.complex64: "c64",
    torch.complex128: "c128",
    torch.float8_e4m3fn: "f8e4m3fn",
    torch.float8_e5m2: "f8e5m2",
    torch.float8_e4m3fnuz: "f8e4m3fnuz",
    torch.float8_e5m2fnuz: "f8e5m2fnuz",
}


class UnsupportedDtypeError(TypeError):
    """A tensor of a dtype the tpu device cannot hold."""


def to_jax(dtype: torch.dtype) -> jnp.dtype:
    """The JAX dtype for a torch dtype, or a one-line error naming the supported ones."""
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        supported = ", ".join(str(d).removeprefix("torch.") for d in TORCH_TO_JAX)
        raise UnsupportedDtypeError(
            f"dtype {dtype} is not supported on tpu; use one of: {supported}"
        ) from None


_E4M3FN = jnp.dtype(jnp.float8_e4m3fn)
_E4M3FN_MAX = float(jnp.finfo(jnp.float8_e4m3fn).max)
_UINT8 = jnp.dtype(jnp.uint8)


def cast(array: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """`array.astype(dtype)` as torch casts: into float8_e4m3fn, which has no infinity, values past its
    largest (448) saturate to it (infinities too) where XLA would make NaN; NaN stays NaN. A float
    becomes uint8 through int64, as torch's `static_cast_with_inter_type` makes it on every device
    (-1.0 gives 255 and 300.0 gives 44), where XLA would saturate to 0 and 255."""
    if dtype == _E4M3FN and array.dtype != _E4M3FN and jnp.issubdtype(array.dtype, jnp.floating):
        array = jnp.clip(array, -_E4M3FN_MAX, _E4M3FN_MAX)
    if dtype == _UINT8 and jnp.issubdtype(array.dtype, jnp.floating):
        array = array.astype(jnp.int64)
    return array.astype(dtype)


def to_torch(dtype: np.dtype) -> torch.dtype:
    """The torch dtype for a JAX/NumPy dtype."""
    return JAX_TO_TORCH[jnp.dtype(dtype)]


def short_name(dtype: torch.dtype) -> str:
    """Compact dtype name used in trace signatures, e.g. f32, bf16, i64."""
    return SHORT_NAMES.get(dtype, str(dtype).removeprefix("torch."))
