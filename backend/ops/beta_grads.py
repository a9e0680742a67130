"""`_dirichlet_grad`: the reparameterised gradient of Beta and Dirichlet samples.

For x drawn from Beta(alpha, total - alpha) it is -(d cdf / d alpha) / pdf / (1 - x). torch's CPU
kernel picks one of four approximations by region (series near x = 0 and x = 1, a saddle-point
expansion when both shape parameters exceed 6, otherwise a fitted rational correction of an analytic
approximation); the same regions and formulas are used here, evaluated everywhere and selected with
`jnp.where`, with torch's CPU precisions: the series in the input's dtype, the other two in float64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .registry import lowers

aten = torch.ops.aten
Array = jax.Array

# The rational correction p / q: coefficient [i][j][k] multiplies u**i * a**j * b**k.
_NUMERATOR = np.array([
    [[1.003668233, -0.01061107488, -0.0657888334, 0.01201642863],
     [0.6336835991, -0.3557432599, 0.05486251648, -0.001465281033],
     [-0.03276231906, 0.004474107445, 0.002429354597, -0.0001557569013]],
    [[0.221950385, -0.3187676331, 0.01799915743, 0.01074823814],
     [-0.2951249643, 0.06219954479, 0.01535556598, 0.001550077057],
     [0.02155310298, 0.004170831599, 0.001292462449, 6.976601077e-05]],
    [[-0.05980841433, 0.008441916499, 0.01085618172, 0.002319392565],
     [0.02911413504, 0.01400243777, -0.002721828457, 0.000751041181],
     [0.005900514878, -0.001936558688, -9.495446725e-06, 5.385558597e-05]],
])
_DENOMINATOR = np.array([
    [[1.0, -0.02924021934, -0.04438342661, 0.007285809825],
     [0.6357567472, -0.3473456711, 0.05454656494, -0.002407477521],
     [-0.03301322327, 0.004845219414, 0.00231480583, -0.0002307248149]],
    [[0.5925320577, -0.1757678135, 0.01505928619, 0.000564515273],
     [0.1014815858, -0.06589186703, 0.01272886114, -0.0007316646956],
     [-0.007258481865, 0.001096195486, 0.0003934994223, -4.12701925e-05]],
    [[0.06469649321, -0.0236701437, 0.002902096474, -5.896963079e-05],
     [0.001925008108, -0.002869809258, 0.0008000589141, -6.063713228e-05],
     [-0.0003477407336, 6.959756487e-05, 1.097287507e-05, -1.650964693e-06]],
])


_DIGAMMA_ASYMPTOTIC = (8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
                       -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
                       8.33333333333333333333e-2)
_DIGAMMA_10 = 2.25175258906672110764


def _digamma(x: Array) -> Array:
    """torch's CPU `digamma_one` for positive x, with its mixed precision: the recurrence that shifts x
    past 10 and the asymptotic series accumulate in float64, while x, its logarithm and 0.5 / x stay
    in x's dtype. Where the series subtract two digammas, float32 results hinge on that rounding."""
    result = jnp.zeros(x.shape, jnp.float64)
    for _ in range(10):
        below = x < 10
        result = jnp.where(below, result - (1 / x).astype(jnp.float64), result)
        x = jnp.where(below, x + 1, x)
    z = 1 / (x * x).astype(jnp.float64)
    poly = jnp.full_like(z, _DIGAMMA_ASYMPTOTIC[0])
    for coefficient in _DIGAMMA_ASYMPTOTIC[1:]:
        poly = poly * z + coefficient
    asymptotic = result + jnp.log(x).astype(jnp.float64) - (0.5 / x).astype(jnp.float64) - jnp.where(x < 1e17, z * poly, 0)
    return jnp.where(x == 10, result + _DIGAMMA_10, asymptotic).astype(x.dtype)


def _nan_to_zero(value: Array) -> Array:
    return jnp.where(jnp.isnan(value), jnp.zeros_like(value), value)


def _grad_alpha_near_zero(x: Array, alpha: Array, beta: Array) -> Array:
    """Taylor series in x of the gradient with respect to alpha, for x near 0."""
    factor = _digamma(alpha) - _digamma(alpha + beta) - jnp.log(x)
    term = jnp.ones_like(x)
    series = term / alpha * (factor + 1 / alpha)
    for i in range(1, 11):
        term = term * (i - beta) * x / i
        series = series + term / (alpha + i) * (factor + 1 / (alpha + i))
    return _nan_to_zero(x * jnp.power(1 - x, -beta) * series)


