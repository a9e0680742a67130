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
