"""What the trace writer does when the disk fills: keep the rows that fit, and room for the run's facts.

A commit that fails for want of space is retried in ever smaller parts, so a batch gathered by a starved
writer thread is not lost whole. The run's facts (its end record, the note that the trace is incomplete)
then go into the room of a reserve file set aside beside the trace when it was created.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Row = tuple[Any, ...]
TableRows = tuple[str, list[Row]]

RESERVE_SUFFIX = "-reserve"
# Room for the note that the trace is incomplete and the run's end record, a few pages of the WAL each.
RESERVE_BYTES = 64 * 1024
# Rows of the smallest part a batch that did not fit is retried in.
SMALLEST_PART_ROWS = 64


def is_disk_full(error: sqlite3.Error) -> bool:
    return getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(error)


def make_reserve(trace_path: Path) -> None:
    """Set `RESERVE_BYTES` of disk aside beside the trace; none if the disk has no room for it."""
    try:
        descriptor = os.open(f"{trace_path}{RESERVE_SUFFIX}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError:
        return
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(descriptor, 0, RESERVE_BYTES)
        elif os.write(descriptor, bytes(RESERVE_BYTES)) != RESERVE_BYTES:
            raise OSError("short write")
    except OSError:
        os.close(descriptor)
        release_reserve(trace_path)
        return
    os.close(descriptor)


def release_reserve(trace_path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(f"{trace_path}{RESERVE_SUFFIX}")


def store_in_parts(commit: Callable[[Sequence[TableRows]], bool], batches: Sequence[TableRows], references: Sequence[TableRows]) -> int:
    """Commit the `references` (strings and frames) together, then each table's rows of `batches` in order, in
    parts halved after each part that does not fit, until a part of `SMALLEST_PART_ROWS` rows does not fit
    either. `commit` commits some tables' rows in one transaction and says whether it could. The rows stored."""
    if not commit(references):
        return 0
    stored = sum(len(rows) for _, rows in references)
    for table, rows in batches:
        start, part = 0, max(len(rows) // 2, SMALLEST_PART_ROWS)
        while start < len(rows):
            if commit([(table, rows[start:start + part])]):
                stored += min(part, len(rows) - start)
                start += part
            elif part > SMALLEST_PART_ROWS:
                part = max(part // 2, SMALLEST_PART_ROWS)
            else:
                return stored
    return stored