def _grad_beta_near_zero(x: Array, alpha: Array, beta: Array) -> Array:
    """Taylor series in x of the gradient with respect to beta, for x near 0."""
    factor = _digamma(alpha + beta) - _digamma(beta)
    term, betas, dbetas = jnp.ones_like(x), jnp.ones_like(x), jnp.zeros_like(x)
    series = factor / alpha
    for i in range(1, 9):
        term = term * -x / i
        dbetas = dbetas * (beta - i) + betas
        betas = betas * (beta - i)
        series = series + term / (alpha + i) * (dbetas + factor * betas)
    return _nan_to_zero(-jnp.power(1 - x, 1 - beta) * series)


def _grad_alpha_saddle(x: Array, alpha: Array, beta: Array) -> Array:
    """Rice's saddle-point expansion, for alpha and beta both large."""
    total = alpha + beta
    mean = alpha / total
    std = jnp.sqrt(alpha * beta / (total + 1)) / total
    poly = 47 * x * beta**4 + alpha * (
        (43 + 20 * (16 + 27 * beta) * x) * beta**3 + alpha * (
            3 * (59 + 180 * beta - 90 * x) * beta**2 + alpha * (
                (453 + 1620 * beta * (1 - x) - 455 * x) * beta + alpha * (8 * (1 - x) * (135 * beta - 11)))))
    at_mean = (1 + 12 * alpha) * (1 + 12 * beta) / (total * total) / (1 - x) * poly / (12960 * alpha**3 * beta**2 * (1 + 12 * total))
    prefactor = -x / jnp.sqrt(2 * alpha * beta / total)

    def stirling(v: Array) -> Array:
        return 1 + 1 / (12 * v) + 1 / (288 * v * v)

    spread = alpha * (x - 1) + beta * x
    term1 = (2 * alpha * alpha * (x - 1) + alpha * beta * (x - 1) - x * beta * beta) / (jnp.sqrt(2 * alpha / beta) * total**1.5 * spread * spread)
    term2 = 0.5 * jnp.log(alpha / (total * x))
    term3 = jnp.sqrt(8 * alpha * beta / total) / spread
    term4 = (beta * jnp.log(beta / (total * (1 - x))) + alpha * jnp.log(alpha / (total * x))) ** -1.5
    away = stirling(alpha) * stirling(beta) / stirling(total) * prefactor * (term1 + term2 * (term3 + jnp.where(x < mean, term4, -term4)))
    return jnp.where((mean - 0.1 * std <= x) & (x <= mean + 0.1 * std), at_mean, away)


def _grad_alpha_rational(x: Array, alpha: Array, total: Array, digammas: Array) -> Array:
    """A fitted rational correction of x (digamma(total) - digamma(alpha)) / beta, in float64 (the
    digamma difference comes in the input's dtype, as torch computes it)."""
    u = jnp.log(x)
    a = jnp.log(alpha) - u
    b = jnp.log(total) - a
    monomials = jnp.stack([u**i * a**j for i in range(3) for j in range(3)], axis=-1)
    b_powers = jnp.stack([b**k for k in range(4)], axis=-1)
    p = jnp.einsum("...m,...k,mk->...", monomials, b_powers, jnp.asarray(_NUMERATOR.reshape(9, 4)))
    q = jnp.einsum("...m,...k,mk->...", monomials, b_powers, jnp.asarray(_DENOMINATOR.reshape(9, 4)))
    return p / q * x * digammas.astype(x.dtype) / (total - alpha)


@lowers(aten._dirichlet_grad.default)
def dirichlet_grad(x: Array, alpha: Array, total: Array) -> Array:
    x, alpha, total = jnp.broadcast_arrays(x, alpha, total)
    beta = total - alpha
    boundary = total * x * (1 - x)
    wide = [value.astype(jnp.float64) for value in (x, alpha, total)]
    near_zero = _grad_alpha_near_zero(x, alpha, beta)
    near_one = -_grad_beta_near_zero(1 - x, beta, alpha)
    saddle = _grad_alpha_saddle(wide[0], wide[1], wide[2] - wide[1]).astype(x.dtype)
    rational = _grad_alpha_rational(*wide, digammas=_digamma(total) - _digamma(alpha)).astype(x.dtype)
    return jnp.where(
        (x <= 0.5) & (boundary < 2.5), near_zero,
        jnp.where((x >= 0.5) & (boundary < 0.75), near_one, jnp.where((alpha > 6) & (beta > 6), saddle, rational)),
    )
