"""The programs data-dependent ops compile (`nonzero`, `x[mask]`, `x[mask, idx]` and its write,
`masked_select`, `unique`, `bincount`, `repeat_interleave`) are all in the trace, each new length's named in its recompile's diff, and a
host read of their results, or a pointwise op, a sum, a mean, a softmax or a loss on the chip, compiles no program per count
(`cuts`); results equal the CPU's in both eager modes."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest
import torch
import torch.nn.functional as F

import tputrace
from backend_helpers import eager
from tputrace.backend.compat.device_module import EagerMode
from tputrace.cli.main import main

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_backend_compiles: list[str] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **_: _backend_compiles.append(event) if event == _COMPILE_EVENT else None
)

_SCRIPT = """
import torch
torch.tpu.set_eager_mode(torch.tpu.EagerMode.{mode})
values = torch.randperm(256, generator=torch.Generator().manual_seed(0))
rows = torch.randn(256, 3, generator=torch.Generator().manual_seed(1))
chip_values, chip_rows = values.to("tpu"), rows.to("tpu")
for count in (3, 17, 40, 41, 90, 91, 200):
    mask, chip_mask = values < count, chip_values < count
    picked = chip_rows[chip_mask]
    assert torch.equal(picked.cpu(), rows[mask])
    assert torch.equal(torch.nonzero(chip_mask).cpu(), torch.nonzero(mask))
    assert torch.equal(torch.masked_select(chip_values, chip_mask).cpu(), torch.masked_select(values, mask))
    assert torch.equal(torch.unique(chip_values % count).cpu(), torch.unique(values % count))
    assert torch.equal(torch.bincount(chip_values % count).cpu(), torch.bincount(values % count))
    assert torch.equal(torch.repeat_interleave(chip_values[:8] % count % 5).cpu(), torch.repeat_interleave(values[:8] % count % 5))
    assert torch.allclose((picked * 2).sum(0).cpu(), (rows[mask] * 2).sum(0))  # run on the padded buffer
    assert torch.allclose(picked.mean(0).cpu(), rows[mask].mean(0))  # run on the padded buffer too
    assert torch.allclose(picked.prod(0).cpu(), rows[mask].prod(0))  # an op reads the cut on the chip
    assert torch.equal(chip_rows[chip_mask, torch.tensor([[1], [2]], device="tpu")].cpu(), rows[mask, torch.tensor([[1], [2]])])
    written, expected = chip_rows.clone(), rows.clone()
    written[chip_mask, torch.tensor([0], device="tpu")], expected[mask, torch.tensor([0])] = 0.0, 0.0
    assert torch.equal(written.cpu(), expected)
