"""A disk that fills during a recording (a small tmpfs): tputrace warns when the first write fails, the run
goes on and keeps the script's own exit status, and the trace has its end record and says that it is
incomplete and why (`meta.incomplete`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tputrace
from tputrace.store import TraceWriteError, TraceWriter

# The loop pauses now and then, as a training loop's data loading does, so that the writer's thread commits in
# batches on a busy host too (a batch that does not fit is lost whole, as SQLite's transaction is).
SCRIPT = r'''
import sys, time, torch
import tputrace.backend  # noqa: F401
x = torch.ones(4, device="tpu")
for index in range(20_000):
    x = x + 1
    if index % 1000 == 0:
        time.sleep(0.05)
print("the loop is done", file=sys.stderr, flush=True)
sys.exit(3)
'''


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs: room for the trace's schema (tables, indexes, SQL views) and its first few thousand ops."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount_point)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_a_full_disk_is_said_at_once_and_the_trace_says_it_is_incomplete(tmp_path: Path, small_disk: Path) -> None:
    script = tmp_path / "many_ops.py"
    script.write_text(SCRIPT)
    trace_path = small_disk / "run.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--mode", "strict", "-o", str(trace_path), str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 3, result.stderr[-4000:]
    stderr = result.stderr
    warning = f"tputrace: warning: cannot store rows in {trace_path} (commit failed: database or disk is full)"
    assert stderr.count(warning) == 1 and stderr.index(warning) < stderr.index("the loop is done"), stderr[-4000:]
    assert "tputrace: warning: the trace is incomplete: " in stderr and "Traceback" not in stderr
    with tputrace.open(trace_path) as trace:
        run = trace.run
        incomplete = trace.meta.get("incomplete", "")
        ops = trace.count("ops")
    assert run.finished and run.exit_status == 3
    assert "could not be stored: database or disk is full" in incomplete
    assert 0 < ops < 20_000


def test_a_batch_too_big_for_the_disk_keeps_the_part_that_fits(small_disk: Path) -> None:
    """A writer that gathered more rows than the disk holds (its thread starved on a busy host) stores as many as fit,
    in order, instead of losing the whole batch with its failed transaction."""
    path = small_disk / "starved.tptrace"
    writer = TraceWriter(path, commit_interval_s=3600, max_queued_rows=1_000_000)
    n_rows = 40_000
    writer.extend("steps", [(0, step, step * 10, step * 10 + 5, "explicit") for step in range(n_rows)])
    with pytest.raises(TraceWriteError, match="rows could not be stored"):
        writer.flush()
    dropped = writer.dropped_rows
    writer.close()
    with tputrace.open(path) as trace:
        steps = [record.step for record in trace.records("steps")]
        incomplete = trace.meta.get("incomplete", "")
    assert 0 < len(steps) < n_rows
    assert steps == list(range(len(steps)))
    assert dropped == n_rows - len(steps)
    assert "could not be stored: database or disk is full" in incomplete
