"""Writes through views that change values or relabel the dtype reach the base as on the CPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from backend_helpers import eager
from tputrace.backend.compat.device_module import EagerMode

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]


def _conjugate_writes(device: str) -> list:
    values = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    first = values.to(device, copy=True)
    conjugate = first.conj()
    conjugate[0] = 10 + 10j
    second = values.to(device, copy=True)
    second.conj().imag.fill_(1.0)
    third = values.to(device, copy=True)
    third.conj()[1:].mul_(2j)
    return [first.tolist(), conjugate.tolist(), second.tolist(), third.tolist()]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_write_through_a_conjugate_view_stores_its_conjugate(mode: EagerMode) -> None:
    """`z.conj()[0] = v` stores conj(v) in `z`, and `z.conj().imag.fill_(1)` stores -1 as the
    imaginary part; both were written as they came."""
    expected = _conjugate_writes("cpu")
    with eager(mode):
        assert _conjugate_writes("tpu") == expected


_SAME_DTYPE_WRITES: dict[str, tuple[torch.dtype, Callable[[torch.Tensor], object]]] = {
    "float32 as float32, a row": (torch.float32, lambda x: x.view(torch.float32)[0].fill_(1)),
    "int32 as int32, transposed": (torch.int32, lambda x: x.view(torch.int32).t().mul_(3)),
    "int32 as int16 twice, a row": (torch.int32, lambda x: x.view(torch.int16).view(torch.int16)[0].fill_(1)),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", list(_SAME_DTYPE_WRITES))
def test_a_write_through_a_view_as_its_own_dtype_reaches_the_base(mode: EagerMode, case: str) -> None:
    """`x.view(x.dtype)` is an alias: a write through a view of it failed ("Incompatible types for
    broadcasting")."""
    dtype, write = _SAME_DTYPE_WRITES[case]
    expected = torch.arange(8).reshape(2, 4).to(dtype)
    write(expected)
    with eager(mode):
        chip = torch.arange(8).reshape(2, 4).to(dtype).to("tpu")
        write(chip)
        assert chip.tolist() == expected.tolist()
