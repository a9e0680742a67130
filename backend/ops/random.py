"""Random ops, drawn with `jax.random` from the `key` the dispatcher passes (derived from the chip's
seed and a counter; no lowering holds a key of its own).

Values follow the same distributions as torch but not torch's bit streams. In-place random ops whose
functional form exists (`uniform_` -> `uniform`, `exponential_` -> `exponential`, ...) are derived by
the dispatcher; `normal_` and `bernoulli_.float` have no functional overload, so their in-place
overloads are lowered here directly: the lowering returns the new value and the dispatcher writes it
into `self`. The key comes from the chip's default generator, or from the tpu generator an op is
called with (`generator=`): the dispatcher takes that argument out and passes the generator's seed and
counter instead, so lowerings receive `generator=None`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import torch

from ._util import DEFAULT_FLOAT, is_float, jax_dtype
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _float_dtype(dtype: torch.dtype | None, like: jnp.dtype | None = None) -> jnp.dtype:
    """The dtype a continuous draw is made in: `dtype`, else `like`, when floating or complex; else the default float."""
    target = jax_dtype(dtype) or like or jnp.dtype(DEFAULT_FLOAT)
    return target if jnp.issubdtype(target, jnp.inexact) else jnp.dtype(DEFAULT_FLOAT)


def _complex_parts(key: Array, shape: Sequence[int], dtype: jnp.dtype, draw: Callable[[Array, Sequence[int], jnp.dtype], Array]) -> Array:
    """A complex draw as torch makes it, on `view_as_real`: real and imaginary parts drawn alike."""
    parts = draw(key, (*shape, 2), jnp.finfo(dtype).dtype)
    return jax.lax.complex(parts[..., 0], parts[..., 1])


def _shifted_normal(key: Array, shape: Sequence[int], dtype: jnp.dtype, mean: float, std: float) -> Array:
    """`normal_(mean, std)` as torch draws it: for complex both parts have mean `mean` and std `std / sqrt(2)`."""
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return _complex_parts(key, shape, dtype, lambda part_key, part_shape, part_dtype: mean + std * jax.lax.rsqrt(2.0) * _normal(part_key, part_shape, part_dtype))
    return mean + std * _normal(key, shape, dtype)


def _uniform(key: Array, shape: Sequence[int], dtype: jnp.dtype, low: object = 0.0, high: object = 1.0) -> Array:
    """Uniform in [low, high); a complex draw has both parts so (torch's `uniform_` of complex)."""
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return _complex_parts(key, shape, dtype, lambda part_key, part_shape, part_dtype: _uniform(part_key, part_shape, part_dtype, low, high))
    return (low + (high - low) * _unit_uniform(key, shape, dtype)).astype(dtype)


def _unit_uniform(key: Array, shape: Sequence[int], dtype: jnp.dtype) -> Array:
    """Uniform in [0, 1) on the grid of `dtype`'s significand, as torch draws it: a half type's draw
    is k / 2**digits (bfloat16: k / 256), computed in float32, so rounding never makes it 1."""
    if jnp.dtype(dtype).itemsize >= 4:
        return jax.random.uniform(key, tuple(shape), dtype)
    steps = 2.0 ** (jnp.finfo(dtype).nmant + 1)
    return jnp.floor(jax.random.uniform(key, tuple(shape), jnp.float32) * steps) / steps


def _normal(key: Array, shape: Sequence[int], dtype: jnp.dtype) -> Array:
    """Standard normal; a complex draw's parts each have variance 1/2, as torch's `randn` of complex."""
    sample_dtype = jnp.float32 if jnp.dtype(dtype).itemsize < 4 else dtype
    return jax.random.normal(key, tuple(shape), sample_dtype).astype(dtype)


@lowers(aten.rand.default, needs_key=True)
def rand(size: Sequence[int], *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, key: Array) -> Array:
    return _uniform(key, size, _float_dtype(dtype))


@lowers(aten.randn.default, needs_key=True)
def randn(size: Sequence[int], *, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, key: Array) -> Array:
    return _normal(key, size, _float_dtype(dtype))


@lowers(aten.rand_like.default, aten.rand_like.generator, needs_key=True)
def rand_like(self: Array, *, generator: object = None, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, memory_format: object = None, key: Array) -> Array:
    return _uniform(key, self.shape, _float_dtype(dtype, self.dtype))


@lowers(aten.randn_like.default, aten.randn_like.generator, needs_key=True)
def randn_like(self: Array, *, generator: object = None, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, memory_format: object = None, key: Array) -> Array:
    return _normal(key, self.shape, _float_dtype(dtype, self.dtype))


def _randint(key: Array, low: int, high: int, shape: Sequence[int], dtype: jnp.dtype) -> Array:
    values = jax.random.randint(key, tuple(shape), low, high, dtype=jnp.int64)
    return values.astype(dtype)


@lowers(aten.randint.default, aten.randint.generator, needs_key=True)
def randint(high: int, size: Sequence[int], *, generator: object = None, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, key: Array) -> Array:
    return _randint(key, 0, high, size, jax_dtype(dtype) or jnp.int64)


@lowers(aten.randint.low, aten.randint.low_generator, needs_key=True)
def randint_low(low: int, high: int, size: Sequence[int], *, generator: object = None, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, key: Array) -> Array:
    return _randint(key, low, high, size, jax_dtype(dtype) or jnp.int64)


@lowers(aten.randint_like.default, aten.randint_like.generator, needs_key=True)
def randint_like(self: Array, high: int, *, generator: object = None, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, memory_format: object = None, key: Array) -> Array:
    return _randint(key, 0, high, self.shape, jax_dtype(dtype) or self.dtype)


@lowers(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, needs_key=True)
def randint_like_low(self: Array, low: int, high: int, *, generator: object = None, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, memory_format: object = None, key: Array) -> Array:
    return _randint(key, low, high, self.shape, jax_dtype(dtype) or self.dtype)


@lowers(aten.randperm.default, aten.randperm.generator, needs_key=True)
def randperm(n: int, *, generator: object = None, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, key: Array) -> Array:
    return jax.random.permutation(key, n).astype(jax_dtype(dtype) or jnp.int64)


@lowers(aten.uniform.default, needs_key=True)
def uniform(self: Array, from_: float = 0.0, to: float = 1.0, *, generator: object = None, key: Array, **kwargs: object) -> Array:
    low, high = kwargs.get("from", from_), to
    return _uniform(key, self.shape, _float_dtype(None, self.dtype), low, high)


@lowers(aten.normal_functional.default, aten.normal_.default, needs_key=True)
def normal_like(self: Array, mean: float = 0.0, std: float = 1.0, *, generator: object = None, key: Array) -> Array:
    return _shifted_normal(key, self.shape, _float_dtype(None, self.dtype), mean, std)


@lowers(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, needs_key=True)
def normal(mean: Array | float, std: Array | float = 1.0, *, generator: object = None, key: Array) -> Array:
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    dtype = next((a.dtype for a in (mean, std) if isinstance(a, jax.Array) and is_float(a)), jnp.dtype(DEFAULT_FLOAT))
    return mean + std * _normal(key, shape, dtype)


@lowers(aten.normal.float_float, needs_key=True)
def normal_sized(mean: float, std: float, size: Sequence[int], *, generator: object = None, dtype: torch.dtype | None = None, layout: object = None, device: object = None, pin_memory: bool | None = None, key: Array) -> Array:
    return _shifted_normal(key, size, _float_dtype(dtype), mean, std)


@lowers(aten.bernoulli.default, needs_key=True)
def bernoulli(self: Array, *, generator: object = None, key: Array) -> Array:
    return (jax.random.uniform(key, self.shape, jnp.float32) < self).astype(self.dtype)


@lowers(aten.bernoulli.p, aten.bernoulli_.float, needs_key=True)
def bernoulli_p(self: Array, p: float = 0.5, *, generator: object = None, key: Array) -> Array:
    return (jax.random.uniform(key, self.shape, jnp.float32) < p).astype(self.dtype)


@lowers(aten.bernoulli.Tensor, needs_key=True)
def bernoulli_tensor(self: Array, p: Array, *, generator: object = None, key: Array) -> Array:
    return (jax.random.uniform(key, self.shape, jnp.float32) < p).astype(self.dtype)


@lowers(aten.exponential.default, needs_key=True)
def exponential(self: Array, lambd: float = 1.0, *, generator: object = None, key: Array) -> Array:
    return (jax.random.exponential(key, self.shape, jnp.float32) / lambd).astype(self.dtype)


@lowers(aten.geometric.default, needs_key=True)
def geometric(self: Array, p: float, *, generator: object = None, key: Array) -> Array:
    uniform_draw = jax.random.uniform(key, self.shape, jnp.float32, minval=jnp.finfo(jnp.float32).tiny)
    return jnp.ceil(jnp.log(uniform_draw) / jnp.log1p(-p)).astype(self.dtype)


@lowers(aten.log_normal.default, needs_key=True)
def log_normal(self: Array, mean: float = 1.0, std: float = 2.0, *, generator: object = None, key: Array) -> Array:
    return jnp.exp(mean + std * jax.random.normal(key, self.shape, jnp.float32)).astype(self.dtype)


@lowers(aten.cauchy.default, needs_key=True)
def cauchy(self: Array, median: float = 0.0, sigma: float = 1.0, *, generator: object = None, key: Array) -> Array:
    return (median + sigma * jax.random.cauchy(key, self.shape, jnp.float32)).astype(self.dtype)


def _random_integers(key: Array, self: Array, low: int, high: int | None) -> Array:
    if high is None:
        if jnp.issubdtype(self.dtype, jnp.floating):
            high = 2 ** (jnp.finfo(self.dtype).nmant + 1) + 1
        elif self.dtype == jnp.bool_:
            high = 2
        else:
            high = int(jnp.iinfo(self.dtype).max) + 1
    high = min(high, 2**63 - 1)
    return jax.random.randint(key, self.shape, low, high, dtype=jnp.int64).astype(self.dtype)


@lowers(aten.random.default, needs_key=True)
def random_(self: Array, *, generator: object = None, key: Array) -> Array:
    return _random_integers(key, self, 0, None)


@lowers(aten.random.to, needs_key=True)
def random_to(self: Array, to: int, *, generator: object = None, key: Array) -> Array:
    return _random_integers(key, self, 0, to)


@lowers(getattr(aten.random, "from"), needs_key=True)
def random_from(self: Array, from_: int, to: int | None, *, generator: object = None, key: Array) -> Array:
    return _random_integers(key, self, from_, to)


@lowers(aten.multinomial.default, needs_key=True)
def multinomial(self: Array, num_samples: int, replacement: bool = False, *, generator: object = None, key: Array) -> Array:
    logits = jnp.log(self.astype(jnp.float32))
    batch = logits.reshape(-1, logits.shape[-1])
    if replacement:
        draws = jax.random.categorical(key, batch, axis=-1, shape=(num_samples, batch.shape[0])).T
    else:
        perturbed = batch + jax.random.gumbel(key, batch.shape, jnp.float32)
        draws = jax.lax.top_k(perturbed, num_samples)[1]
    return draws.reshape(self.shape[:-1] + (num_samples,)).astype(jnp.int64)


@lowers(aten.native_dropout.default, needs_key=True)
def native_dropout(input: Array, p: float, train: bool | None, *, key: Array) -> tuple[Array, Array]:  # noqa: A002
    if train is False:
        return input, jnp.ones(input.shape, jnp.bool_)
    if p >= 1.0:
        return jnp.zeros_like(input), jnp.zeros(input.shape, jnp.bool_)
    keep = jax.random.uniform(key, input.shape, jnp.float32) >= p
    return jnp.where(keep, input / (1.0 - p), jnp.zeros_like(input)).astype(input.dtype), keep


@lowers(aten.poisson.default, needs_key=True)
def poisson(self: Array, generator: object = None, *, key: Array) -> Array:
    return jax.random.poisson(key, self, self.shape).astype(self.dtype)


def _positive_gamma(key: Array, concentration: Array) -> Array:
    """Gamma(concentration, 1) draws raised to the dtype's smallest normal number, as torch's kernels
    raise them: for a small concentration a large share of draws underflows to 0, outside the
    support that `Gamma.log_prob` validates."""
    sampled_dtype = jnp.promote_types(concentration.dtype, jnp.float32)  # half types draw in float32
    draws = jax.random.gamma(key, concentration.astype(sampled_dtype), concentration.shape, dtype=sampled_dtype)
    return jnp.maximum(draws.astype(concentration.dtype), jnp.finfo(concentration.dtype).tiny)


@lowers(aten._standard_gamma.default, needs_key=True)
def standard_gamma(self: Array, generator: object = None, *, key: Array) -> Array:
    return _positive_gamma(key, self)


@lowers(aten._sample_dirichlet.default, needs_key=True)
def sample_dirichlet(self: Array, generator: object = None, *, key: Array) -> Array:
    """Dirichlet draws over the last dim, made as torch's kernels make them: positive Gamma draws
    divided by their sum, the quotient raised to the smallest normal number."""
    draws = _positive_gamma(key, self)
    return jnp.maximum(draws / draws.sum(-1, keepdims=True), jnp.finfo(self.dtype).tiny)


@lowers(aten.binomial.default, needs_key=True)
def binomial(count: Array, prob: Array, generator: object = None, *, key: Array) -> Array:
    return jax.random.binomial(key, count, prob).astype(count.dtype)
