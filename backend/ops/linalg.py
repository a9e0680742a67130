"""Matrix products and linear algebra.

Products of float32 and complex64 inputs run at torch's float32 matmul precision setting
(`matmul_precision`), others at full precision. `beta == 0` ignores `self` entirely (NaN in
`self` does not propagate), as torch documents for addmm and friends. Factorisations come from
`jnp.linalg`/`lax.linalg`; pivots are returned 1-based int32 like LAPACK's, and `info` outputs are
LAPACK's (LU: first zero pivot; Cholesky: first non-positive leading minor), so torch's error checks
raise as on the CPU. Ops with sign or order ambiguity (SVD, eigh) match torch's
results up to what their OpInfo checks compare.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tputrace.backend.core import chips, matmul_precision
from tputrace.backend.core.dtypes import FLOAT8, to_jax

from ._util import HALF_DTYPES, PRECISION, UnloweredCase, canon_dim, jax_dtype, opmath
from .reduction import vector_norm
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _row_major_lhs(a: Array, b: Array) -> Array:
    """On XLA:CPU, the left matrix of a matrix product laid out row by row in memory.

    XLA folds a transpose into the product's dimension numbers (a backward's `grad.t() @ x`), and
    XLA:CPU then runs it on its generic dot kernel: YNNPACK, its fast one, takes only a left operand
    whose contracted dimension is its last in memory. The barrier keeps the transpose a copy of its
    own (cheap next to the product), so the product runs on YNNPACK (about 1.6x faster for the GPT
    example's weight gradients, bench/matmul_layout.py). On an operand already in memory it copies nothing."""
    if a.ndim == 2 and b.ndim == 2 and chips.platform() == "cpu":
        return lax.optimization_barrier(a)
    return a


def _matmul(a: Array, b: Array) -> Array:
    """a @ b at the precision `matmul_precision` gives; half-precision inputs accumulate and return in
    float32, as torch's CPU kernels do before rounding once."""
    precision = matmul_precision.for_operands(a, b)
    a = _row_major_lhs(a, b)
    if a.dtype in HALF_DTYPES or b.dtype in HALF_DTYPES:
        return jnp.matmul(a, b, precision=precision, preferred_element_type=jnp.float32)
    return jnp.matmul(a, b, precision=precision)


def _affine(self: Array, product: Array, beta: object, alpha: object) -> Array:
    """beta * self + alpha * product, dropping self when beta is zero. For integer results torch casts
    alpha and beta to the integer type first (0.6 becomes 0)."""
    self = opmath(self)
    if jnp.issubdtype(product.dtype, jnp.integer):
        alpha = alpha if type(alpha) is int else jnp.asarray(alpha).astype(product.dtype)
        beta = beta if type(beta) is int else jnp.asarray(beta).astype(product.dtype)
    if not (type(alpha) is int and alpha == 1):
        product = alpha * product
    if type(beta) is int and beta == 1:
        return self + product
    if type(beta) is int and beta == 0:
        return jnp.broadcast_to(product, jnp.broadcast_shapes(self.shape, product.shape))
    return jnp.where(beta == 0, jnp.zeros_like(product), beta * self) + product


@lowers(aten.mm.default, matmul_precision=True)
def mm(self: Array, mat2: Array) -> Array:
    return _matmul(self, mat2)


@lowers(aten.bmm.default, matmul_precision=True)
def bmm(self: Array, mat2: Array) -> Array:
    return _matmul(self, mat2)


@lowers(aten.mv.default, matmul_precision=True)
def mv(self: Array, vec: Array) -> Array:
    return _matmul(self, vec)


@lowers(aten.dot.default, matmul_precision=True)
def dot(self: Array, tensor: Array) -> Array:
    return jnp.dot(self, tensor, precision=matmul_precision.for_operands(self, tensor))


@lowers(aten.vdot.default, matmul_precision=True)
def vdot(self: Array, other: Array) -> Array:
    return jnp.vdot(self, other, precision=matmul_precision.for_operands(self, other))


@lowers(aten.addmm.default, matmul_precision=True)
def addmm(self: Array, mat1: Array, mat2: Array, *, beta: object = 1, alpha: object = 1) -> Array:
    return _affine(self, _matmul(mat1, mat2), beta, alpha)


@lowers(aten.baddbmm.default, matmul_precision=True)
def baddbmm(self: Array, batch1: Array, batch2: Array, *, beta: object = 1, alpha: object = 1) -> Array:
    return _affine(self, _matmul(batch1, batch2), beta, alpha)


@lowers(aten.addbmm.default, matmul_precision=True)
def addbmm(self: Array, batch1: Array, batch2: Array, *, beta: object = 1, alpha: object = 1) -> Array:
    return _affine(self, jnp.sum(_matmul(batch1, batch2), axis=0), beta, alpha)


@lowers(aten.addmv.default, matmul_precision=True)
def addmv(self: Array, mat: Array, vec: Array, *, beta: object = 1, alpha: object = 1) -> Array:
    return _affine(self, _matmul(mat, vec), beta, alpha)


@lowers(aten.addr.default)
def addr(self: Array, vec1: Array, vec2: Array, *, beta: object = 1, alpha: object = 1) -> Array:
    outer = jnp.outer(opmath(vec1), opmath(vec2)) if vec1.dtype != jnp.bool_ else jnp.outer(vec1, vec2)
    if self.dtype == jnp.bool_:
        return (self & (beta != 0)) | (outer & (alpha != 0))
    return _affine(self, outer, beta, alpha)


_FLOAT8 = tuple(to_jax(dtype) for dtype in FLOAT8)


@lowers(aten._scaled_mm.default)
def scaled_mm(
    self: Array, mat2: Array, scale_a: Array, scale_b: Array, bias: Array | None = None, scale_result: Array | None = None,
    out_dtype: torch.dtype | None = None, use_fast_accum: bool = False,
) -> Array:
    """A float8 matmul as torch's CPU kernel computes it: `((self * scale_a) @ (mat2 * scale_b) + bias)`
    in float32, rounded once to `out_dtype` (the inputs' dtype by default). Scales broadcast, so
    per-tensor and row-wise scales both work; `scale_result` is ignored, as on the CPU. Other
    inputs run on the host, where torch raises its own error."""
    if self.ndim != 2 or mat2.ndim != 2 or self.dtype not in _FLOAT8 or mat2.dtype not in _FLOAT8:
        raise UnloweredCase("_scaled_mm takes 2-D float8 matrices")
    if scale_a.dtype != jnp.float32 or scale_b.dtype != jnp.float32:
        raise UnloweredCase("_scaled_mm takes float32 scales")
    product = jnp.matmul(self.astype(jnp.float32) * scale_a, mat2.astype(jnp.float32) * scale_b, precision=PRECISION)
    if bias is not None:
        product = product + bias.astype(jnp.float32)
    return product.astype(jax_dtype(out_dtype) or self.dtype)


@lowers(aten.linalg_cross.default)
def linalg_cross(self: Array, other: Array, *, dim: int = -1) -> Array:
    self, other = jnp.broadcast_arrays(self, other)
    return jnp.cross(self, other, axis=canon_dim(dim, self.ndim))


# --- factorisations and solves ------------------------------------------------------------------


def _lu(a: Array) -> tuple[Array, Array]:
    lu, pivots, _ = lax.linalg.lu(a)
    return lu, (pivots + 1).astype(jnp.int32)


def _lu_info(lu: Array) -> Array:
    """LAPACK getrf's info: the 1-based index of the first exactly-zero diagonal entry of U, else 0."""
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    if diagonal.shape[-1] == 0:
        return jnp.zeros(diagonal.shape[:-1], jnp.int32)
    zero = diagonal == 0
    return jnp.where(jnp.any(zero, axis=-1), jnp.argmax(zero, axis=-1) + 1, 0).astype(jnp.int32)


def _first_failed_pivot(matrix: Array) -> Array:
    """Cholesky's info for one Hermitian matrix (lower triangle read): the order of the first leading
    minor whose elimination pivot is not positive (or NaN), else 0; unpivoted Gaussian elimination."""
    n = matrix.shape[-1]
    rows = jnp.arange(n)

    def step(k: Any, carry: tuple[Array, Array]) -> tuple[Array, Array]:
        m, info = carry
        pivot = jnp.real(m[k, k])
        failed = jnp.logical_not(pivot > 0)
        info = jnp.where((info == 0) & failed, k + 1, info)
        below = rows > k
        column = jnp.where(below, m[:, k], 0)
        update = jnp.outer(column, jnp.conj(column)) / jnp.where(failed, 1, pivot)
        return m - update, info

    return lax.fori_loop(0, n, step, (matrix, jnp.int32(0)))[1]


def _cholesky_info(a: Array, factor: Array) -> Array:
    """Cholesky's info, computed only when the factor has a NaN (XLA's factor is then all NaN)."""
    hermitian = jnp.tril(a) + jnp.conj(jnp.swapaxes(jnp.tril(a, -1), -1, -2))
    flat = hermitian.reshape((-1,) + a.shape[-2:])
    failed = jnp.any(jnp.isnan(factor.reshape(flat.shape)), axis=(-2, -1))

    def one(matrix: Array, bad: Array) -> Array:
        return lax.cond(bad, _first_failed_pivot, lambda _: jnp.int32(0), matrix)

    return jax.vmap(one)(flat, failed).reshape(a.shape[:-2]).astype(jnp.int32)


@lowers(aten._linalg_det.default)
def linalg_det(A: Array) -> tuple[Array, Array, Array]:  # noqa: N803
    lu, pivots = _lu(A)
    return jnp.linalg.det(A), lu, pivots


@lowers(aten._linalg_slogdet.default)
def linalg_slogdet(A: Array) -> tuple[Array, Array, Array, Array]:  # noqa: N803
    sign, logabsdet = jnp.linalg.slogdet(A)
    lu, pivots = _lu(A)
    return sign, logabsdet, lu, pivots


@lowers(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(A: Array, *, pivot: bool = True, check_errors: bool = False) -> tuple[Array, Array, Array]:  # noqa: N803
    lu, pivots = _lu(A)
    return lu, pivots, _lu_info(lu)


@lowers(aten.linalg_lu.default)
def linalg_lu(A: Array, *, pivot: bool = True) -> tuple[Array, Array, Array]:  # noqa: N803
    rows, cols = A.shape[-2:]
    lu, _, permutation = lax.linalg.lu(A)
    k = min(rows, cols)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(rows, k, dtype=A.dtype)
    upper = jnp.triu(lu[..., :k, :])
    p = jnp.swapaxes(jax.nn.one_hot(permutation, rows, dtype=A.dtype), -1, -2)
    return p, lower, upper


@lowers(aten.linalg_inv_ex.default)
def linalg_inv_ex(A: Array, *, check_errors: bool = False) -> tuple[Array, Array]:  # noqa: N803
    return jnp.linalg.inv(A), _lu_info(_lu(A)[0])


def _is_vector_rhs(A: Array, B: Array) -> bool:  # noqa: N803
    return B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])


