"""Tensor factories: full/zeros/ones (and their `_like`/`new_` forms), arange, linspace, logspace,
eye, scalar_tensor, tril/triu indices, kaiser_window. The tpu device's factory kernels (`kernels.py`)
and the `out=` forms run these same lowerings.

`empty*` factories return zeros: the contents are unspecified in torch, and zeros cost nothing extra
under XLA. `arange`, `linspace` and `logspace` receive their `Scalar` bounds as Python numbers (the
dispatcher keeps them static because they decide the output's shape).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ._util import DEFAULT_FLOAT, concrete_number, jax_dtype
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _fill(size: Sequence[int], value: object, dtype: torch.dtype | None, like: jnp.dtype | None = None) -> Array:
    value = jnp.asarray(value)
    target = jax_dtype(dtype) or like or value.dtype
    return jnp.broadcast_to(value.astype(target), tuple(size))


@lowers(aten.full.default)
def full(size: Sequence[int], fill_value: object, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return _fill(size, fill_value, dtype)


@lowers(aten.full_like.default)
def full_like(self: Array, fill_value: object, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, memory_format: object = None) -> Array:
    return _fill(self.shape, fill_value, dtype, self.dtype)


@lowers(aten.zeros_like.default, aten.empty_like.default)
def zeros_like(self: Array, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, memory_format: object = None) -> Array:
    return jnp.zeros(self.shape, jax_dtype(dtype) or self.dtype)


@lowers(aten.ones_like.default)
def ones_like(self: Array, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, memory_format: object = None) -> Array:
    return jnp.ones(self.shape, jax_dtype(dtype) or self.dtype)


@lowers(aten.new_zeros.default, aten.new_empty.default)
def new_zeros(self: Array, size: Sequence[int], *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return jnp.zeros(tuple(size), jax_dtype(dtype) or self.dtype)


@lowers(aten.new_empty_strided.default)
def new_empty_strided(self: Array, size: Sequence[int], stride: Sequence[int], *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return jnp.zeros(tuple(size), jax_dtype(dtype) or self.dtype)


@lowers(aten.new_ones.default)
def new_ones(self: Array, size: Sequence[int], *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return jnp.ones(tuple(size), jax_dtype(dtype) or self.dtype)


@lowers(aten.new_full.default)
def new_full(self: Array, size: Sequence[int], fill_value: object, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return _fill(size, fill_value, dtype, self.dtype)


@lowers(aten._new_zeros_with_same_feature_meta.default)
def new_zeros_with_same_feature_meta(self: Array, other: Array, *, self_num_batch_dims: int = 0) -> Array:
    """Forward-mode AD's zero tangent for a primal (`other`) under `self`'s batch dims."""
    return jnp.zeros(self.shape[:self_num_batch_dims] + other.shape, other.dtype)


@lowers(aten.zeros.default)
def zeros(size: Sequence[int], *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return jnp.zeros(tuple(size), jax_dtype(dtype) or DEFAULT_FLOAT)


@lowers(aten.ones.default)
def ones(size: Sequence[int], *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return jnp.ones(tuple(size), jax_dtype(dtype) or DEFAULT_FLOAT)


@lowers(aten.empty.memory_format)
def empty(size: Sequence[int], *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, memory_format: object = None) -> Array:
    return jnp.zeros(tuple(size), jax_dtype(dtype) or DEFAULT_FLOAT)


@lowers(aten.empty_permuted.default)
def empty_permuted(size: Sequence[int], physical_layout: Sequence[int], *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return jnp.zeros(tuple(size), jax_dtype(dtype) or DEFAULT_FLOAT)


@lowers(aten.scalar_tensor.default)
def scalar_tensor(s: object, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    value = jnp.asarray(s)
    return value.astype(jax_dtype(dtype) or DEFAULT_FLOAT)


def _static(value: object, what: str) -> float | int:
    number = concrete_number(value)
    if number is None:
        raise TypeError(f"{what} must be known when the program is built")
    return number


def _arange(start: object, end: object, step: object, dtype: torch.dtype | None) -> Array:
    """torch's CPU arange: for an integer dtype, start and step are truncated to integers first (end
    too, for int64's length), so `arange(0, 5, 1.5, dtype=torch.int64)` is [0, 1, 2, 3, 4] and with
    int32 it is [0, 1, 2, 3]."""
    start, end, step = _static(start, "arange start"), _static(end, "arange end"), _static(step, "arange step")
    integral = all(isinstance(v, int) for v in (start, end, step))
    target = jax_dtype(dtype) or (jnp.int64 if integral else DEFAULT_FLOAT)
    if not jnp.issubdtype(target, jnp.integer):
        if step == 0:
            raise RuntimeError("step must be nonzero")
        length = max(0, math.ceil((end - start) / step))
        return (lax.iota(jnp.float64, length) * step + start).astype(target)
    int_start, int_end, int_step = int(start), int(end), int(step)
    if step == 0 or (target == jnp.int64 and int_step == 0):
        raise RuntimeError("step must be nonzero")
    if target == jnp.int64:
        length = math.ceil((int_end - int_start) / int_step)  # exact: both integers
    else:
        length = math.ceil((end - start) / step)
    return (lax.iota(jnp.int64, max(0, length)) * int_step + int_start).astype(target)


@lowers(aten.arange.default)
def arange(end: object, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return _arange(0, end, 1, dtype)


@lowers(aten.arange.start)
def arange_start(start: object, end: object, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return _arange(start, end, 1, dtype)


@lowers(aten.arange.start_step)
def arange_start_step(start: object, end: object, step: object = 1, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return _arange(start, end, step, dtype)


def _linspace(start: object, end: object, steps: int) -> Array:
    """torch's linspace in float64: the first half counts up from start, the second down from end."""
    start, end = _static(start, "linspace start"), _static(end, "linspace end")
    if steps == 1:
        return jnp.full((1,), start, jnp.float64)
    step = (end - start) / (steps - 1)
    position = lax.iota(jnp.float64, steps)
    return jnp.where(position < steps // 2, start + step * position, end - step * (steps - 1 - position))


@lowers(aten.linspace.default)
def linspace(start: object, end: object, steps: int, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    target = jax_dtype(dtype) or DEFAULT_FLOAT
    values = _linspace(start, end, steps)
    return values.astype(target) if jnp.issubdtype(target, jnp.inexact) else jnp.trunc(values).astype(target)


@lowers(aten.logspace.default)
def logspace(start: object, end: object, steps: int, base: float = 10.0, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    target = jax_dtype(dtype) or DEFAULT_FLOAT
    values = jnp.power(jnp.float64(base), _linspace(start, end, steps))
    return values.astype(target) if jnp.issubdtype(target, jnp.inexact) else jnp.trunc(values).astype(target)


@lowers(aten.eye.default)
def eye(n: int, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return jnp.eye(n, dtype=jax_dtype(dtype) or DEFAULT_FLOAT)


@lowers(aten.eye.m)
def eye_m(n: int, m: int, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return jnp.eye(n, m, dtype=jax_dtype(dtype) or DEFAULT_FLOAT)


@lowers(aten.tril_indices.default)
def tril_indices(row: int, col: int, offset: int = 0, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return jnp.asarray(np.stack(np.tril_indices(row, offset, col)), dtype=jax_dtype(dtype) or jnp.int64).reshape(2, -1)


@lowers(aten.triu_indices.default)
def triu_indices(row: int, col: int, offset: int = 0, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    return jnp.asarray(np.stack(np.triu_indices(row, offset, col)), dtype=jax_dtype(dtype) or jnp.int64).reshape(2, -1)


@lowers(aten.kaiser_window.default, aten.kaiser_window.periodic, aten.kaiser_window.beta)
def kaiser_window(window_length: int, periodic: bool = True, beta: float = 12.0, *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None) -> Array:
    """torch's definition: a periodic window is the symmetric one of length + 1 without its last point."""
    target = jax_dtype(dtype) or DEFAULT_FLOAT
    if window_length <= 1:
        return jnp.ones((window_length,), target)
    return jnp.kaiser(window_length + 1 if periodic else window_length, beta)[:window_length].astype(target)
