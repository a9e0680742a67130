"""The sharding records and analyzers on traces written by hand (no torch): calls in flight together
count once in a step's share, causes lead to the line and the fix, and a format-1 file (no sharding
tables, no `collectives.cause_id`) still opens, analyses and merges."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

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


def _write_tensor_parallel(path: Path, *, round_trip: bool = False, reduce_again: bool = False, head_bytes: int = 0) -> Path:
    """A 2-rank tensor-parallel run of `STEPS` steps on one mesh: each step gathers a 32x96 Shard(0) tensor
    (the `redistribute` cause at line 20) and reduces a Partial one at line 24 (`aten.sigmoid`); with
    `round_trip` a split back at line 22 is recorded, with `reduce_again` line 25 reduces the same partial
    sums again (`aten.tanh`); `head_bytes` adds a replicated `Net.head` next to the planned `Net.up`."""
    writer = TraceWriter(path, rank=0, created_unix_ns=1_700_000_000_000_000_000)
    writer.set_run(world_size=2, script=SCRIPT, argv=[], platform="cpu", host="one-host", eager_mode="DEFER_NEVER",
                   start_unix_ns=1_700_000_000_000_000_000)
    mesh = writer.next_id("device_meshes")
    writer.append("device_meshes", (mesh, 0, "2", "tp", "[0, 1]", None))
    lines = {number: writer.frame(SCRIPT, number, "<module>") for number in (10, 20, 22, 24, 25)}

    def cause(kind: str, op: str, src: str, dst: str, shape: str, origin: int | None = None) -> int:
        cause_id = writer.next_id("collective_causes")
        writer.append("collective_causes", (cause_id, 0, kind, "forward", None, None, writer.intern(op), mesh, src, dst, shape, shape, None,
                                            None, None, origin))
        return cause_id

    gather = cause("redistribute", "redistribute", "Shard(0)", "Replicate()", "32,96")
    reduce = cause("redistribute", "aten.sigmoid.default", "Partial(sum)", "Replicate()", "24,64")
    again = cause("reduce_again", "aten.tanh.default", "Partial(sum)", "Replicate()", "24,64") if reduce_again else None
    if round_trip:
        cause("round_trip", "redistribute", "Replicate()", "Shard(0)", "32,96", lines[22])
    writer.append("parameter_placements", (0, writer.intern("Net.up.weight"), writer.intern("Net.up"), "tp", writer.intern("ColwiseParallel()"), mesh,
                                           "Shard(0)", "256,64", "128,64", "f32", 65536, 32768, lines[10]))
    if head_bytes:
        writer.append("parameter_placements", (0, writer.intern("Net.head.weight"), writer.intern("Net.head"), "none", None, None, "Replicate()",
                                               f"{head_bytes // 256},64", f"{head_bytes // 256},64", "f32", head_bytes, head_bytes, None))
    group, ranks = writer.intern("0"), writer.intern("0,1")
    for step in range(STEPS):
        start = step * STEP_NS
        writer.append("steps", (0, step, start, start + STEP_NS, "optimizer"))
        writer.append("executions", (0, 1, 0, start, 2 * MS, step, None))
        calls = [("all_gather", 12288, lines[20], gather), ("all_reduce", 6144, lines[24], reduce)]
        if again is not None:
            calls.append(("all_reduce", 6144, lines[25], again))
        for index, (kind, nbytes, frame, cause_id) in enumerate(calls):
            writer.append("collectives", (0, kind, nbytes, "f32", group, ranks, frame, start + (3 + 2 * index) * MS, MS, None, "gloo:ring", None,
                                          step, cause_id))
    writer.update_run(end_ns=STEPS * STEP_NS, exit_status=0)
    writer.close()
    return path


def _sharding_findings(path: Path) -> list[Any]:
    with open_trace(path) as trace:
        report = analyze(trace)
    return [finding for finding in report.findings if finding.analyzer == "sharding"]


def test_a_gather_split_back_in_the_same_step_is_a_round_trip_at_the_gather_line(tmp_path: Path) -> None:
    findings = _sharding_findings(_write_tensor_parallel(tmp_path / "trip.tptrace", round_trip=True))
    trips = [finding for finding in findings if finding.title.startswith("Round trip")]
    assert len(trips) == 1
    assert (trips[0].file, trips[0].line) == (SCRIPT, 20) and "train.py:22" in trips[0].suggestion
    assert trips[0].cost_per_step_ns and trips[0].cost_per_step_ns > 0
    assert not any(finding.title.startswith("Round trip") for finding in _sharding_findings(_write_tensor_parallel(tmp_path / "no_trip.tptrace")))


def test_partial_sums_reduced_twice_are_one_finding_at_the_second_op(tmp_path: Path) -> None:
    findings = _sharding_findings(_write_tensor_parallel(tmp_path / "again.tptrace", reduce_again=True))
    again = [finding for finding in findings if "again" in finding.title]
    assert len(again) == 1 and (again[0].file, again[0].line) == (SCRIPT, 25)
    assert "train.py:24" in again[0].suggestion  # the first reduction's line
    assert not any(finding.title.startswith("aten.sigmoid") for finding in findings)
    # without a second reduction, the first is an op redistribution like any other
    alone = _sharding_findings(_write_tensor_parallel(tmp_path / "once.tptrace"))
    assert any(finding.title.startswith("aten.sigmoid") for finding in alone) and not any("again" in finding.title for finding in alone)


def test_a_replicated_module_next_to_a_planned_one_is_named_with_its_bytes_per_rank(tmp_path: Path) -> None:
    findings = _sharding_findings(_write_tensor_parallel(tmp_path / "head.tptrace", head_bytes=256 * 1024))
    unplanned = [finding for finding in findings if "replicated next to sharded" in finding.title]
    assert len(unplanned) == 1
    assert unplanned[0].module == "Net.head" and unplanned[0].severity == "warning" and (unplanned[0].file, unplanned[0].line) == (SCRIPT, 10)
    assert "256 KiB per rank" in unplanned[0].explanation and "128 KiB per rank" in unplanned[0].explanation
    small = _sharding_findings(_write_tensor_parallel(tmp_path / "small_head.tptrace", head_bytes=4096))
    assert [finding.severity for finding in small if "replicated next to sharded" in finding.title] == ["info"]