@lowers(aten._linalg_solve_ex.default)
def linalg_solve_ex(A: Array, B: Array, *, left: bool = True, check_errors: bool = False) -> tuple[Array, Array, Array, Array]:  # noqa: N803
    vector = _is_vector_rhs(A, B)
    rhs = B[..., None] if vector else B
    if left:
        batch = jnp.broadcast_shapes(A.shape[:-2], rhs.shape[:-2])
        a = jnp.broadcast_to(A, batch + A.shape[-2:])
        result = jnp.linalg.solve(a, jnp.broadcast_to(rhs, batch + rhs.shape[-2:]))
    else:
        at = jnp.swapaxes(A, -1, -2)
        rt = jnp.swapaxes(rhs, -1, -2)
        batch = jnp.broadcast_shapes(at.shape[:-2], rt.shape[:-2])
        result = jnp.swapaxes(jnp.linalg.solve(jnp.broadcast_to(at, batch + at.shape[-2:]), jnp.broadcast_to(rt, batch + rt.shape[-2:])), -1, -2)
    if vector:
        result = result[..., 0]
    lu, pivots = _lu(A)
    return result, lu, pivots, _lu_info(lu)


@lowers(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(self: Array, *, upper: bool = False, check_errors: bool = False) -> tuple[Array, Array]:
    lower = jnp.linalg.cholesky(self)
    return (jnp.conj(jnp.swapaxes(lower, -1, -2)) if upper else lower), _cholesky_info(self, lower)


@lowers(aten.linalg_qr.default)
def linalg_qr(A: Array, mode: str = "reduced") -> tuple[Array, Array]:  # noqa: N803
    if mode == "r":
        return jnp.zeros((0,), A.dtype), jnp.linalg.qr(A, mode="r")
    q, r = jnp.linalg.qr(A, mode=mode)
    return q, r


@lowers(aten._linalg_svd.default)
def linalg_svd(A: Array, full_matrices: bool = False, compute_uv: bool = True, *, driver: str | None = None) -> tuple[Array, Array, Array]:  # noqa: N803
    if not compute_uv:
        empty = jnp.zeros((0,), A.dtype)
        return empty, jnp.linalg.svd(A, compute_uv=False), empty
    u, s, vh = jnp.linalg.svd(A, full_matrices=full_matrices)
    return u, s, vh


@lowers(aten._linalg_eigh.default)
def linalg_eigh(A: Array, UPLO: str = "L", compute_v: bool = True) -> tuple[Array, Array]:  # noqa: N803
    values, vectors = jnp.linalg.eigh(A, UPLO=UPLO, symmetrize_input=False)
    return values, (vectors if compute_v else jnp.zeros((0,), A.dtype))


def _triangular_solve(a: Array, b: Array, *, upper: bool, left: bool, unitriangular: bool, transpose: bool = False) -> Array:
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular)


