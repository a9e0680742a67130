"""Reductions and scans: sum/mean/prod, min/max and arg variants, any/all, var/std, norms, cumulative ops.

Conventions from torch: `dim=None` or `dim=[]` reduce every dim; integer and bool sums and products
accumulate in int64; half-precision floats accumulate in float32; `correction` divides by
max(N - correction, 0) (so too few elements give inf or NaN, not an error); max/min propagate NaN
and their indices point at the first NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ._util import (
    HALF_DTYPES,
    canon_dim,
    concrete_number,
    is_complex,
    is_float,
    is_integral,
    jax_dtype,
    reduction_dims,
    to_float,
)
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _accumulator(x: Array, dtype: torch.dtype | None) -> Array:
    """x in the dtype torch accumulates sums and products in: a requested half-precision dtype still
    accumulates in float32 (the result is rounded to it once)."""
    if dtype is not None:
        x = x.astype(jax_dtype(dtype))
    elif is_integral(x):
        return x.astype(jnp.int64)
    if x.dtype in HALF_DTYPES:
        return x.astype(jnp.float32)
    return x


def _float_accumulator(x: Array, dtype: torch.dtype | None = None) -> Array:
    if dtype is not None:
        return x.astype(jax_dtype(dtype))
    return to_float(x)


def _count(shape: Sequence[int], dims: Sequence[int]) -> int:
    return math.prod(shape[d] for d in dims)


# --- sums, means, products ---------------------------------------------------------------------------


@lowers(aten.sum.dim_IntList)
def sum_dim(self: Array, dim: Sequence[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Array:
    return jnp.sum(_accumulator(self, dtype), axis=reduction_dims(dim, self.ndim), keepdims=keepdim)


@lowers(aten.sum.default)
def sum_all(self: Array, *, dtype: torch.dtype | None = None) -> Array:
    return jnp.sum(_accumulator(self, dtype))


@lowers(aten.nansum.default)
def nansum(self: Array, dim: Sequence[int] | None = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Array:
    x = _accumulator(self, dtype)
    if is_float(x):
        x = jnp.where(jnp.isnan(x), jnp.zeros_like(x), x)
    return jnp.sum(x, axis=reduction_dims(dim, self.ndim), keepdims=keepdim)


@lowers(aten.mean.dim)
def mean_dim(self: Array, dim: Sequence[int] | None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Array:
    return jnp.mean(_float_accumulator(self, dtype), axis=reduction_dims(dim, self.ndim), keepdims=keepdim)


@lowers(aten.mean.default)
def mean_all(self: Array, *, dtype: torch.dtype | None = None) -> Array:
    return jnp.mean(_float_accumulator(self, dtype))


@lowers(aten.prod.default)
def prod_all(self: Array, *, dtype: torch.dtype | None = None) -> Array:
    return jnp.prod(_accumulator(self, dtype))


@lowers(aten.prod.dim_int)
def prod_dim(self: Array, dim: int, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Array:
    return jnp.prod(_accumulator(self, dtype), axis=reduction_dims(dim, self.ndim), keepdims=keepdim)


@lowers(aten.logsumexp.default)
def logsumexp(self: Array, dim: Sequence[int], keepdim: bool = False) -> Array:
    x = _float_accumulator(self)
    dims = reduction_dims(dim, self.ndim)
    if x.size == 0:
        return jnp.full(jnp.sum(x, axis=dims, keepdims=keepdim).shape, -jnp.inf, x.dtype)
    peak = jnp.max(x, axis=dims, keepdims=True)
    peak = jnp.where(jnp.isinf(peak), jnp.zeros_like(peak), lax.stop_gradient(peak))
    result = jnp.log(jnp.sum(jnp.exp(x - peak), axis=dims, keepdims=True)) + peak
    return result if keepdim else jnp.squeeze(result, dims)


def _count_set(self: Array, dims: tuple[int, ...]) -> Array:
    """int64 counts of nonzero elements, summed in int32 when no count can pass it (XLA:CPU sums
    int32 about 3 times faster than int64: this is the count a data-dependent op reads)."""
    accumulator = jnp.int32 if self.size < 2**31 else jnp.int64
    return jnp.sum(self != 0, axis=dims, dtype=accumulator).astype(jnp.int64)


@lowers(aten.count_nonzero.dim_IntList)
def count_nonzero_dims(self: Array, dim: Sequence[int]) -> Array:
    return _count_set(self, reduction_dims(dim, self.ndim))


@lowers(aten.count_nonzero.default)
def count_nonzero(self: Array, dim: int | None = None) -> Array:
    return _count_set(self, reduction_dims(dim, self.ndim))


# --- extrema ------------------------------------------------------------------------------------------


@lowers(aten.amax.default)
def amax(self: Array, dim: Sequence[int] = (), keepdim: bool = False) -> Array:
    return jnp.max(self, axis=reduction_dims(dim, self.ndim), keepdims=keepdim)


@lowers(aten.amin.default)
def amin(self: Array, dim: Sequence[int] = (), keepdim: bool = False) -> Array:
    return jnp.min(self, axis=reduction_dims(dim, self.ndim), keepdims=keepdim)


@lowers(aten.max.default)
def max_all(self: Array) -> Array:
    return jnp.max(self)


@lowers(aten.min.default)
def min_all(self: Array) -> Array:
    return jnp.min(self)


@lowers(aten.aminmax.default)
def aminmax(self: Array, *, dim: int | None = None, keepdim: bool = False) -> tuple[Array, Array]:
    dims = reduction_dims(dim, self.ndim)
    return jnp.min(self, axis=dims, keepdims=keepdim), jnp.max(self, axis=dims, keepdims=keepdim)


def _arg_extreme(x: Array, axis: int, largest: bool) -> Array:
    """Index of the first maximum (or minimum) along axis; a NaN counts as the extreme."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    return jnp.argmax(x, axis=axis) if largest else jnp.argmin(x, axis=axis)


