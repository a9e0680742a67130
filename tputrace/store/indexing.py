"""Indexes within a time budget, and indexes left for later.

A writer's `close()` builds the schema's indexes for at most its budget (an index still building then
is interrupted and rolled back), and names the ones it did not build in `meta.indexes_deferred`, so
that a stop request is met in time whatever the trace's size. The first reader that can write the
file builds them (`build_deferred_indexes`); a reader that cannot reads the file without them, more
slowly. Only indexes the schema defines are built: names come from the file, statements from here.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from tputrace.schema import index_statements

DEFERRED_META_KEY = "indexes_deferred"
# SQLite virtual-machine steps between two looks at the clock while an index is built.
_PROGRESS_STEPS = 20_000


def index_name(statement: str) -> str:
    """The index a `CREATE INDEX IF NOT EXISTS name ON ...` statement builds."""
    return statement.split()[5]


def build_indexes(connection: sqlite3.Connection, statements: Sequence[str], budget_s: float) -> list[str]:
    """Build the indexes of `statements` (on an autocommit connection) until `budget_s` has passed;
    record the rest in `meta.indexes_deferred` (or remove the entry when none is left). Returns the
    names of the indexes left."""
    deadline = time.monotonic() + budget_s
    if math.isfinite(budget_s):
        connection.set_progress_handler(lambda: time.monotonic() > deadline, _PROGRESS_STEPS)
    left: list[str] = []
    try:
        for statement in statements:
            if left or time.monotonic() > deadline:
                left.append(index_name(statement))
                continue
            try:
                connection.execute(statement)
            except sqlite3.OperationalError as error:
                if "interrupted" not in str(error):
                    raise
                left.append(index_name(statement))
    finally:
        connection.set_progress_handler(None, 0)
    if left:
        connection.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (DEFERRED_META_KEY, json.dumps(left)))
    else:
        connection.execute("DELETE FROM meta WHERE key = ?", (DEFERRED_META_KEY,))
    return left


def deferred_indexes(meta: dict[str, str]) -> list[str]:
    """The names of the indexes a trace's writer left unbuilt (none when the entry is unreadable)."""
    try:
        names = json.loads(meta.get(DEFERRED_META_KEY) or "[]")
    except ValueError:
        return []
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


def build_deferred_indexes(path: Path, meta: dict[str, str]) -> bool:
    """Build the indexes `meta` says were deferred, if the file can be written; whether none is left."""
    names = set(deferred_indexes(meta))
    if not names:
        return DEFERRED_META_KEY not in meta
    if not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
        return False
    statements = [statement for statement in index_statements() if index_name(statement) in names]
    try:
        connection = sqlite3.connect(path, timeout=0.2, isolation_level=None)
    except sqlite3.Error:
        return False
    try:
        return not build_indexes(connection, statements, math.inf)
    except sqlite3.Error:
        return False
    finally:
        connection.close()
