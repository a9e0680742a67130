"""FFTs: `_fft_r2c`, `_fft_c2r`, `_fft_c2c` with `jnp.fft`.

torch's `normalization` argument is 0 (none), 1 (1/sqrt(n)) or 2 (1/n), applied to whichever
direction the op computes; `jnp.fft`'s `norm` names the scaling of the forward transform, so the
mapping flips for inverse transforms.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from ._util import canon_dim
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array

_FORWARD_NORM = {0: "backward", 1: "ortho", 2: "forward"}
_INVERSE_NORM = {0: "forward", 1: "ortho", 2: "backward"}


@lowers(aten._fft_r2c.default)
def fft_r2c(self: Array, dim: list[int], normalization: int, onesided: bool) -> Array:
    axes = [canon_dim(d, self.ndim) for d in dim]
    if onesided:
        return jnp.fft.rfftn(self, axes=axes, norm=_FORWARD_NORM[normalization])
    return jnp.fft.fftn(self.astype(jnp.result_type(self.dtype, jnp.complex64)), axes=axes, norm=_FORWARD_NORM[normalization])


@lowers(aten._fft_c2r.default)
def fft_c2r(self: Array, dim: list[int], normalization: int, last_dim_size: int) -> Array:
    axes = [canon_dim(d, self.ndim) for d in dim]
    sizes = [self.shape[a] for a in axes[:-1]] + [last_dim_size]
    return jnp.fft.irfftn(self, s=sizes, axes=axes, norm=_INVERSE_NORM[normalization])


@lowers(aten._fft_c2c.default)
def fft_c2c(self: Array, dim: list[int], normalization: int, forward: bool) -> Array:
    axes = [canon_dim(d, self.ndim) for d in dim]
    if forward:
        return jnp.fft.fftn(self, axes=axes, norm=_FORWARD_NORM[normalization])
    return jnp.fft.ifftn(self, axes=axes, norm=_INVERSE_NORM[normalization])
