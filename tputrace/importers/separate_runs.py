"""Telling apart the runs whose captures share one directory: a TensorBoard log dir or a `tensorboard_trace_handler`
folder that a script wrote to each time it ran holds the files of several processes that did not run together.
Ranks of one run profile the same steps, so their captures overlap in time; captures that do not are other runs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tputrace.importers.xplane_processes import UNIX_NS_FLOOR

# Clocks of a distributed run's hosts may differ a little; another run of a script starts seconds later (a new
# process imports torch or jax before it profiles anything).
_CLOCK_SLACK_NS = 1_000_000_000


def rank_spans(trace: Path) -> dict[int, tuple[int, int]]:
    """Each rank's span (start, end) on the Unix clock, for ranks whose capture puts its times there."""
    connection = sqlite3.connect(trace)
    try:
        rows = connection.execute("SELECT rank, start_unix_ns, end_ns FROM runs").fetchall()
    finally:
        connection.close()
    return {rank: (start, start + (end or 0)) for rank, start, end in rows
            if isinstance(start, int) and start >= UNIX_NS_FLOOR}


def runs_in_time(spans: dict[int, tuple[int, int]]) -> list[list[int]]:
    """The ranks grouped into runs, earliest first: ranks whose spans overlap (directly or through another) are one
    run."""
    runs: list[list[int]] = []
    run_end = 0
    for rank, (start, end) in sorted(spans.items(), key=lambda item: item[1]):
        if runs and start <= run_end + _CLOCK_SLACK_NS:
            runs[-1].append(rank)
            run_end = max(run_end, end)
        else:
            runs.append([rank])
            run_end = end
    return runs