@lowers(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(self: Array, B: Array, *, upper: bool, left: bool = True, unitriangular: bool = False) -> Array:  # noqa: N803
    return _triangular_solve(self, B, upper=upper, left=left, unitriangular=unitriangular)


@lowers(aten.triangular_solve.default)
def triangular_solve(self: Array, A: Array, upper: bool = True, transpose: bool = False, unitriangular: bool = False) -> tuple[Array, Array]:  # noqa: N803
    solution = _triangular_solve(A, self, upper=upper, left=True, unitriangular=unitriangular, transpose=transpose)
    coefficient = jnp.broadcast_to(A, solution.shape[:-2] + A.shape[-2:])
    return solution, coefficient


@lowers(aten.cholesky_solve.default)
def cholesky_solve(self: Array, input2: Array, upper: bool = False) -> Array:
    lower = jnp.conj(jnp.swapaxes(input2, -1, -2)) if upper else input2
    half = _triangular_solve(lower, self, upper=False, left=True, unitriangular=False)
    upper_factor = jnp.conj(jnp.swapaxes(lower, -1, -2))
    return _triangular_solve(upper_factor, half, upper=True, left=True, unitriangular=False)


@lowers(aten.cholesky_inverse.default)
def cholesky_inverse(self: Array, upper: bool = False) -> Array:
    factor = jnp.conj(jnp.swapaxes(self, -1, -2)) if upper else self
    identity = jnp.broadcast_to(jnp.eye(self.shape[-1], dtype=self.dtype), self.shape)
    return cholesky_solve(identity, factor, upper=False)


@lowers(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(self: Array) -> Array:
    return jax.scipy.linalg.expm(opmath(self))


@lowers(aten._cdist_forward.default)
def cdist_forward(x1: Array, x2: Array, p: float, compute_mode: int | None) -> Array:
    differences = x1[..., :, None, :] - x2[..., None, :, :]
    return vector_norm(differences, p, (differences.ndim - 1,), False)


@lowers(aten._pdist_forward.default)
def pdist_forward(self: Array, p: float = 2.0) -> Array:
    rows, cols = np.triu_indices(self.shape[0], 1)
    return vector_norm(self[rows] - self[cols], p, (1,), False)


def _pair_norms(differences: Array, p: float) -> Array:
    """p-norms over the last dim, with a zero gradient where a difference is all zeros (torch's
    `_cdist_backward`/`_pdist_backward` at distance 0; the plain norm's gradient is NaN there)."""
    coincide = jnp.all(differences == 0, axis=-1, keepdims=True)
    safe = jnp.where(coincide, jnp.ones_like(differences), differences)
    return jnp.where(coincide[..., 0], 0.0, vector_norm(safe, p, (safe.ndim - 1,), False))


@lowers(aten._cdist_backward.default)
def cdist_backward(grad: Array, x1: Array, x2: Array, p: float, cdist: Array) -> Array:
    _, pullback = jax.vjp(lambda first: _pair_norms(first[..., :, None, :] - x2[..., None, :, :], p), x1)
    return pullback(grad)[0]


@lowers(aten._pdist_backward.default)
def pdist_backward(grad: Array, self: Array, p: float, pdist: Array) -> Array:
    rows, cols = np.triu_indices(self.shape[0], 1)
    _, pullback = jax.vjp(lambda points: _pair_norms(points[rows] - points[cols], p), self)
    return pullback(grad)[0]


@lowers(aten._euclidean_dist.default)
def euclidean_dist(x1: Array, x2: Array) -> Array:
    differences = x1[..., :, None, :] - x2[..., None, :, :]
    return jnp.sqrt(jnp.sum(differences * differences, axis=-1))



# --- LU helpers -----------------------------------------------------------------------------------


def _permutation(pivots: Array, rows: int) -> Array:
    """The row permutation of 1-based LAPACK pivots: A[perm] = L @ U."""
    return lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, rows)


@lowers(aten.lu_unpack.default)
def lu_unpack(LU_data: Array, LU_pivots: Array, unpack_data: bool = True, unpack_pivots: bool = True) -> tuple[Array, Array, Array]:  # noqa: N803
    rows, cols = LU_data.shape[-2:]
    k = min(rows, cols)
    empty = jnp.zeros((0,), LU_data.dtype)
    lower = jnp.tril(LU_data[..., :, :k], -1) + jnp.eye(rows, k, dtype=LU_data.dtype) if unpack_data else empty
    upper = jnp.triu(LU_data[..., :k, :]) if unpack_data else empty
    if not unpack_pivots:
        return empty, lower, upper
    permutation = _permutation(LU_pivots, rows)
    p = jnp.swapaxes(jax.nn.one_hot(permutation, rows, dtype=LU_data.dtype), -1, -2)
    return p, lower, upper


@lowers(aten.linalg_lu_solve.default)
def linalg_lu_solve(LU: Array, pivots: Array, B: Array, *, left: bool = True, adjoint: bool = False) -> Array:  # noqa: N803
    """Solve with a factorisation A = P L U: X = U^-1 L^-1 P^T B, and the transposed forms."""
    rows = LU.shape[-1]
    if not left:
        # X A = B  <=>  A^H X^H = B^H
        solved = linalg_lu_solve(LU, pivots, jnp.conj(jnp.swapaxes(B, -1, -2)), left=True, adjoint=not adjoint)
        return jnp.conj(jnp.swapaxes(solved, -1, -2))
    batch = jnp.broadcast_shapes(LU.shape[:-2], B.shape[:-2])
    lu = jnp.broadcast_to(LU, batch + LU.shape[-2:])
    rhs = jnp.broadcast_to(B, batch + B.shape[-2:])
    permutation = jnp.broadcast_to(_permutation(pivots, rows), batch + (rows,))
    if not adjoint:
        permuted = jnp.take_along_axis(rhs, permutation[..., None], axis=-2)
        half = lax.linalg.triangular_solve(lu, permuted, left_side=True, lower=True, unit_diagonal=True)
        return lax.linalg.triangular_solve(lu, half, left_side=True, lower=False)
    half = lax.linalg.triangular_solve(lu, rhs, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    solved = lax.linalg.triangular_solve(lu, half, left_side=True, lower=True, transpose_a=True, conjugate_a=True, unit_diagonal=True)
    inverse = jnp.argsort(permutation, axis=-1)
    return jnp.take_along_axis(solved, inverse[..., None], axis=-2)


@lowers(aten.cholesky.default)
def cholesky(self: Array, upper: bool = False) -> Array:
    return linalg_cholesky_ex(self, upper=upper)[0]


@lowers(aten._grouped_mm.default, matmul_precision=True)
def grouped_mm(self: Array, mat2: Array, offs: Array | None = None, bias: Array | None = None, out_dtype: torch.dtype | None = None) -> Array:
    """Mixture-of-experts grouped GEMM. `offs` holds the cumulative ends of the groups along the
    jagged dim of a 2-D operand; rows (or columns) past the last end come out as zeros."""
    a, b = opmath(self), opmath(mat2)
    if a.ndim == 3 and b.ndim == 3:
        out = _matmul(a, b)
    else:
        ends = offs.astype(jnp.int64)
        starts = jnp.concatenate([jnp.zeros((1,), jnp.int64), ends[:-1]])
        if a.ndim == 2 and b.ndim == 3:
            out = lax.ragged_dot(a, b, (ends - starts).astype(jnp.int32), precision=matmul_precision.for_operands(a, b))
            out = jnp.where((jnp.arange(a.shape[0]) < ends[-1])[:, None], out, jnp.zeros_like(out))
        elif a.ndim == 2 and b.ndim == 2:
            k = jnp.arange(a.shape[1])
            member = ((k[None, :] >= starts[:, None]) & (k[None, :] < ends[:, None])).astype(a.dtype)
            out = jnp.einsum("mk,gk,kn->gmn", a, member, b, precision=matmul_precision.for_operands(a, b))
        else:
            n = jnp.arange(b.shape[1])
            group = jnp.searchsorted(ends, n, side="right")
            every = jnp.einsum("gmk,kn->gmn", a, b, precision=matmul_precision.for_operands(a, b))
            picked = jnp.take_along_axis(every, jnp.clip(group, 0, a.shape[0] - 1)[None, None, :], axis=0)[0]
            out = jnp.where((group < a.shape[0])[None, :], picked, jnp.zeros_like(picked))
    return out if bias is None else out + opmath(bias)
