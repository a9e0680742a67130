"""Program execution time counts each instant a chip had a program in flight once."""

from __future__ import annotations

from pathlib import Path

import tputrace
from tputrace.derived.steps import step_rows
from tputrace.store import TraceWriter

MS = 1_000_000


def _queued_programs_trace(path: Path) -> Path:
    """Two chips; chip 0 gets three programs launched back to back, each `executions` row lasting from its launch
    to its outputs ready (so the later ones include their wait behind the earlier): busy 0-30 ms. Chip 1 runs one
    program, 5-15 ms. Step 1 is 0-20 ms, step 2 20-40 ms."""
    writer = TraceWriter(path)
    for step, (start_ns, end_ns) in enumerate(((0, 20 * MS), (20 * MS, 40 * MS)), start=1):
        writer.append("steps", (0, step, start_ns, end_ns, None))
    for chip, start_ms, end_ms, step in ((0, 0, 10, 1), (0, 1, 20, 1), (0, 2, 30, 2), (1, 5, 15, 1)):
        writer.append("executions", (0, None, chip, start_ms * MS, (end_ms - start_ms) * MS, step, None))
    writer.close()
    return path


def test_queued_programs_count_once_per_chip(tmp_path: Path) -> None:
    with tputrace.open(_queued_programs_trace(tmp_path / "t.tptrace")) as trace:
        assert trace.time_split(rank=0).execution_ns == 30 * MS + 10 * MS
        per_step = {row.step: row.execution_ns for row in step_rows(trace, 0, breakdown=True)}
        assert per_step == {1: 20 * MS + 10 * MS, 2: 28 * MS}


def test_timeline_chip_lanes_count_queued_programs_once(tmp_path: Path) -> None:
    from tui.queries.timeline import timeline_lanes

    with tputrace.open(_queued_programs_trace(tmp_path / "t.tptrace")) as trace:
        lanes = {lane.lane.name: lane for lane in timeline_lanes(trace, 0, 0, 40 * MS, 4)}
        assert [round(share, 6) for share in lanes["tpu:0 exec"].busy] == [1.0, 1.0, 1.0, 0.0]
        assert [round(share, 6) for share in lanes["tpu:1 exec"].busy] == [0.5, 0.5, 0.0, 0.0]