def _extreme_with_index(self: Array, dim: int, keepdim: bool, largest: bool) -> tuple[Array, Array]:
    if self.ndim == 0:
        canon_dim(dim, 0)
        return self, jnp.zeros((), jnp.int64)
    axis = canon_dim(dim, self.ndim)
    index = _arg_extreme(self, axis, largest).astype(jnp.int64)
    values = jnp.take_along_axis(self, jnp.expand_dims(index, axis), axis=axis)
    if not keepdim:
        values = jnp.squeeze(values, axis)
    return values, (jnp.expand_dims(index, axis) if keepdim else index)


@lowers(aten.max.dim)
def max_dim(self: Array, dim: int, keepdim: bool = False) -> tuple[Array, Array]:
    return _extreme_with_index(self, dim, keepdim, largest=True)


@lowers(aten.min.dim)
def min_dim(self: Array, dim: int, keepdim: bool = False) -> tuple[Array, Array]:
    return _extreme_with_index(self, dim, keepdim, largest=False)


def _argreduce(self: Array, dim: int | None, keepdim: bool, largest: bool) -> Array:
    if dim is None:
        index = _arg_extreme(self.reshape(-1), 0, largest)
        return index.reshape((1,) * self.ndim) if keepdim else index
    if self.ndim == 0:
        canon_dim(dim, 0)
        return jnp.zeros((), jnp.int64)
    axis = canon_dim(dim, self.ndim)
    index = _arg_extreme(self, axis, largest)
    return jnp.expand_dims(index, axis) if keepdim else index


@lowers(aten.argmax.default)
def argmax(self: Array, dim: int | None = None, keepdim: bool = False) -> Array:
    return _argreduce(self, dim, keepdim, largest=True)


@lowers(aten.argmin.default)
def argmin(self: Array, dim: int | None = None, keepdim: bool = False) -> Array:
    return _argreduce(self, dim, keepdim, largest=False)


