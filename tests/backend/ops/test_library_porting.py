"""Library code that CUDA scripts run unchanged: `torch.nn.utils.rnn.unpack_sequence` and writes
through a host mask (`x[host_mask] = values`, and the backward of `x[host_mask]`), and the Gamma,
Beta and Dirichlet samplers of `torch.distributions`, on the chip, compared with the CPU."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence, unpack_sequence

from backend_helpers import eager, host, recorded_fallbacks
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
mode_ids = pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
D = torch.distributions


def _host_mask_writes(device: str) -> list[torch.Tensor]:
    mask = torch.tensor([True, False, True, False])
    assigned = torch.zeros(4, 2, device=device)
    assigned[mask] = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).to(device)
    accumulated = torch.ones(4, 2, device=device).index_put_((mask,), torch.full((2, 2), 5.0).to(device), accumulate=True)
    return [assigned, accumulated]


def _unpacked_sequences(device: str) -> list[torch.Tensor]:
    """unpack_sequence cuts each padded row with a mask built from the host lengths; its backward
    writes the gradient through that host mask."""
    torch.manual_seed(0)
    sequences = [torch.randn(length, 5).to(device).requires_grad_() for length in (3, 6, 1)]
    gru = torch.nn.GRU(5, 4, bidirectional=True).to(device)
    output, _ = gru(pack_sequence(sequences, enforce_sorted=False))
    unpacked = unpack_sequence(output)
    sum((sequence.pow(2) * (index + 1)).sum() for index, sequence in enumerate(unpacked)).backward()
    return [*unpacked, *(sequence.grad for sequence in sequences), *(parameter.grad for parameter in gru.parameters())]


@mode_ids
@pytest.mark.parametrize("case", [_host_mask_writes, _unpacked_sequences], ids=["host_mask_writes", "unpack_sequence"])
def test_writes_through_a_host_mask_match_cpu(mode: EagerMode, case: object) -> None:
    expected = case("cpu")
    with eager(mode):
        result = case("tpu")
    assert len(result) == len(expected)
    for got, want in zip(result, expected):
        torch.testing.assert_close(host(got), want, rtol=1e-5, atol=1e-5)


@mode_ids
def test_a_host_mask_with_the_wrong_number_of_values_keeps_torchs_error(mode: EagerMode) -> None:
    with eager(mode), pytest.raises(RuntimeError, match=r"shape mismatch: value tensor of shape \[3\] cannot be broadcast to indexing result of shape \[2\]"):
        torch.zeros(4, device="tpu")[torch.tensor([True, False, True, False])] = torch.ones(3, device="tpu")


@mode_ids
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_standard_gamma_raises_underflowing_draws_to_the_smallest_normal(mode: EagerMode, dtype: torch.dtype) -> None:
    """About half of the draws of Gamma(0.001) underflow; torch's `_standard_gamma` raises them to the
    dtype's smallest normal number (never 0, where `log_prob` is infinite), as on the CPU."""
    concentration = torch.full((4000,), 0.001, dtype=dtype)
    with eager(mode):
        draws = host(torch._standard_gamma(concentration.to("tpu")))
    assert draws.dtype == dtype and draws.min().item() == torch._standard_gamma(concentration).min().item() == torch.finfo(dtype).tiny


def _dirichlet_draws(seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    concentration = torch.tensor([[0.001, 100.0, 1.0], [0.5, 2.0, 1.0]], device="tpu")
    dirichlet = D.Dirichlet(concentration, validate_args=True).sample((20000,))
    beta = D.Beta(torch.tensor([0.5, 2.0], device="tpu"), torch.tensor([1.5, 3.0], device="tpu"), validate_args=True).sample((20000,))
    return [dirichlet, beta]


@mode_ids
def test_dirichlet_and_beta_samples_are_drawn_on_the_chip(mode: EagerMode) -> None:
    """`_sample_dirichlet` (Dirichlet and Beta sampling) has a lowering: no host fallback, the CPU's
    shapes, dtypes and support, the right means, the same draws after the same seed."""
    torch.manual_seed(0)
    cpu_dirichlet = D.Dirichlet(torch.tensor([[0.001, 100.0, 1.0], [0.5, 2.0, 1.0]])).sample((20000,))
    with eager(mode), recorded_fallbacks() as fallbacks:
        dirichlet, beta = (host(draws) for draws in _dirichlet_draws(0))
        again = [host(draws) for draws in _dirichlet_draws(0)]
    assert fallbacks == []
    assert dirichlet.shape == cpu_dirichlet.shape and dirichlet.dtype == cpu_dirichlet.dtype
    assert dirichlet.min() > 0 and torch.allclose(dirichlet.sum(-1), torch.ones(()), atol=1e-5)
    torch.testing.assert_close(dirichlet[:, 1].mean(0), torch.tensor([0.5, 2.0, 1.0]) / 3.5, atol=0.01, rtol=0.03)
    torch.testing.assert_close(beta.mean(0), torch.tensor([0.25, 0.4]), atol=0.01, rtol=0.03)
    assert torch.equal(again[0], dirichlet) and torch.equal(again[1], beta)


@mode_ids
def test_dirichlet_rsample_gradient_matches_the_analytic_gradient(mode: EagerMode) -> None:
    """d E[x_0] / d alpha for x ~ Dirichlet(alpha), E[x_0] = alpha_0 / sum(alpha), estimated from
    reparameterised samples drawn on the chip."""
    with eager(mode), recorded_fallbacks() as fallbacks:
        torch.manual_seed(2)
        concentration = torch.tensor([1.0, 2.0, 3.0], device="tpu", requires_grad=True)
        D.Dirichlet(concentration).rsample((20000,)).mean(0)[0].backward()
        gradient = host(concentration.grad)
    assert fallbacks == []
    total = 6.0
    torch.testing.assert_close(gradient, torch.tensor([1 / total - 1 / total**2, -1 / total**2, -1 / total**2]), atol=0.01, rtol=0.05)
