"""Special functions (gamma family, Bessel, error-function relatives) from `jax.scipy.special`, with
torch's values at poles where they differ (torch's digamma(0) is -inf, SciPy's is NaN)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as special
import torch
from jax import lax

from ._util import to_float
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _unary(fn):
    def lowering(self: Array) -> Array:
        return fn(to_float(self))

    lowering.__qualname__ = f"special[{getattr(fn, '__name__', 'fn')}]"
    return lowering


for _op, _fn in {
    aten.i0.default: special.i0,
    aten.special_i0e.default: special.i0e,
    aten.special_i1.default: special.i1,
    aten.special_i1e.default: special.i1e,
    aten.special_ndtri.default: special.ndtri,
    aten.special_log_ndtr.default: special.log_ndtr,
    aten.special_erfcx.default: special.erfcx,
    aten.special_modified_bessel_i0.default: special.i0,
    aten.special_modified_bessel_i1.default: special.i1,
}.items():
    lowers(_op)(_unary(_fn))


@lowers(aten.digamma.default)
def digamma(self: Array) -> Array:
    x = to_float(self)
    return jnp.where(x == 0, jnp.full_like(x, -jnp.inf), lax.digamma(x))


_POLYGAMMA_SHIFTS = 64


@lowers(aten.polygamma.default)
def polygamma(n: int, self: Array) -> Array:
    """SciPy's zeta form is only accurate for x > 0: negative x is first shifted up with the recurrence
    psi_n(x) = psi_n(x + k) - (-1)^n n! sum_{j<k} (x + j)^-(n+1), exactly for x > -64."""
    x = to_float(self)
    if n == 0:
        return digamma(x)
    shift = jnp.where(x < 0, jnp.minimum(jnp.ceil(-x) + 1, _POLYGAMMA_SHIFTS), 0)
    correction = jnp.zeros_like(x)
    for j in range(_POLYGAMMA_SHIFTS):
        correction = correction + jnp.where(j < shift, (x + j) ** -(n + 1), 0)
    value = special.polygamma(n, x + shift) - (-1) ** n * math.factorial(n) * correction
    pole = jnp.full_like(x, jnp.inf if n % 2 else -jnp.inf)
    return jnp.where(x == 0, pole, value)


@lowers(aten.mvlgamma.default)
def mvlgamma(self: Array, p: int) -> Array:
    return special.multigammaln(to_float(self), p)


@lowers(aten.special_entr.default)
def entr(self: Array) -> Array:
    x = to_float(self)
    negative = jnp.where(x == 0, jnp.zeros_like(x), jnp.full_like(x, -jnp.inf))
    value = jnp.where(x > 0, -x * jnp.log(jnp.where(x > 0, x, 1)), negative)
    return jnp.where(jnp.isnan(x), x, value)


@lowers(aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar)
def zeta(self: Array, other: Array) -> Array:
    x, q = to_float(jnp.asarray(self)), to_float(jnp.asarray(other))
    return special.zeta(x, q)


@lowers(aten.igamma.default)
def igamma(self: Array, other: Array) -> Array:
    return special.gammainc(to_float(self), to_float(other))


@lowers(aten.igammac.default)
def igammac(self: Array, other: Array) -> Array:
    return special.gammaincc(to_float(self), to_float(other))


@lowers(aten._standard_gamma_grad.default)
def standard_gamma_grad(self: Array, output: Array) -> Array:
    """d sample / d alpha of a Gamma(alpha, 1) sample, for `rsample` of Gamma, Beta and Dirichlet."""
    compute = jnp.promote_types(self.dtype, jnp.float32)
    return jax.lax.random_gamma_grad(self.astype(compute), output.astype(compute)).astype(self.dtype)
