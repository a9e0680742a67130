"""The device timeline gives each execution once: those of a flush with recorded ops as their ops
come (with those ops), then those without a flush, then those of flushes without recorded ops, each
flush's together, in the order of their first execution; integer or not, the times come back as stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from tputrace.analysis.target import target_chip
from tputrace.derived.device_runs import device_runs
from tputrace.derived.trace_tables import TraceTables
from tputrace.store.reader import open_trace
from tputrace.store.writer import TraceWriter


def _trace(path: Path, last_dur_ns: float) -> Path:
    with TraceWriter(path) as writer:
        writer.set_run(world_size=1, script="train.py", argv=[], platform="cpu", eager_mode="DEFER_AND_FUSE")
        add = writer.intern("aten.add.Tensor")
        for seq in (1, 2):  # flush 1 ran program 7 with two recorded ops
            writer.append("ops", (seq, 0, add, None, None, 0, seq * 100, 50, None, None, 1, 7, 1))
        # (rank, program, chip, start, dur, step, flush): flush 1 ran on two chips; flushes 2 and 3
        # have no recorded ops, and flush 3's execution comes first on chip 0; one ran without a flush.
        writer.append("executions", (0, 8, 0, 5_000, 100, 1, 2))
        writer.append("executions", (0, 7, 1, 1_000, 300, 1, 1))
        writer.append("executions", (0, 9, 0, 2_000, 100, 1, 3))
        writer.append("executions", (0, 7, 0, 1_000, 300, 1, 1))
        writer.append("executions", (0, 9, 1, 4_000, 100, 1, None))
        writer.append("executions", (0, 8, 1, 6_000, last_dur_ns, 1, 2))
    return path


@pytest.mark.parametrize("last_dur_ns", [200, 200.5], ids=["ints", "a float"])
def test_each_execution_comes_once_in_flush_order(tmp_path: Path, last_dur_ns: float) -> None:
    with open_trace(_trace(tmp_path / "runs.tptrace", last_dur_ns)) as trace:
        runs = list(device_runs(TraceTables(trace), 0, target_chip("v5e")))

    assert [(run.flush_id, run.chip, run.program_id) for run in runs] == [
        (1, 0, 7), (1, 1, 7), (None, 1, 9), (3, 0, 9), (2, 0, 8), (2, 1, 8),
    ]
    assert [len(run.op_keys) for run in runs][:2] == [2, 2]
    assert [run.op_seqs for run in runs][:2] == [[1, 2], [1, 2]]
    assert (runs[-1].start_ns, runs[-1].dur_ns) == (6_000, last_dur_ns)
    assert [run.start_ns for run in runs] == [1_000, 1_000, 4_000, 2_000, 5_000, 6_000]
