"""Pinning a backward op's recomputation after its incoming gradient.

A backward op that recomputes a forward intermediate (attention's probabilities, layer norm's
normalised input) reads only values the forward already has. In one fused forward+backward program
(DeferAndFuse) XLA is then free to merge it with the forward's own copy, or to schedule it during the
forward, and either way keeps the result alive until the backward: memory eager autograd never holds.
XLA's optimisation barrier (see `program_parts.fence`) is removed before its late CSE pass and its scheduler,
so it cannot prevent this; a data dependency on the gradient can.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array


def computed_after(value: Array, gradient: Array) -> Array:
    """`value` unchanged, but as a value XLA can only compute once `gradient` exists.

    The zero subtracted is made from the gradient's first element (0 whatever it holds, NaN included)
    in a form XLA does not fold; `x - 0.0` is `x` exactly, signed zeros included.
    """
    if gradient.size == 0 or not jnp.issubdtype(value.dtype, jnp.floating):
        return value
    first = gradient.reshape(-1)[0]
    zero = (first != first).astype(value.dtype) * jnp.zeros((), value.dtype)
    return value - zero
