"""`histc` of integer tensors runs on tpu as on CUDA (torch's CPU kernel refuses integer dtypes):
Mixture-of-Experts layers count their tokens per expert so (`torch.histc(expert_ids, bins=E, min=0,
max=E-1)` on accelerators). The counts equal the CPU histogram of the same values as floats, in the
input's dtype, in both eager modes, with no CPU fallback."""

from __future__ import annotations

import pytest
import torch

from backend_helpers import eager, recorded_fallbacks
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
IDS = [5, 0, 7, 3, 3, 1, 7, 7, 2, 0, 6, 4, 4, 4, 1]


def _expected(values: torch.Tensor, **options: float) -> torch.Tensor:
    return torch.histc(values.float(), **options).to(values.dtype)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_expert_counts_match_the_float_histogram(mode: EagerMode, dtype: torch.dtype) -> None:
    ids = torch.tensor(IDS, dtype=dtype)
    with eager(mode), recorded_fallbacks() as fallbacks:
        counts = torch.histc(ids.to("tpu"), bins=8, min=0, max=7).cpu()
    assert fallbacks == []
    assert counts.dtype == dtype
    assert torch.equal(counts, _expected(ids, bins=8, min=0, max=7))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize(
    "options",
    [{"bins": 4}, {"bins": 3, "min": 0, "max": 9}, {"bins": 5, "min": -3, "max": 12}, {"bins": 2, "min": 4, "max": 4}],
    ids=["data range", "given range", "range wider than the data", "equal bounds use the data"],
)
def test_ranges_and_values_outside_them(mode: EagerMode, options: dict) -> None:
    values = torch.tensor([0, 3, 5, 9, 10, -2, 9, 14], dtype=torch.int64)
    with eager(mode):
        counts = torch.histc(values.to("tpu"), **options).cpu()
    assert torch.equal(counts, _expected(values, **options))


def test_a_constant_tensor_and_an_empty_one() -> None:
    constant = torch.full((6,), 3, dtype=torch.int32)
    assert torch.equal(torch.histc(constant.to("tpu"), bins=4).cpu(), _expected(constant, bins=4))
    assert torch.equal(torch.histc(torch.ones(0, dtype=torch.int64, device="tpu"), bins=3).cpu(), torch.zeros(3, dtype=torch.int64))


def test_argument_errors_are_still_torchs() -> None:
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(torch.tensor(IDS, device="tpu"), bins=0)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(torch.tensor(IDS, device="tpu"), bins=3, min=5, max=1)
