"""Mixed-precision loss scaling (`torch.amp.GradScaler`): unscaling gradients with an overflow check,
and the scale update, as torch's CUDA kernels compute them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


@lowers(aten._amp_foreach_non_finite_check_and_unscale)
def amp_foreach_non_finite_check_and_unscale(grads: list[Array], found_inf: Array, inv_scale: Array) -> tuple[list[Array], Array]:
    """Each gradient times `inv_scale` (in float32 at least); `found_inf` becomes 1 when any gradient
    holds an inf or NaN, and is left as it was otherwise."""
    unscaled = []
    non_finite = jnp.zeros((), dtype=bool)
    for grad in grads:
        compute_dtype = jnp.promote_types(grad.dtype, jnp.float32)
        non_finite = non_finite | ~jnp.all(jnp.isfinite(grad))
        unscaled.append((grad.astype(compute_dtype) * inv_scale.reshape(()).astype(compute_dtype)).astype(grad.dtype))
    return unscaled, jnp.where(non_finite, jnp.ones_like(found_inf), found_inf)


@lowers(aten._amp_update_scale)
def amp_update_scale(
    scale: Array, growth_tracker: Array, found_inf: Array, growth_factor: float, backoff_factor: float, growth_interval: int
) -> tuple[Array, Array]:
    """After an overflow the scale backs off and the count of good steps restarts; after
    `growth_interval` good steps in a row it grows (unless that would overflow) and the count restarts."""
    overflowed = found_inf.reshape(()) != 0
    successful = growth_tracker + 1
    grown = scale * growth_factor
    grow = ~overflowed & (successful == growth_interval)
    new_scale = jnp.where(overflowed, scale * backoff_factor, jnp.where(grow & jnp.isfinite(grown), grown, scale))
    new_tracker = jnp.where(overflowed | grow, jnp.zeros_like(growth_tracker), successful)
    return new_scale, new_tracker
