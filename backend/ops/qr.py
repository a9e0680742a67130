"""Householder QR in LAPACK's compact form (`geqrf`, `householder_product`/`orgqr`, `ormqr`), least
squares (`linalg_lstsq`) and the pseudo-inverse (`linalg_pinv`, which lstsq's backward calls).

`linalg_lstsq` is lowered for the SVD drivers 'gelsd'/'gelss' (rank: singular values above
rcond * the largest) when there are no residuals to return (m <= n). Other cases run on the host:
- 'gelsy', torch's CPU default: torch's CPU build calls MKL, whose rank estimate departs from
  reference LAPACK's (QR with column pivoting and `dlaic1`) for matrices with singular values near
  rcond * the largest (about 1 in 6 such matrices in a sweep; a port of the reference algorithm agreed
  with SciPy's reference-LAPACK gelsy on every one), and the rank decides the solution;
- 'gelsd'/'gelss' with m > n: residuals exist only if every matrix has full rank, a shape that
  depends on the values;
- 'gels': torch raises when R has an exactly zero diagonal entry, which a lowering cannot do;
- complex inputs and empty matrices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ._util import PRECISION, UnloweredCase, is_complex
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _adjoint(x: Array) -> Array:
    return jnp.conj(jnp.swapaxes(x, -1, -2))


@lowers(aten.geqrf.default)
def geqrf(self: Array) -> tuple[Array, Array]:
    """LAPACK's geqrf: R above the diagonal, the reflectors below it, and their scales."""
    transposed, taus = jnp.linalg.qr(self, mode="raw")
    return jnp.swapaxes(transposed, -1, -2), taus


@lowers(aten.linalg_householder_product.default)
def linalg_householder_product(input: Array, tau: Array) -> Array:  # noqa: A002
    return lax.linalg.householder_product(input, tau)


@lowers(aten.ormqr.default)
def ormqr(self: Array, input2: Array, input3: Array, left: bool = True, transpose: bool = False) -> Array:
    """Q (from geqrf's reflectors in `self` and scales in `input2`) times `input3`."""
    batch = jnp.broadcast_shapes(self.shape[:-2], input2.shape[:-1], input3.shape[:-2])
    reflectors = jnp.broadcast_to(self, batch + self.shape[-2:])
    scales = jnp.broadcast_to(input2, batch + input2.shape[-1:])
    other = jnp.broadcast_to(input3, batch + input3.shape[-2:])
    return lax.linalg.ormqr(reflectors, scales, other, left=left, transpose=transpose)


# --- least squares ------------------------------------------------------------------------------


@lowers(aten.linalg_lstsq.default)
def linalg_lstsq(self: Array, b: Array, rcond: float | None = None, *, driver: str | None = None) -> tuple[Array, Array, Array, Array]:
    """The minimum-norm least-squares solution through the SVD, as LAPACK's gelsd/gelss compute it.
    Rank and singular values have the batch shape of `self` (not the broadcast one), as in torch."""
    if driver not in ("gelsd", "gelss") or is_complex(self) or self.dtype != b.dtype:
        raise UnloweredCase(f"lstsq with driver {driver!r} (see the module docstring) or these dtypes")
    if b.ndim not in (self.ndim - 1, self.ndim) or self.ndim < 2:
        raise UnloweredCase("lstsq argument ranks torch refuses")
    vector = b.ndim == self.ndim - 1
    rhs = b[..., None] if vector else b
    m, n = self.shape[-2:]
    if rhs.shape[-2] != m or 0 in (m, n):
        raise UnloweredCase("lstsq of empty or mismatched matrices")
    if m > n:
        raise UnloweredCase("gelsd/gelss residuals exist only if every matrix has full rank (a value-dependent shape)")
    threshold = float(jnp.finfo(self.dtype).eps) * max(m, n) if rcond is None else rcond
    if threshold < 0:  # LAPACK then uses its machine epsilon
        threshold = float(jnp.finfo(self.dtype).eps) / 2
    u, s, vh = jnp.linalg.svd(self, full_matrices=False)
    kept = s > threshold * s[..., :1]
    inverse = jnp.where(kept, 1 / jnp.where(kept, s, 1), 0)
    coefficients = jnp.matmul(_adjoint(u), rhs, precision=PRECISION) * inverse[..., :, None]
    solution = jnp.matmul(_adjoint(vh), coefficients, precision=PRECISION)
    rank = jnp.sum(kept, axis=-1).astype(jnp.int64)
    return (solution[..., 0] if vector else solution), jnp.zeros((0,), self.dtype), rank, s


@lowers(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(self: Array, *, atol: Array | None = None, rtol: Array | None = None, hermitian: bool = False) -> Array:
    """The pseudo-inverse through the SVD (eigh when hermitian), dropping singular values at or below
    max(atol, rtol * the largest); tolerances in float64, with torch's defaults (lstsq's backward
    calls this)."""
    m, n = self.shape[-2:]
    if 0 in (m, n):
        raise UnloweredCase("pinv of an empty matrix")
    default_rtol = jnp.float64(float(jnp.finfo(self.dtype).eps) * max(m, n))
    atol_value = jnp.float64(0) if atol is None else atol.astype(jnp.float64)
    if rtol is not None:
        rtol_value = rtol.astype(jnp.float64)
    elif atol is not None:
        rtol_value = jnp.where(atol_value > 0, 0, default_rtol)
    else:
        rtol_value = default_rtol
    if hermitian:
        values, vectors = jnp.linalg.eigh(self, symmetrize_input=False)
        magnitude = jnp.abs(values)
        tolerance = jnp.maximum(atol_value[..., None], rtol_value[..., None] * jnp.max(magnitude, axis=-1, keepdims=True))
        inverse = jnp.where(magnitude > tolerance, 1 / values, 0).astype(self.dtype)
        return jnp.matmul(vectors * inverse[..., None, :], _adjoint(vectors), precision=PRECISION)
    u, s, vh = jnp.linalg.svd(self, full_matrices=False)
    tolerance = jnp.maximum(atol_value[..., None], rtol_value[..., None] * s[..., :1])
    inverse = jnp.where(s > tolerance, 1 / s, 0).astype(self.dtype)
    return jnp.matmul(_adjoint(vh) * inverse[..., None, :], _adjoint(u), precision=PRECISION)
