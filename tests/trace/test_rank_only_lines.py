"""The lines only one rank runs, which make it a straggler of its own work, read from merged traces written by hand:
only the steps every rank recorded whole count, so a rank whose trace stops early (killed mid-step) does not make the
other ranks' later lines look like their own work."""

from __future__ import annotations

from pathlib import Path

from tputrace.analysis.collective_stragglers import lines_only_on
from tputrace.merge import merge_traces
from tputrace.store import open_trace
from tputrace.store.writer import TraceWriter

MS = 1_000_000
SCRIPT = "/proj/train.py"


def _write(path: Path, rank: int, lines_by_step: dict[int, list[int]]) -> Path:
    writer = TraceWriter(path, rank=rank, created_unix_ns=1_700_000_000_000_000_000)
    writer.set_run(world_size=2, script=SCRIPT, argv=[], platform="cpu", host="one-host", eager_mode="DEFER_AND_FUSE",
                   start_unix_ns=1_700_000_000_000_000_000)
    op_sid = writer.intern("aten.mm.default")
    seq = 0
    for step, lines in sorted(lines_by_step.items()):
        start = step * 20 * MS
        writer.append("steps", (rank, step, start, start + 20 * MS, "optimizer"))
        for line in lines:
            seq += 1
            writer.append("ops", (seq, rank, op_sid, None, None, 0, start + seq * 10, 5, writer.frame(SCRIPT, line, "<module>"), None, step, None, None))
    writer.update_run(end_ns=len(lines_by_step) * 20 * MS, exit_status=0)
    writer.close()
    return path


def _merged(tmp_path: Path, rank0: dict[int, list[int]], rank1: dict[int, list[int]]) -> Path:
    merged = tmp_path / "merged.tptrace"
    merge_traces([_write(tmp_path / "rank0.tptrace", 0, rank0), _write(tmp_path / "rank1.tptrace", 1, rank1)], merged)
    return merged


def test_a_line_only_one_rank_runs_every_step_is_its_own(tmp_path: Path) -> None:
    merged = _merged(tmp_path, {step: [10] for step in range(5)}, {step: [10, 20] for step in range(5)})
    with open_trace(merged) as trace:
        assert [(location.line, calls) for location, calls in lines_only_on(trace, 1, [0])] == [(20, 3)]


def test_the_steps_a_killed_rank_did_not_record_whole_do_not_count(tmp_path: Path) -> None:
    # rank 0 was killed in step 1 before it reached line 20; rank 1 went on to record steps 1 and 2 whole
    merged = _merged(tmp_path, {0: [10, 20], 1: [10]}, {0: [10, 20], 1: [10, 20], 2: [10, 20]})
    with open_trace(merged) as trace:
        assert lines_only_on(trace, 1, [0]) == []
