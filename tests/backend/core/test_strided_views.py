"""`as_strided` on `tpu` addresses the storage as torch's does, in both eager modes and compiled."""

from __future__ import annotations

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_as_strided_without_an_offset_starts_at_the_tensors_own_offset(mode: EagerMode) -> None:
    """torch's default `storage_offset` is the tensor's own, not 0: a window over a slice."""
    values = torch.arange(16.0)
    with eager(mode):
        for device in ("cpu", "tpu"):
            window = values.to(device)[5:].as_strided((3,), (2,))
            assert window.storage_offset() == 5
            assert host(window).tolist() == [5.0, 7.0, 9.0]
        view = values.to("tpu")[5:]
        view.as_strided_((2, 2), (1, 2))
        assert view.storage_offset() == 5 and host(view).tolist() == [[5.0, 7.0], [6.0, 8.0]]


def test_compiled_as_strided_without_an_offset_starts_at_the_inputs_offset() -> None:
    def window(x: torch.Tensor) -> torch.Tensor:
        return x[5:].as_strided((3,), (2,)) * 1

    values = torch.arange(16.0)
    assert host(torch.compile(window, backend="tpu")(values.to("tpu"))).tolist() == window(values).tolist()


def _as_strided_of_dtype_views(device: str) -> list[list]:
    floats = torch.tensor([2.0, -1.5, 0.25, 8.0], device=device)
    ints = torch.arange(8, dtype=torch.int32, device=device)
    read = [
        floats.view(torch.int32).as_strided((2,), (1,), 1).tolist(),
        floats.view(torch.int16).as_strided((3,), (2,), 1).tolist(),
        ints.view(torch.int16).as_strided((3,), (2,), 0).tolist(),
        ints.view(torch.int64).as_strided((2,), (2,), 0).tolist(),
        ints[2:].view(torch.float32).as_strided((2,), (1,)).view(torch.int32).tolist(),
    ]
    floats.view(torch.int32).as_strided((2,), (1,), 1).fill_(0)
    halves = torch.arange(4.0, device=device)
    halves.view(torch.int16).as_strided((2,), (4,), 1).fill_(7)
    return [*read, floats.tolist(), halves.view(torch.int32).tolist()]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_as_strided_of_a_dtype_view_addresses_the_reinterpreted_storage(mode: EagerMode) -> None:
    """`x.view(torch.int16).as_strided(...)` reads and writes the storage's bytes as int16 elements,
    as the CPU's does: the values were the buffer's, converted, and a write of the same width failed."""
    expected = _as_strided_of_dtype_views("cpu")
    with eager(mode):
        assert _as_strided_of_dtype_views("tpu") == expected
