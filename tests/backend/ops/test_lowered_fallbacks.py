"""Ops that used to run on the host CPU, now lowered: Householder QR (`geqrf`, `householder_product`,
`orgqr`, `ormqr`), `linalg_lstsq` with the SVD drivers, `linalg_pinv`, bicubic `grid_sample`,
antialiased `interpolate` and `_dirichlet_grad`. Each runs on the chip in both eager modes (no CPU
fallback recorded) and matches the CPU in value and, where torch has one, gradient."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import pytest
import torch
import torch.nn.functional as F

from backend_helpers import assert_matches_cpu, eager, host, recorded_fallbacks
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
DTYPES = (torch.float32, torch.float64)
mode_ids = pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
dtype_ids = pytest.mark.parametrize("dtype", DTYPES, ids=str)


def _outputs_and_grads(device: str, fn: Callable, inputs: Sequence[torch.Tensor], grad: bool) -> list[torch.Tensor]:
    """fn's outputs, and with `grad` the inputs' gradients of a weighted sum of its float outputs."""
    leaves = [value.detach().to(device).requires_grad_(grad) for value in inputs]
    result = fn(*leaves)
    outputs = list(result) if isinstance(result, tuple) else [result]
    if grad:
        weighted = [(out * torch.linspace(-1, 2, out.numel(), dtype=out.dtype, device=device).reshape(out.shape)).sum()
                    for out in outputs if out.is_floating_point() and out.numel()]
        torch.stack(weighted).sum().backward()
    return [host(out) for out in outputs] + ([host(leaf.grad) for leaf in leaves] if grad else [])


def assert_on_chip_like_cpu(mode: EagerMode, fn: Callable, *inputs: torch.Tensor, grad: bool = True, fallbacks: Sequence[str] = ()) -> None:
    """fn on tpu records exactly the given CPU fallbacks and matches fn on the CPU."""
    expected = _outputs_and_grads("cpu", fn, inputs, grad)
    with eager(mode), recorded_fallbacks() as names:
        actual = _outputs_and_grads("tpu", fn, inputs, grad)
    assert sorted(set(names)) == sorted(fallbacks)
    # Decompositions of float32 linear algebra (QR, least squares) round further from torch's LAPACK calls.
    tolerance = 1e-4 if inputs[0].dtype == torch.float32 else None
    assert_matches_cpu(actual, expected, atol=tolerance, rtol=tolerance)


# --- Householder QR -----------------------------------------------------------------------------

# Tall and batched wide in every run; the other shapes (each compiles its own programs) with `-m slow`.
SHAPES = [(5, 3), (2, 3, 7)] + [pytest.param(shape, marks=pytest.mark.slow) for shape in ((3, 5), (4, 4), (2, 6, 4))]


@mode_ids
@dtype_ids
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: str(shape))
def test_householder_qr_runs_on_the_chip(mode: EagerMode, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    a = torch.randn(shape, dtype=dtype)
    assert_on_chip_like_cpu(mode, torch.geqrf, a, grad=False)  # torch has no geqrf derivative
    rows, cols = shape[-2:]
    if rows >= cols:
        tau = torch.randn(shape[:-2] + (cols - 1,), dtype=dtype)
        assert_on_chip_like_cpu(mode, torch.linalg.householder_product, a, tau)
        assert_on_chip_like_cpu(mode, torch.orgqr, a, tau)
    tau = torch.randn(shape[:-2] + (min(rows, cols),), dtype=dtype)
    for left, transpose in itertools.product((True, False), repeat=2):
        other = torch.randn(shape[:-2] + ((rows, 3) if left else (2, rows)), dtype=dtype)
        assert_on_chip_like_cpu(mode, lambda x, t, c: torch.ormqr(x, t, c, left=left, transpose=transpose), a, tau, other)


# --- least squares and pseudo-inverse -----------------------------------------------------------


def _rank_deficient(rows: int, dtype: torch.dtype) -> torch.Tensor:
    """A wide matrix whose last two rows are combinations of the first: rank rows - 2."""
    torch.manual_seed(1)
    a = torch.randn(rows - 2, 7, dtype=dtype)
    return torch.cat([a, 2 * a[:1], a[1:2] - a[2:3]])


@mode_ids
@dtype_ids
@pytest.mark.parametrize("driver", ["gelsd", "gelss"])
def test_lstsq_svd_drivers_run_on_the_chip(mode: EagerMode, dtype: torch.dtype, driver: str) -> None:
    """Solution, rank and singular values (residuals are empty when m <= n), with gradients; rank and
    singular values keep A's own batch shape when B broadcasts it, as on the CPU."""
    torch.manual_seed(0)

    def lstsq(a: torch.Tensor, b: torch.Tensor, rcond: float | None = None) -> tuple:
        return tuple(torch.linalg.lstsq(a, b, rcond=rcond, driver=driver))

    assert_on_chip_like_cpu(mode, lstsq, torch.randn(2, 3, 7, dtype=dtype), torch.randn(2, 3, 2, dtype=dtype))
    assert_on_chip_like_cpu(mode, lstsq, torch.randn(4, 4, dtype=dtype), torch.randn(4, 3, dtype=dtype))
    assert_on_chip_like_cpu(mode, lstsq, torch.randn(2, 3, 5, dtype=dtype), torch.randn(2, 3, dtype=dtype))  # vector B
    assert_on_chip_like_cpu(mode, lstsq, torch.randn(1, 3, 5, dtype=dtype), torch.randn(4, 3, 2, dtype=dtype))
    assert_on_chip_like_cpu(mode, lstsq, _rank_deficient(5, dtype), torch.randn(5, 2, dtype=dtype), grad=False)
    assert_on_chip_like_cpu(mode, lambda a, b: lstsq(a, b, rcond=0.3), torch.randn(3, 4, 6, dtype=dtype), torch.randn(3, 4, 2, dtype=dtype), grad=False)
    assert_on_chip_like_cpu(mode, lstsq, torch.zeros(3, 4, dtype=dtype), torch.randn(3, 2, dtype=dtype), grad=False)


