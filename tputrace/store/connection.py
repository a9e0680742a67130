"""A trace file's read-only SQLite connection, shared by a `Trace`'s threads: queries, row batches,
which tables and columns the file has, and database errors as one-sentence `TputraceError`s."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tputrace.store.errors import QueryError, TputraceError
from tputrace.store.opening import describe_database_error

_FETCH_ROWS = 4096


class TraceConnection:
    """The connection to one trace file; every use of it holds one lock."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._connection = connection
        self._lock = threading.RLock()
        self._tables: frozenset[str] | None = None
        self._columns_by_table: dict[str, frozenset[str]] = {}

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    def sql(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """All rows of a read-only query."""
        with self._lock:
            try:
                return self._connection.execute(query, tuple(params)).fetchall()
            except (sqlite3.Error, UnicodeDecodeError) as error:
                raise self._describe(error) from None

    def batches(self, query: str, params: Sequence[Any] = ()) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of a read-only query in lists of a few thousand."""
        with self._lock:
            try:
                cursor = self._connection.execute(query, tuple(params))
            except (sqlite3.Error, UnicodeDecodeError) as error:
                raise self._describe(error) from None
        while True:
            with self._lock:
                try:
                    rows = cursor.fetchmany(_FETCH_ROWS)
                except (sqlite3.Error, UnicodeDecodeError) as error:
                    raise self._describe(error) from None
            if not rows:
                return
            yield rows

    def has_table(self, table: str) -> bool:
        """Whether the file has `table` (a file written before a table was added to the format lacks it)."""
        if self._tables is None:
            self._tables = frozenset(name for (name,) in self.sql("SELECT name FROM sqlite_master WHERE type = 'table'"))
        return table in self._tables

    def stored_columns(self, table: str) -> frozenset[str]:
        """The columns `table` has in this file: a file from an older writer lacks later trailing columns."""
        stored = self._columns_by_table.get(table)
        if stored is None:
            stored = self._columns_by_table[table] = frozenset(row[1] for row in self.sql(f"PRAGMA table_info({table})"))
        return stored

    def _describe(self, error: sqlite3.Error | UnicodeDecodeError) -> TputraceError:
        if isinstance(error, sqlite3.OperationalError) and not _is_file_problem(error):
            return QueryError(f"query failed on {self.path}: {error}")
        return describe_database_error(error, self.path)


def _is_file_problem(error: sqlite3.Error) -> bool:
    message = str(error)
    return any(part in message for part in ("malformed", "not a database", "disk I/O", "unable to open"))
