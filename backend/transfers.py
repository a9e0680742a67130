"""Copies between host torch tensors and chip arrays (bfloat16 travels as its 16-bit pattern)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tputrace.backend.dtypes import to_jax


def torch_to_array(host: torch.Tensor, device: jax.Device) -> jax.Array:
    """Put a CPU tensor's data on a JAX device."""
    host = host.detach()
    to_jax(host.dtype)  # a dtype the chip cannot hold is a one-line error naming the ones it can
    if not host.is_contiguous():
        host = host.contiguous()
    if host.dtype == torch.bfloat16:
        data = host.view(torch.int16).numpy().view(jnp.bfloat16)
    else:
        data = host.numpy()
    # A private copy: XLA:CPU adopts an aligned host buffer (torch's are) without copying, even with
    # may_alias=False, so a later in-place change to the host tensor would show on the chip.
    return jax.device_put(np.array(data, copy=True), device)


def array_to_torch(array: Any, dtype: torch.dtype) -> torch.Tensor:
    """A writable CPU tensor holding a copy of a chip array."""
    data = np.asarray(array)
    if dtype == torch.bfloat16:
        return torch.from_numpy(np.array(data.view(np.int16))).view(torch.bfloat16)
    if data.dtype != to_jax(dtype):
        data = data.astype(to_jax(dtype))
    return torch.from_numpy(np.array(data, copy=True))