"""


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_traced_run_of_varying_counts_records_every_compile(tmp_path: Path, mode: EagerMode) -> None:
    """Every XLA compile of the run (JAX's own count) is a compile in the trace; the sized programs'
    and the chip-read cuts' new lengths are recompiles that name the length (in DEFER_AND_FUSE, the
    fused programs' that hold them)."""
    script = tmp_path / "counts.py"
    script.write_text(_SCRIPT.format(mode=mode.name))
    trace_path = tmp_path / "counts.tptrace"
    before = len(_backend_compiles)
    assert main(["run", "-o", str(trace_path), str(script)]) == 0
    compiled = len(_backend_compiles) - before
    with tputrace.open(trace_path) as trace:
        assert trace.count("compiles") == compiled > 0
        diffs = [trace.string(diff_sid) or "" for (diff_sid,) in trace.sql("SELECT diff_sid FROM compiles WHERE reason = 'recompile'")]
    for change in ("size ", "output_size ", "view aten.slice.Tensor: end "):
        assert any(change in diff for diff in diffs), change


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_host_read_of_a_new_count_compiles_nothing(mode: EagerMode) -> None:
    """Counts whose padded length was compiled already: `x[mask]`, `nonzero` and `unique` read on the
    host (`.cpu()`, `.tolist()`, after `.detach()`) compile no program, and equal the CPU's."""
    values = torch.randperm(300, generator=torch.Generator().manual_seed(2))
    rows = torch.randn(300, 2, generator=torch.Generator().manual_seed(3))

    def results(values: torch.Tensor, rows: torch.Tensor, count: int) -> list:
        mask = values < count
        return [rows[mask].detach().cpu(), torch.nonzero(mask).cpu(), torch.unique(values % count).tolist(), rows[:, :1][mask].cpu()]

    with eager(mode):
        chip_values, chip_rows = values.to("tpu"), rows.to("tpu")
        results(chip_values, chip_rows, 132)  # compiles the programs of the padded length 160
        before = len(_backend_compiles)
        for count in (129, 133, 140, 144):
            chip, cpu = results(chip_values, chip_rows, count), results(values, rows, count)
            assert all(torch.equal(a, b) for a, b in zip(chip[:2] + chip[3:], cpu[:2] + cpu[3:])) and chip[2] == cpu[2]
        assert len(_backend_compiles) == before


# Each case: (values, rows, count) -> an op on the chip that reads a data-dependent result.
CONSUMERS = {
    "x[mask] * 2": lambda values, rows, count: rows[values < count] * 2,
    "where of two cuts and a scalar": lambda values, rows, count: torch.where(rows[values < count] > 0, rows[values < count], 0.5),
    "cut + row": lambda values, rows, count: rows[values < count] + rows[:1],
    "x[mask].sum()": lambda values, rows, count: rows[values < count].sum(),
    "sum over the cut dim": lambda values, rows, count: (rows[values < count] * 3).sum(0),
    "sum over another dim": lambda values, rows, count: rows[values < count].sum(1, keepdim=True),
    "amax, amin": lambda values, rows, count: torch.stack([rows[values < count].amax(0), rows[values < count].amin(0)]),
    "bool sum": lambda values, rows, count: (rows[values < count] > 0).sum(0),
    "nonzero amax": lambda values, rows, count: torch.nonzero(values < count).amin(0) + torch.nonzero(values < count).amax(),
    "unique * 2": lambda values, rows, count: torch.unique(values % count) * 2,
    "x[mask, idx] sum": lambda values, rows, count: rows[values < count, torch.tensor([[0], [1]], device=rows.device)].sum(1),
    "mean over the cut dim, mean over another": lambda values, rows, count: rows[values < count].mean(0) + rows[values < count].mean(1).sum(),
    "log_softmax along another dim": lambda values, rows, count: torch.log_softmax(rows[values < count], 1),
    "cross_entropy without reduction": lambda values, rows, count: F.cross_entropy(rows[values < count], values[values < count] % 2, reduction="none"),
    "mse_loss without reduction": lambda values, rows, count: F.mse_loss(rows[values < count], rows[values < count] * 2, reduction="none"),
    "zeros_like + 1": lambda values, rows, count: torch.zeros_like(rows[values < count]) + 1,
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(CONSUMERS))
def test_a_pointwise_op_or_a_sum_of_a_new_count_compiles_nothing(mode: EagerMode, case: str) -> None:
    """Counts whose padded length was compiled already: a pointwise op, a sum, `amax` or `amin` that
    reads the result on the chip runs on the padded buffer (its padding set to the reduction's
    identity where the cut dim is reduced), compiles no program, and equals the CPU's."""
    consume = CONSUMERS[case]
    values = torch.randperm(300, generator=torch.Generator().manual_seed(4))
    rows = torch.randn(300, 2, generator=torch.Generator().manual_seed(5))
    with eager(mode):
        chip_values, chip_rows = values.to("tpu"), rows.to("tpu")
        consume(chip_values, chip_rows, 132).cpu()  # compiles the programs of the padded length 160
        before = len(_backend_compiles)
        for count in (129, 140, 144):
            torch.testing.assert_close(consume(chip_values, chip_rows, count).cpu(), consume(values, rows, count))
        assert len(_backend_compiles) == before


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_an_empty_cut_reduces_as_torch_does(mode: EagerMode) -> None:
    """Nothing selected: the sum is zeros, and `amax` over the empty dim raises torch's error (the
    padding is not reduced)."""
    rows = torch.randn(20, 3, generator=torch.Generator().manual_seed(6))
    mask = torch.zeros(20, dtype=torch.bool)
    with pytest.raises(IndexError) as on_cpu:
        rows[mask].amax(0)
    with eager(mode):
        chip_rows, chip_mask = rows.to("tpu"), mask.to("tpu")
        assert chip_rows[chip_mask].sum(0).cpu().tolist() == [0.0, 0.0, 0.0]
        with pytest.raises(IndexError) as on_tpu:
            chip_rows[chip_mask].amax(0).cpu()
    assert str(on_tpu.value) == str(on_cpu.value)


def test_views_read_and_written_on_the_chip_are_recorded_compiles(tmp_path: Path) -> None:
    """Strict mode: a view's read and write programs are compiles in the trace, and finding how a
    write lays out its view compiles nothing the trace misses."""
    script = tmp_path / "views.py"
    script.write_text(
        "import torch\n"
        "grid = torch.zeros(6, 4, device='tpu')\n"
        "grid[:, 1] = 1\n"
        "grid.t()[2:] += 2\n"
        "assert grid.t()[1:3].cpu().tolist() == [[1.0] * 6, [2.0] * 6]\n"
    )
    trace_path = tmp_path / "views.tptrace"
    before = len(_backend_compiles)
    assert main(["run", "--mode", "strict", "-o", str(trace_path), str(script)]) == 0
    compiled = len(_backend_compiles) - before
    with tputrace.open(trace_path) as trace:
        names = [trace.string(name_sid) for (name_sid,) in trace.sql("SELECT name_sid FROM compiles")]
    assert len(names) == compiled and {"view", "view_write"} <= set(names)
