"""Histograms with a static number of bins (`histc`): the output shape does not depend on the data."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from tputrace.backend.ops.registry import lowers

aten = torch.ops.aten


@lowers(aten.histc.default)
def histc(values, bins=100, min=0, max=0):  # noqa: A002, ANN001, ANN201 - ATen argument names
    """Counts of `values` in `bins` equal-width bins over [min, max] (the data's range when min == max);
    values outside the range are ignored and the last bin includes its upper edge, as in torch. A
    range that is not finite is refused before (`arg_checks`, and `index_checks` for the data's).
    Integer values are binned in integer arithmetic, as CUDA's kernel bins them (torch's CPU kernel
    refuses them; Mixture-of-Experts layers count tokens per expert with an integer histc on
    accelerators)."""
    if values.size == 0:
        return jnp.zeros(bins, values.dtype)
    if jnp.issubdtype(values.dtype, jnp.integer):
        # CUDA's integer kernel: bounds truncated to integers, bin = (v - min) * bins // (max - min).
        data = values.reshape(-1).astype(jnp.int64)
        low, high = _range(data, jnp.asarray(min).astype(jnp.int64), jnp.asarray(max).astype(jnp.int64))
        positions = jnp.minimum((data - low) * bins // (high - low), bins - 1)
        counter = jnp.int64
    else:
        data = values.reshape(-1).astype(jnp.float64 if values.dtype == jnp.float64 else jnp.float32)
        low, high = _range(data, jnp.asarray(min, data.dtype), jnp.asarray(max, data.dtype))
        positions = jnp.floor((data - low) * bins / (high - low)).astype(jnp.int32)
        positions = jnp.where(data == high, bins - 1, positions)
        counter = jnp.float32
    inside = (data >= low) & (data <= high)
    counts = jnp.zeros(bins, counter).at[jnp.where(inside, positions, 0)].add(inside.astype(counter))
    return counts.astype(values.dtype)


def _range(data, given_low, given_high):  # noqa: ANN001, ANN202
    """The histogram's [low, high]: the given one, or the data's when the two bounds are equal; a
    range of one value is widened by 1 on each side, as torch widens it."""
    use_data_range = given_low == given_high
    low = jnp.where(use_data_range, jnp.min(data), given_low)
    high = jnp.where(use_data_range, jnp.max(data), given_high)
    same = low == high
    return jnp.where(same, low - 1, low), jnp.where(same, high + 1, high)
