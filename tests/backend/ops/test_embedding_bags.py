"""`nn.EmbeddingBag` on `tpu`: forward and backward on the chip (no host fallback), against the CPU."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
# Bags [1, 2, 4, 5], [], [4, 3, 2, 9], [7, 7]: an empty bag, a repeated row, and row 2 as padding.
INDICES = [1, 2, 4, 5, 4, 3, 2, 9, 7, 7]
OFFSETS = [0, 4, 4, 8]
CASES = [
    (reduction, padding_idx, include_last_offset, weighted)
    for reduction, padding_idx, include_last_offset, weighted in itertools.product(["sum", "mean", "max"], [None, 2], [False, True], [False, True])
    if not (weighted and reduction != "sum")
]


def _bag_step(device: str, reduction: str, padding_idx: int | None, include_last_offset: bool, weighted: bool, scale_grad_by_freq: bool = False) -> list[torch.Tensor]:
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(10, 3, mode=reduction, padding_idx=padding_idx, include_last_offset=include_last_offset, scale_grad_by_freq=scale_grad_by_freq).to(device)
    offsets = torch.tensor(OFFSETS + ([len(INDICES)] if include_last_offset else []), device=device)
    sample_weights = torch.linspace(0.5, 1.5, len(INDICES), device=device, requires_grad=True) if weighted else None
    out = bag(torch.tensor(INDICES, device=device), offsets, per_sample_weights=sample_weights)
    (out * torch.arange(out.numel(), device=device).reshape(out.shape)).sum().backward()
    return [host(out), host(bag.weight.grad)] + ([host(sample_weights.grad)] if weighted else [])


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(str(part) for part in case))
def test_embedding_bag_matches_cpu_on_the_chip(mode: EagerMode, case: tuple) -> None:
    expected = _bag_step("cpu", *case)
    with eager(mode), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no CPU fallback
        result = _bag_step("tpu", *case)
    for got, want in zip(result, expected):
        torch.testing.assert_close(got, want)


def test_embedding_bag_scales_gradients_by_frequency() -> None:
    """Each row's gradient divided by how often the row occurs in the batch, as `nn.Embedding` does
    (torch's CPU EmbeddingBag kernel divides by misaligned counts here, so the expectation is by hand)."""
    _, grad = _bag_step("tpu", "sum", None, False, False, scale_grad_by_freq=True)[:2]
    bag_grads = torch.arange(12.0).reshape(4, 3)
    expected = torch.zeros(10, 3)
    bag_of_position = [0, 0, 0, 0, 2, 2, 2, 2, 3, 3]
    frequency = torch.bincount(torch.tensor(INDICES), minlength=10).float()
    for row, bag_index in zip(INDICES, bag_of_position):
        expected[row] += bag_grads[bag_index] / frequency[row]
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("reduction", ["sum", "mean", "max"])
def test_positions_past_the_closing_offset_take_no_part(reduction: str) -> None:
    """With `include_last_offset`, the last offset closes the final bag: later positions are left out
    of the bag and get no gradient (torch's CPU kernel mixes them into mean's count and max)."""
    table = torch.eye(4, device="tpu", requires_grad=True)
    out = torch.nn.functional.embedding_bag(
        torch.tensor([0, 1, 2, 3], device="tpu"), table, torch.tensor([0, 2, 3], device="tpu"), mode=reduction, include_last_offset=True
    )
    out.sum().backward()
    first = [1.0, 1.0, 0.0, 0.0] if reduction == "sum" else [0.5, 0.5, 0.0, 0.0] if reduction == "mean" else [1.0, 1.0, 0.0, 0.0]
    assert host(out).tolist() == [first, [0.0, 0.0, 1.0, 0.0]]
    assert host(table.grad)[3].tolist() == [0.0] * 4
