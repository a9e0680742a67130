"""The exit status of a recorded Python command, written by the process that waits on it.

A command's recording (`tputrace.recording.spawning`) ends at its interpreter's exit, where Python tells
the exit hooks nothing of the status (`sys.exit(3)`, an uncaught exception). The process that started
it sees the status when it waits on the command's `subprocess.Popen` (`subprocess.run`, `call`,
`check_call`, `check_output`, `Popen.wait`, `poll`, `communicate`, a `with Popen(...)` block): then the
status goes into the command's own trace, found through the rank claim that holds its pid, before the
root recording merges it. A status Python reports as -N (killed by signal N) is stored as 128 + N, as
a shell reports it. A command nobody waits on through `subprocess` keeps no status.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tputrace.forks import FORKED_FROM_META_KEY, ForkOrigin, forks_dir
from tputrace.recording import lineage
from tputrace.recording.exits import returncode_status

_original_wait: Callable[..., Any] | None = None
_original_poll: Callable[..., Any] | None = None
_seen: weakref.WeakSet[subprocess.Popen[Any]] = weakref.WeakSet()


def install() -> None:
    """Write the exit status of each recorded command this process waits on from now on (idempotent)."""
    global _original_wait, _original_poll
    if _original_wait is not None:
        return
    _original_wait, _original_poll = subprocess.Popen.wait, subprocess.Popen.poll
    subprocess.Popen.wait = _wait_then_record  # type: ignore[method-assign]
    subprocess.Popen.poll = _poll_then_record  # type: ignore[method-assign]


def _wait_then_record(self: subprocess.Popen[Any], timeout: float | None = None) -> int:
    assert _original_wait is not None
    returncode = _original_wait(self, timeout)
    _record_once(self)
    return returncode


def _poll_then_record(self: subprocess.Popen[Any]) -> int | None:
    assert _original_poll is not None
    returncode = _original_poll(self)
    if returncode is not None:
        _record_once(self)
    return returncode


def _record_once(process: subprocess.Popen[Any]) -> None:
    """Write the exit status of `process` into its trace, if it is a recorded command (once per process)."""
    if process.returncode is None or process in _seen:
        return
    _seen.add(process)
    parent = lineage.inherited()
    if parent is None or parent.trace is None:
        return
    directory = forks_dir(parent.trace)
    rank = lineage.claimed_rank(directory, process.pid) if directory.is_dir() else None
    if rank is None:
        return
    trace_path = directory / f"rank{rank}.tptrace"
    if not trace_path.exists():
        return  # the command never used the tpu: nothing of it is kept
    try:
        write_command_exit_status(trace_path, rank, returncode_status(process.returncode))
    except sqlite3.Error as error:
        print(f"tputrace: the exit status of process {process.pid} was not written to {trace_path}: {error}", file=sys.stderr)


def write_command_exit_status(trace_path: Path, rank: int, exit_status: int) -> None:
    """Set `runs.exit_status` of `rank` in a finished command's trace; nothing when the trace is not a
    command's (that of a process `Popen` forked with a `preexec_fn` has the same pid)."""
    connection = sqlite3.connect(trace_path)
    try:
        with connection:
            row = connection.execute("SELECT value FROM meta WHERE key = ?", (FORKED_FROM_META_KEY,)).fetchone()
            if row is not None and ForkOrigin.from_fields(json.loads(row[0])).start_method == "command":
                connection.execute("UPDATE runs SET exit_status = ? WHERE rank = ?", (exit_status, rank))
    finally:
        connection.close()
