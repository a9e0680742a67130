"""The sharding records and analyzers on traces written by hand (no torch): calls in flight together
count once in a step's share, causes lead to the line and the fix, and a format-1 file (no sharding
tables, no `collectives.cause_id`) still opens, analyses and merges."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from tputrace.analysis import analyze
from tputrace.merge import merge_traces
from tputrace.store import open_trace
from tputrace.store.sharding import read_sharding
from tputrace.store.writer import TraceWriter

MS = 1_000_000
SCRIPT = "/proj/train.py"
STEPS = 4
STEP_NS = 20 * MS


def _write(path: Path, *, buckets: int, bucket_ns: int, rank: int = 0, caused: bool = True) -> Path:
    """A 2-rank DDP run of `STEPS` steps: each step a short program, then `buckets` all-reduces that all
    overlap (issued together, finishing together)."""
    writer = TraceWriter(path, rank=rank, created_unix_ns=1_700_000_000_000_000_000)
    writer.set_run(world_size=2, script=SCRIPT, argv=[], platform="cpu", host="one-host", eager_mode="DEFER_AND_FUSE",
                   start_unix_ns=1_700_000_000_000_000_000)
    ddp_line = writer.frame(SCRIPT, 12, "<module>")
    backward_line = writer.frame(SCRIPT, 20, "<module>")
    cause_id = writer.next_id("collective_causes")
    writer.append("collective_causes", (cause_id, rank, "ddp_bucket", "backward", writer.intern("Net"), None, None, None, None, None, None,
                                        None, 0, 10_000, None, ddp_line))
    writer.append("parameter_placements", (rank, writer.intern("Net.fc.weight"), writer.intern("Net.fc"), "ddp", None, None, "Replicate()",
                                           "64,64", "64,64", "f32", 16384, 16384, ddp_line))
    group, ranks = writer.intern("0"), writer.intern("0,1")
    for step in range(STEPS):
        start = step * STEP_NS
        writer.append("steps", (rank, step, start, start + STEP_NS, "optimizer"))
        writer.append("executions", (rank, 1, 0, start, 2 * MS, step, None))
        for _ in range(buckets):
            writer.append("collectives", (rank, "all_reduce", 4096, "f32", group, ranks, backward_line, start + 3 * MS, bucket_ns, None, "gloo:ring", None,
                                          step, cause_id if caused else None))
    writer.update_run(end_ns=STEPS * STEP_NS, exit_status=0)
    writer.close()
    return path


def _as_format_1(path: Path) -> Path:
    """Rewrite a trace as an older tputrace left it: no SQL views, no sharding tables, no cause column, format 1."""
    connection = sqlite3.connect(path)
    for (view,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'view'").fetchall():
        connection.execute(f"DROP VIEW {view}")
    for table in ("device_meshes", "parameter_placements", "collective_causes"):
        connection.execute(f"DROP TABLE {table}")
    connection.execute("DROP INDEX IF EXISTS idx_collectives_rank_start_ns")
    connection.execute("ALTER TABLE collectives DROP COLUMN cause_id")
    connection.execute("UPDATE meta SET value = '1' WHERE key = 'format_version'")
    connection.commit()
    connection.close()
    return path


def test_calls_in_flight_together_count_once_in_a_steps_share(tmp_path: Path) -> None:
    # 12 all-reduces of 15 ms each, all in flight at once: 180 ms summed in a 20 ms step, 15 ms in fact
    trace_path = _write(tmp_path / "overlap.tptrace", buckets=12, bucket_ns=15 * MS, caused=False)
    with open_trace(trace_path) as trace:
        report = analyze(trace)
    share = report.results["collectives"].data.collective_share_of_step
    assert 0.7 <= share <= 0.8  # 15 of 20 ms
    texts = " ".join(f"{finding.title} {finding.explanation}" for finding in report.findings)
    shares = [float(value) for value in re.findall(r"(\d+(?:\.\d+)?)% of (?:each|a) step", texts)]
    assert shares and all(value <= 100 for value in shares)


def test_small_ddp_buckets_lead_to_the_constructor_line(tmp_path: Path) -> None:
    trace_path = _write(tmp_path / "buckets.tptrace", buckets=12, bucket_ns=MS)
    with open_trace(trace_path) as trace:
        report = analyze(trace)
        records = read_sharding(trace, 0)
    assert len(records.causes) == 1 and len(records.parameters) == 1
    buckets = [finding for finding in report.findings if finding.analyzer == "sharding" and "DDP buckets" in finding.title]
    assert len(buckets) == 1
    assert (buckets[0].file, buckets[0].line) == (SCRIPT, 12)
    assert "bucket_cap_mb=1" in buckets[0].suggestion
    assert not any(finding.analyzer == "collectives" and "small" in finding.title.lower() for finding in report.findings)


def test_one_host_of_virtual_chips_makes_waits_info_without_a_cost(tmp_path: Path) -> None:
    trace_path = _write(tmp_path / "waits.tptrace", buckets=2, bucket_ns=8 * MS)
    other = _write(tmp_path / "waits1.tptrace", buckets=2, bucket_ns=8 * MS, rank=1)
    merged = tmp_path / "merged.tptrace"
    merge_traces([trace_path, other], merged)
    with open_trace(merged) as trace:
        report = analyze(trace)
    for finding in report.findings:
        if finding.analyzer == "collectives" and "wait" in finding.title:
            assert finding.severity == "info" and finding.cost_total_ns == 0.0


def test_a_format_1_trace_opens_analyses_and_merges(tmp_path: Path) -> None:
    old = _as_format_1(_write(tmp_path / "old.tptrace", buckets=3, bucket_ns=MS))
    with open_trace(old) as trace:
        assert trace.format_version == 1
        records = read_sharding(trace, 0)
        assert not records.causes and not records.parameters
        assert all(collective.cause_id is None for collective in records.collectives) and len(records.collectives) == 3 * STEPS
        assert all(record.cause_id is None for record in trace.records("collectives"))
        report = analyze(trace)
    assert report.results["sharding"].data.parameters == 0 and report.results["collectives"].data.count == 3 * STEPS
    merged = tmp_path / "merged_old.tptrace"
    merge_traces([old, _as_format_1(_write(tmp_path / "old1.tptrace", buckets=3, bucket_ns=MS, rank=1))], merged)
    with open_trace(merged) as trace:
        assert trace.count("collectives") == 2 * 3 * STEPS
