"""DeferAndFuse against torch on the CPU, for cases probing found wrong: each test ran differently
(or failed) in DEFER_AND_FUSE before its fix."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core.dispatch import dispatcher


@contextlib.contextmanager
def _deferred_with_size_cap(size_cap: int) -> Iterator[None]:
    """DEFER_AND_FUSE with a small size cap, so a short script flushes at the cap many times."""
    with eager(EagerMode.DEFER_AND_FUSE):
        executor = dispatcher.executor
        previous = executor.size_cap
        executor.size_cap = size_cap
        try:
            yield
        finally:
            executor.size_cap = previous


def _foreach_into_rows(device: str) -> torch.Tensor:
    """`_foreach_*_` into the rows of one tensor: each output is scattered into the base, a recorded op."""
    table = torch.zeros(4, 3, device=device)
    rows = list(table.unbind(0))
    for step in range(3):
        torch._foreach_add_(rows, [torch.full((3,), float(row + step), device=device) for row in range(4)])
        torch._foreach_mul_(rows, 1.5)
    return table


def _foreach_with_cast(device: str) -> list[torch.Tensor]:
    """`_foreach_add_` whose float16 target takes a float32 output, cast by a recorded op."""
    targets = [torch.zeros(3, dtype=torch.float16, device=device), torch.zeros(3, device=device)]
    for _ in range(3):
        torch._foreach_add_(targets, [torch.ones(3, device=device), torch.ones(3, device=device)])
    return targets


@pytest.mark.parametrize("size_cap", [2, 3, 5, 6])
def test_foreach_outputs_survive_a_size_cap_flush_between_their_writes(size_cap: int) -> None:
    """A `_foreach_*_` records one program, then writes its outputs into the targets one by one; a
    write that records an op (a scatter into a view, a cast) can flush at the size cap, and the
    outputs not written yet were dropped: 'a value of a DeferAndFuse graph that already ran was needed'."""
    rows_expected = _foreach_into_rows("cpu")
    cast_expected = _foreach_with_cast("cpu")
    with _deferred_with_size_cap(size_cap):
        rows = host(_foreach_into_rows("tpu"))
        cast = [host(tensor) for tensor in _foreach_with_cast("tpu")]
    assert torch.equal(rows, rows_expected)
    assert all(torch.equal(got, expected) for got, expected in zip(cast, cast_expected))


def test_foreach_targets_hold_arrays_after_a_size_cap_flush_between_their_writes() -> None:
    """After a flush between a `_foreach_*_`'s writes, the targets written later hold the flushed
    arrays, not the spent pending values of a graph that already ran (which kept that graph alive)."""
    from tputrace.backend.eager.deferred import LazyValue

    with _deferred_with_size_cap(2):
        table = torch.zeros(2, 3, device="tpu")
        targets = [table[0], torch.zeros(3, device="tpu"), torch.zeros(3, device="tpu")]
        torch.tpu.synchronize()
        torch._foreach_add_(targets, 1.0)
        plain = targets[1:]
        assert all(type(tensor._buf.array) is not LazyValue or tensor._buf.array.concrete is None for tensor in plain)
        assert [host(tensor).tolist() for tensor in targets] == [[1.0] * 3] * 3


@pytest.mark.parametrize("mode", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE])
def test_foreach_inplace_refuses_a_result_its_target_cannot_hold(mode: EagerMode) -> None:
    """`_foreach_mul_` of an int64 tensor by a float raises torch's error (it was cast silently), and
    the tensors before it in the list are written, as torch's per-tensor CPU path writes them."""

    def run(device: str) -> tuple[list[list], str]:
        targets = [torch.ones(3, device=device), torch.arange(3, device=device), torch.ones(3, device=device)]
        with pytest.raises(RuntimeError) as raised:
            torch._foreach_mul_(targets, [torch.full((3,), 1.5, device=device)] * 3)
        return [host(tensor).tolist() for tensor in targets], str(raised.value)

    expected = run("cpu")
    with eager(mode):
        assert run("tpu") == expected


def test_a_negative_size_raises_torchs_error_and_the_pending_work_goes_on() -> None:
    """`torch.randn(-1, device="tpu")` raised numpy's ValueError; torch raises a RuntimeError, which a
    script that catches it gets, with the ops it recorded before still run and the draws unchanged."""

    def run(device: str) -> tuple[list[float], str, list[float]]:
        torch.manual_seed(0)
        recorded = torch.arange(4.0, device=device) * 2
        with pytest.raises(RuntimeError) as raised:
            torch.randn(2, -3, device=device)
        recorded.add_(1)
        return host(recorded).tolist(), str(raised.value), host(torch.rand(3, device=device)).tolist()

    values, message, _ = run("cpu")
    with eager(EagerMode.DEFER_NEVER):
        strict = run("tpu")
    with eager(EagerMode.DEFER_AND_FUSE):
        deferred = run("tpu")
    assert strict[:2] == deferred[:2] == (values, message)
    assert deferred[2] == strict[2]