# --- boolean reductions -------------------------------------------------------------------------------


@lowers(aten.any.default, aten.any.dim, aten.any.dims)
def any_(self: Array, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Array:
    return jnp.any(self != 0, axis=reduction_dims(dim, self.ndim), keepdims=keepdim)


@lowers(aten.all.default, aten.all.dim, aten.all.dims)
def all_(self: Array, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Array:
    return jnp.all(self != 0, axis=reduction_dims(dim, self.ndim), keepdims=keepdim)


@lowers(aten._is_all_true.default)
def is_all_true(self: Array) -> Array:
    """`torch.distributions` argument validation reads this (a bool tensor) as one host bool."""
    return jnp.all(self)


@lowers(aten._is_any_true.default)
def is_any_true(self: Array) -> Array:
    return jnp.any(self)


# --- variance and standard deviation --------------------------------------------------------------


def _var_mean(self: Array, dim: Sequence[int] | None, correction: object, keepdim: bool) -> tuple[Array, Array]:
    x = _float_accumulator(self)
    dims = reduction_dims(dim, self.ndim)
    count = _count(self.shape, dims)
    mean = jnp.mean(x, axis=dims, keepdims=True)
    deviation = x - mean
    squares = jnp.real(deviation * jnp.conj(deviation)) if is_complex(x) else deviation * deviation
    correction = 1 if correction is None else correction
    divisor = jnp.maximum(count - correction, 0)
    var = jnp.sum(squares, axis=dims, keepdims=keepdim) / divisor
    if not keepdim and dims:
        mean = jnp.squeeze(mean, dims)
    return var, mean


@lowers(aten.var.correction)
def var(self: Array, dim: Sequence[int] | None = None, *, correction: object = None, keepdim: bool = False) -> Array:
    return _var_mean(self, dim, correction, keepdim)[0]


@lowers(aten.std.correction)
def std(self: Array, dim: Sequence[int] | None = None, *, correction: object = None, keepdim: bool = False) -> Array:
    return jnp.sqrt(_var_mean(self, dim, correction, keepdim)[0])


@lowers(aten.var_mean.correction)
def var_mean(self: Array, dim: Sequence[int] | None = None, *, correction: object = None, keepdim: bool = False) -> tuple[Array, Array]:
    return _var_mean(self, dim, correction, keepdim)


@lowers(aten.std_mean.correction)
def std_mean(self: Array, dim: Sequence[int] | None = None, *, correction: object = None, keepdim: bool = False) -> tuple[Array, Array]:
    variance, mean = _var_mean(self, dim, correction, keepdim)
    return jnp.sqrt(variance), mean


# --- norms ------------------------------------------------------------------------------------------


def vector_norm(x: Array, ord: object, dims: tuple[int, ...], keepdim: bool) -> Array:
    """The p-norm over dims; `ord` may be a traced Scalar, then every case is computed and selected."""
    magnitude = jnp.abs(x)
    known = concrete_number(ord)

    def power_norm(p: object) -> Array:
        return jnp.sum(magnitude**p, axis=dims, keepdims=keepdim) ** (1.0 / p)

    if known is not None:
        if known == math.inf:
            return jnp.max(magnitude, axis=dims, keepdims=keepdim)
        if known == -math.inf:
            return jnp.min(magnitude, axis=dims, keepdims=keepdim)
        if known == 0:
            return jnp.sum(magnitude != 0, axis=dims, keepdims=keepdim).astype(magnitude.dtype)
        if known == 1:
            return jnp.sum(magnitude, axis=dims, keepdims=keepdim)
        if known == 2:
            return jnp.sqrt(jnp.sum(magnitude * magnitude, axis=dims, keepdims=keepdim))
        return power_norm(known)
    p = jnp.asarray(ord, magnitude.dtype)
    safe_p = jnp.where(jnp.isinf(p) | (p == 0), jnp.ones_like(p), p)
    general = power_norm(safe_p)
    if magnitude.size == 0:
        return general
    return jnp.where(
        p == math.inf,
        jnp.max(magnitude, axis=dims, keepdims=keepdim),
        jnp.where(
            p == -math.inf,
            jnp.min(magnitude, axis=dims, keepdims=keepdim),
            jnp.where(p == 0, jnp.sum(magnitude != 0, axis=dims, keepdims=keepdim).astype(magnitude.dtype), general),
        ),
    )


@lowers(aten.linalg_vector_norm.default)
def linalg_vector_norm(self: Array, ord: object = 2, dim: Sequence[int] | None = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Array:  # noqa: A002
    return vector_norm(_float_accumulator(self, dtype), ord, reduction_dims(dim, self.ndim), keepdim)


@lowers(aten.norm.Scalar, aten.norm.ScalarOpt_dtype)
def norm_all(self: Array, p: object = 2, *, dtype: torch.dtype | None = None) -> Array:
    return vector_norm(_float_accumulator(self, dtype), 2 if p is None else p, reduction_dims(None, self.ndim), False)


@lowers(aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype)
def norm_dim(self: Array, p: object, dim: Sequence[int], keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Array:
    return vector_norm(_float_accumulator(self, dtype), 2 if p is None else p, reduction_dims(dim, self.ndim), keepdim)


# --- scans ------------------------------------------------------------------------------------------


def _scan(self: Array, dim: int, fn) -> Array:
    axis = canon_dim(dim, self.ndim)
    if self.ndim == 0:
        return fn(self.reshape(1), 0).reshape(())
    return fn(self, axis)


@lowers(aten.cumsum.default)
def cumsum(self: Array, dim: int, *, dtype: torch.dtype | None = None) -> Array:
    return _scan(_accumulator(self, dtype), dim, lambda x, axis: jnp.cumsum(x, axis=axis))


@lowers(aten.cumprod.default)
def cumprod(self: Array, dim: int, *, dtype: torch.dtype | None = None) -> Array:
    return _scan(_accumulator(self, dtype), dim, lambda x, axis: jnp.cumprod(x, axis=axis))


@lowers(aten.logcumsumexp.default)
def logcumsumexp(self: Array, dim: int) -> Array:
    return _scan(_float_accumulator(self), dim, lambda x, axis: lax.cumlogsumexp(x, axis=axis))


def _cumulative_extreme(self: Array, dim: int, largest: bool) -> tuple[Array, Array]:
    """Running max (min) and the index of the latest element that attained it; NaN wins and sticks."""

    def combine(earlier: tuple[Array, Array], later: tuple[Array, Array]) -> tuple[Array, Array]:
        (value_a, index_a), (value_b, index_b) = earlier, later
        better = value_b >= value_a if largest else value_b <= value_a
        if is_float(value_a):
            better = jnp.isnan(value_b) | (~jnp.isnan(value_a) & better)
        return jnp.where(better, value_b, value_a), jnp.where(better, index_b, index_a)

    def run(x: Array, axis: int) -> tuple[Array, Array]:
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        index = jnp.broadcast_to(jnp.arange(x.shape[axis], dtype=jnp.int64).reshape(shape), x.shape)
        if x.shape[axis] == 0:
            return x, index
        return lax.associative_scan(combine, (x, index), axis=axis)

    axis = canon_dim(dim, self.ndim)
    if self.ndim == 0:
        values, indices = run(self.reshape(1), 0)
        return values.reshape(()), indices.reshape(())
    return run(self, axis)


@lowers(aten.cummax.default)
def cummax(self: Array, dim: int) -> tuple[Array, Array]:
    return _cumulative_extreme(self, dim, largest=True)


@lowers(aten.cummin.default)
def cummin(self: Array, dim: int) -> tuple[Array, Array]:
    return _cumulative_extreme(self, dim, largest=False)

