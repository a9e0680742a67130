"""`x[mask]` and `masked_select` index on the chip: the mask's set positions are read on the host
(no sync for a host mask), and no CPU fallback runs; results and gradients match the CPU in both
eager modes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from backend_helpers import eager, host, recorded_fallbacks
from tputrace.backend.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)


def _grid(d: str) -> torch.Tensor:
    return torch.arange(24.0, device=d).reshape(4, 3, 2)


def _on(d: str, mask: torch.Tensor) -> torch.Tensor:
    return mask.to(d)


# Each case: (x, mask) -> the selection; `mask_device` places the mask ("cpu" keeps a host mask).
SELECTIONS: dict[str, Callable[[torch.Tensor, str], torch.Tensor]] = {
    "rows": lambda x, d: x[_on(d, torch.tensor([True, False, True, True]))],
    "two leading dims": lambda x, d: x[_on(d, x.detach().cpu()[..., 0] > 7)],
    "all dims": lambda x, d: x[_on(d, x.detach().cpu() % 3 == 1)],
    "inner dim": lambda x, d: x[:, _on(d, torch.tensor([False, True, True]))],
    "mask then integer index": lambda x, d: x[_on(d, torch.tensor([True, False, True, True])), :, torch.tensor([1, 0, 1], device=x.device)],
    "uint8 mask": lambda x, d: x[_on(d, torch.tensor([1, 0, 0, 1], dtype=torch.uint8))],
    "nothing selected": lambda x, d: x[_on(d, torch.zeros(4, dtype=torch.bool))],
    "masked_select": lambda x, d: torch.masked_select(x, _on(d, x.detach().cpu() > 10)),
    "masked_select broadcast": lambda x, d: x.masked_select(_on(d, torch.tensor([[True], [False], [True]]))),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("mask_device", ["cpu", "tpu"])
@pytest.mark.parametrize("case", sorted(SELECTIONS))
def test_mask_selection_matches_the_cpu_with_no_fallback(mode: EagerMode, mask_device: str, case: str) -> None:
    select = SELECTIONS[case]
    expected_input = _grid("cpu").requires_grad_()
    expected = select(expected_input, "cpu")
    expected.pow(2).sum().backward()
    with eager(mode), recorded_fallbacks() as fallbacks:
        grid = _grid("tpu").requires_grad_()
        selected = select(grid, mask_device)
        selected.pow(2).sum().backward()
        values, gradient = host(selected), host(grid.grad)
    assert "aten.index.Tensor" not in fallbacks and "aten.masked_select" not in fallbacks
    assert selected.device == torch.device("tpu:0")
    torch.testing.assert_close(values, expected.detach())
    torch.testing.assert_close(gradient, expected_input.grad)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_mask_of_the_wrong_shape_raises_torchs_error(mode: EagerMode) -> None:
    mask = torch.tensor([True, False, True])
    with pytest.raises(IndexError, match="does not match the shape of the indexed tensor") as on_cpu:
        _grid("cpu")[mask]
    with eager(mode), pytest.raises(IndexError) as on_tpu:
        _grid("tpu")[mask.to("tpu")]
    assert str(on_tpu.value) == str(on_cpu.value)