@mode_ids
@pytest.mark.parametrize("driver", [None, "gelsy", "gels", "gelsd"])
def test_lstsq_cases_left_on_the_host_still_match(mode: EagerMode, driver: str | None) -> None:
    """'gelsy' (the CPU default: MKL's rank estimate), 'gels' (raises on exact singularity) and tall
    'gelsd' (residuals whose shape depends on the rank) stay CPU fallbacks; the backward is lowered."""
    torch.manual_seed(0)
    assert_on_chip_like_cpu(
        mode, lambda a, b: tuple(torch.linalg.lstsq(a, b, driver=driver)), torch.randn(2, 6, 4, dtype=torch.float64),
        torch.randn(2, 6, 2, dtype=torch.float64), fallbacks=["aten.linalg_lstsq.default"],
    )


@mode_ids
@dtype_ids
def test_pinv_runs_on_the_chip(mode: EagerMode, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    a = torch.randn(2, 5, 3, dtype=dtype)
    assert_on_chip_like_cpu(mode, torch.linalg.pinv, a)
    assert_on_chip_like_cpu(mode, lambda x: torch.linalg.pinv(x, rtol=0.4), a, grad=False)
    assert_on_chip_like_cpu(mode, lambda x, tol: torch.linalg.pinv(x, atol=tol), a, torch.tensor(0.5, dtype=dtype), grad=False)
    assert_on_chip_like_cpu(mode, lambda x: torch.linalg.pinv(x @ x.mT, hermitian=True), a[0].mT.contiguous(), grad=False)
    assert_on_chip_like_cpu(mode, torch.linalg.pinv, _rank_deficient(5, dtype), grad=False)


# --- resampling ---------------------------------------------------------------------------------


@mode_ids
@dtype_ids
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_bicubic_grid_sample_runs_on_the_chip(mode: EagerMode, dtype: torch.dtype, padding_mode: str, align_corners: bool) -> None:
    """Forward and both gradients, with grid points inside, on the border and far outside the image."""
    torch.manual_seed(0)
    image = torch.randn(2, 3, 6, 7, dtype=dtype)
    grid = torch.rand(2, 5, 4, 2, dtype=dtype) * 3 - 1.5
    grid[0, 0, :3] = torch.tensor([[1.0, -1.0], [0.0, 0.5], [-4.0, 7.5]], dtype=dtype)
    assert_on_chip_like_cpu(mode, lambda x, g: F.grid_sample(x, g, mode="bicubic", padding_mode=padding_mode, align_corners=align_corners), image, grid)


@mode_ids
@dtype_ids
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_antialiased_interpolate_runs_on_the_chip(mode: EagerMode, dtype: torch.dtype, interpolation: str) -> None:
    """Downsampling (where the filter widens), upsampling, one unchanged dim, align_corners and a scale
    factor, with the input's gradient."""
    torch.manual_seed(0)
    image = torch.randn(2, 3, 9, 11, dtype=dtype)
    for size, align_corners in [((4, 5), False), ((4, 5), True), ((14, 3), False), ((9, 6), False), ((1, 1), False)]:
        assert_on_chip_like_cpu(mode, lambda x: F.interpolate(x, size=size, mode=interpolation, antialias=True, align_corners=align_corners), image)
    assert_on_chip_like_cpu(mode, lambda x: F.interpolate(x, scale_factor=0.4, mode=interpolation, antialias=True), image)


# --- reparameterised Beta/Dirichlet gradients ---------------------------------------------------


@mode_ids
@dtype_ids
def test_dirichlet_grad_runs_on_the_chip(mode: EagerMode, dtype: torch.dtype) -> None:
    """Points in each of torch's four regions (x near 0, x near 1, both shapes above 6, the rest),
    including ones where the float32 series subtract nearly equal digammas."""
    torch.manual_seed(0)
    alpha = torch.exp(torch.randn(400, dtype=torch.float64) * 2)
    beta = torch.exp(torch.randn(400, dtype=torch.float64) * 2)
    x = torch.distributions.Beta(alpha, beta).sample().clamp(1e-6, 1 - 1e-6)
    inputs = [value.to(dtype) for value in (x, alpha, alpha + beta)]
    assert_on_chip_like_cpu(mode, torch._dirichlet_grad, *inputs, grad=False)


@mode_ids
def test_beta_rsample_backward_runs_on_the_chip(mode: EagerMode) -> None:
    """The sampling (`_sample_dirichlet`) and its gradient both run on the chip."""
    concentration = torch.rand(4, 3, device="tpu").add(0.5).requires_grad_()
    with eager(mode), recorded_fallbacks() as names:
        torch.distributions.Dirichlet(concentration).rsample().sum().backward()
        assert torch.isfinite(host(concentration.grad)).all()
    assert names == []
