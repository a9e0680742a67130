"""TraceWriter: appends records to a trace file from any thread, cheaply enough for the dispatch path.

Hot-path calls (`append`, `intern`, `frame`, `next_id`) only touch in-memory queues and dicts. A
background thread drains the queues every `commit_interval_s` and inserts them in one transaction
(`executemany` per table), so after a `kill -9` the file opens and lacks at most the last interval
or so. Within a transaction strings and frames are drained after the rows that reference them, so a
committed row never references an uncommitted string or frame.

Backpressure. Each table's queue holds at most `max_queued_rows` rows: `append` (and `relieve`, which
callers of `appender` call after each batch) commits in the caller's thread when a queue is full, so a
producer faster than the disk waits instead of growing memory, and a stop request finds little queued.

The file is in WAL mode while the writer runs. Indexes are built on `close()` (cheaper than keeping
them up to date on every insert, and they come out packed), within `index_budget_s`: those not built
by then are named in `meta.indexes_deferred` and built by the first reader that can write the file
(`tputrace.store.indexing`). `close()` then checkpoints and leaves the trace as a single file. A trace
from a killed run has no indexes, which only makes queries slower.

Fork. An SQLite connection must never be used, or even closed, in a forked child: its in-process
lock state is a copy of the parent's, and closing it can checkpoint and delete the parent's WAL. So
around `os.fork()` every open writer commits what it has and closes its connection, the parent
reopens it afterwards, and the child gets no connection: its copy of the writer is closed, and rows
appended to it are ignored.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import json
import os
import sqlite3
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tputrace.version import __version__
from tputrace.schema import (
    FORMAT_VERSION,
    MAGIC,
    RECORD_KINDS,
    RECORD_KINDS_BY_TABLE,
    RUNS,
    index_statements,
    table_statements,
    view_statements,
)
from tputrace.store.batch_insert import BatchInserter, bind_none_cheaply
from tputrace.store.disk_room import RESERVE_SUFFIX, is_disk_full, make_reserve, release_reserve, store_in_parts
from tputrace.store.errors import TraceWriteError
from tputrace.store.indexing import build_indexes

Row = tuple[Any, ...]

# Tables filled through intern()/frame(); every other table is filled through append().
_INTERNED_TABLES = ("strings", "frames")
_SIDECAR_SUFFIXES = ("-wal", "-shm", "-journal", RESERVE_SUFFIX)
# Rows a table's queue holds before the appending thread commits them itself (see `relieve`).
MAX_QUEUED_ROWS = 50_000
# Seconds `close()` spends building indexes; the rest are left to the first reader that can write the file.
INDEX_BUDGET_S = 1.0
# What a malformed row raises (wrong arity, unsupported type, integer over 64 bits).
_ROW_ERRORS = (sqlite3.Error, ValueError, TypeError, OverflowError)

_open_writers: weakref.WeakSet[TraceWriter] = weakref.WeakSet()
_fork_hooks_registered = False


class TraceWriter:
    """Writes one trace file. Thread-safe; use as a context manager or call `close()`.

    Rows are tuples of values in the table's column order (`tputrace.schema`); `*_sid` values come
    from `intern()`, `frame_id` values from `frame()`, `id` values from `next_id()`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        rank: int = 0,
        commit_interval_s: float = 0.25,
        created_unix_ns: int | None = None,
        create_file: bool = True,
        close_at_exit: bool = True,
        bulk: bool = False,
        max_queued_rows: int = MAX_QUEUED_ROWS,
        index_budget_s: float = INDEX_BUDGET_S,
    ) -> None:
        """`create_file=False` keeps rows in memory until `create_file()` is called (a recording
        that may never record anything worth a file); `close()` before that writes nothing.
        `close_at_exit=False`: the owner closes it at interpreter exit (after rows of its own), not atexit.
        `bulk=True` (a file that is discarded unless finished, e.g. an import's): no fsync and the rollback
        journal in memory, so a crash or power loss may leave the file damaged.
        `max_queued_rows`: rows per table queue before appending commits (see `relieve`);
        `index_budget_s`: seconds `close()` may spend on indexes."""
        self.path = Path(path)
        self.rank = rank
        self.commit_interval_s = commit_interval_s
        self.max_queued_rows = max_queued_rows
        self.index_budget_s = index_budget_s
        self.dropped_rows = 0
        self._first_error: str | None = None
        self._reported_dropped = 0
        self._disk_full = False  # once a commit failed for want of space, rows are dropped and only run facts are written
        self._closed = False
        self.closes_at_exit = close_at_exit
        self._bulk = bulk

        self._row_queues: dict[str, deque[Row]] = {
            kind.table: deque() for kind in RECORD_KINDS if kind.table not in _INTERNED_TABLES
        }
        self._insert_sql = {kind.table: kind.insert_sql() for kind in RECORD_KINDS}
        self._inserters = {kind.table: BatchInserter(kind.table, kind.column_names) for kind in RECORD_KINDS}
        self._statements: deque[tuple[str, Row]] = deque()
        self._string_rows: deque[Row] = deque()
        self._frame_rows: deque[Row] = deque()
        self._string_ids: dict[str, int] = {}
        self._frame_ids: dict[tuple[str, int, str, int | None, int | None, int | None], int] = {}
        self._intern_lock = threading.Lock()
        self._id_counters = {kind.table: itertools.count(1) for kind in RECORD_KINDS if kind.primary_key == "id"}
        self._id_counters.pop("strings")
        self._id_counters.pop("frames")

        self._pid = os.getpid()
        self._closed_for_fork = False
        self._created_unix_ns = created_unix_ns
        self._connection: sqlite3.Connection | None = None
        self._db_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._stop_event = threading.Event()
        self._wake = threading.Event()  # set by `commit_soon` (and by `close`) to commit before the interval ends
        self._thread: threading.Thread | None = None
        if create_file:
            self.create_file()

    def create_file(self) -> None:
        """Create the trace file and start committing to it (done by `__init__` unless told not to). Idempotent."""
        with self._close_lock:
            if self._thread is not None or self._closed:
                return
            self._connection = self._create_file(self._created_unix_ns)
            self._thread = threading.Thread(target=self._commit_loop, name="tputrace-writer", daemon=True)
            self._thread.start()
        if self.closes_at_exit:
            atexit.register(self.close)
        _open_writers.add(self)
        _register_fork_hooks()

    # -- hot path -------------------------------------------------------------------------------

    def append(self, table: str, row: Row) -> None:
        """Queue one row of `table` (values in the table's column order); commits first if the queue is full."""
        row_queue = self._row_queues[table]
        row_queue.append(row)
        if len(row_queue) >= self.max_queued_rows:
            self._drain_and_commit()

    def extend(self, table: str, rows: list[Row]) -> None:
        """Queue many rows of `table` at once; commits first if the queue is then full."""
        row_queue = self._row_queues[table]
        row_queue.extend(rows)
        if len(row_queue) >= self.max_queued_rows:
            self._drain_and_commit()

    def appender(self, table: str) -> Callable[[Row], None]:
        """The fastest way to append to one table: a bound `append(row)` for `table`, without the
        queue bound's check; the caller calls `relieve()` after each batch (or every few hundred rows)."""
        return self._row_queues[table].append

    def queued(self, table: str) -> int:
        """Rows of `table` appended and not yet committed."""
        return len(self._row_queues[table])

    def relieve(self) -> None:
        """Commit in the caller's thread if a queue holds `max_queued_rows` rows or more (backpressure
        for `appender`'s callers: a producer faster than the disk waits here)."""
        limit = self.max_queued_rows
        if any(len(row_queue) >= limit for row_queue in self._row_queues.values()):
            self._drain_and_commit()

    def intern(self, text: str) -> int:
        """The string id of `text`, adding it to the `strings` table the first time."""
        string_id = self._string_ids.get(text)
        if string_id is None:
            string_id = self._intern_new(text)
        return string_id

    def frame(self, file: str, line: int, function: str, col: int | None = None, end_col: int | None = None,
              end_line: int | None = None) -> int:
        """The frame id of a source location, adding it to the `frames` table the first time.

        `col`, `end_col` and `end_line` locate one call that starts on the line (character offsets, `end_col`
        on `end_line`); without them the frame is the whole line."""
        key = (file, line, function, col, end_col, end_line)
        frame_id = self._frame_ids.get(key)
        if frame_id is None:
            frame_id = self._frame_new(key)
        return frame_id

    def next_id(self, table: str) -> int:
        """A fresh id for a table whose primary key is `id` (programs, compiles, flushes)."""
        return next(self._id_counters[table])

    # -- runs -----------------------------------------------------------------------------------

    def set_run(self, **fields: Any) -> None:
        """Insert or replace the `runs` row of `fields["rank"]` (default: this writer's rank).

        `argv` may be a list; it is stored as JSON. Unknown field names raise `TypeError`.
        """
        rank = fields.pop("rank", self.rank)
        values = self._run_values(fields)
        row = tuple(rank if name == "rank" else values.get(name) for name in RUNS.column_names)
        self._statements.append(("DELETE FROM runs WHERE rank = ?", (rank,)))
        self._statements.append((self._insert_sql["runs"], row))

    def update_run(self, **fields: Any) -> None:
        """Update some columns of the `runs` row of `fields["rank"]` (default: this writer's rank)."""
        rank = fields.pop("rank", self.rank)
        values = self._run_values(fields)
        if not values:
            return
        assignments = ", ".join(f"{name} = ?" for name in values)
        self._statements.append((f"UPDATE runs SET {assignments} WHERE rank = ?", (*values.values(), rank)))

    def set_meta(self, key: str, value: str) -> None:
        """Set one `meta` entry (a fact about the whole file, such as the process it was forked from)."""
        self._statements.append(("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value)))

    # -- lifecycle ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Commit everything appended so far; raises `TraceWriteError` if rows had to be dropped."""
        if self._closed:
            return
        self._drain_and_commit()
        self._raise_if_dropped()

    def commit(self) -> None:
        """Commit everything appended so far; rows that could not be stored are reported by `flush()`/`close()`."""
        if not self._closed:
            self._drain_and_commit()

    def close(self) -> None:
        """Commit everything, build indexes (within `index_budget_s`) and leave the trace as one file. Idempotent.

        Rows appended after `close()` are ignored.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            if self._thread is None:  # no file was ever created
                return
        atexit.unregister(self.close)
        self._stop_event.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._drain_and_commit()
        with self._db_lock:
            connection = self._open_connection
            try:
                build_indexes(connection, index_statements(), self.index_budget_s)
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                connection.execute("PRAGMA journal_mode=DELETE")
            except sqlite3.Error as error:
                self._note_error(f"finishing the trace failed: {error}", 0)
            finally:
                connection.close()
                self._connection = None
                release_reserve(self.path)
        self._raise_if_dropped()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def _open_connection(self) -> sqlite3.Connection:
        """The connection to the trace file; `TraceWriteError` once it is closed (or before the file exists)."""
        if self._connection is None:
            raise TraceWriteError(f"the trace {self.path} is not open for writing")
        return self._connection

    # -- fork: the connection is closed across os.fork() and never reaches the child --------------

    def _close_before_fork(self) -> None:
        """Commit what is queued and close the connection; `_db_lock` stays held until after the fork.

        A `close()` running meanwhile in another thread waits for the lock and finishes on the
        connection reopened after the fork."""
        if self._connection is None:
            return
        self._drain_and_commit()
        self._db_lock.acquire()
        if self._connection is None:  # close() finished meanwhile
            self._db_lock.release()
            return
        self._connection.close()
        self._closed_for_fork = True

    def _reopen_after_fork(self) -> None:
        """In the parent: reopen the connection closed by `_close_before_fork`."""
        if not self._closed_for_fork:
            return
        self._closed_for_fork = False
        try:
            self._connection = _connect(self.path, bulk=self._bulk)
        except sqlite3.Error as error:
            self._note_error(f"reopening the trace after a fork failed: {error}", 0)
        finally:
            self._db_lock.release()

    def _abandon_in_child(self) -> None:
        """In a forked child: this copy of the parent's writer never touches the file again."""
        self._closed = True
        self._connection = None
        atexit.unregister(self.close)
        for row_queue in (*self._row_queues.values(), self._statements, self._string_rows, self._frame_rows):
            row_queue.clear()

    # -- internals ------------------------------------------------------------------------------

    def _create_file(self, created_unix_ns: int | None) -> sqlite3.Connection:
        for suffix in ("", *_SIDECAR_SUFFIXES):
            stale = Path(f"{self.path}{suffix}")
            if stale.is_file():
                stale.unlink()
        try:
            connection = _connect(self.path, bulk=self._bulk)
            created_ns = time.time_ns() if created_unix_ns is None else created_unix_ns
            created = datetime.fromtimestamp(created_ns / 1e9, tz=timezone.utc)
            meta = {
                "magic": MAGIC,
                "format_version": str(FORMAT_VERSION),
                "created": created.isoformat(timespec="seconds"),
                "created_unix_ns": str(created_ns),
                "writer": f"tputrace {__version__}",
            }
            connection.execute("BEGIN")
            for statement in (*table_statements(), *view_statements()):
                connection.execute(statement)
            connection.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", meta.items())
            connection.execute("COMMIT")
        except sqlite3.Error as error:
            raise TraceWriteError(f"cannot create trace {self.path}: {error}") from None
        if not self._bulk:
            make_reserve(self.path)
        return connection

    def _intern_new(self, text: str) -> int:
        with self._intern_lock:
            string_id = self._string_ids.get(text)
            if string_id is None:
                string_id = len(self._string_ids) + 1
                # Queue the row before publishing the id: whoever sees the id sees a queued row.
                self._string_rows.append((string_id, text))
                self._string_ids[text] = string_id
        return string_id

    def _frame_new(self, key: tuple[str, int, str, int | None, int | None, int | None]) -> int:
        file, line, function, col, end_col, end_line = key
        file_sid = self.intern(file)
        function_sid = self.intern(function)
        with self._intern_lock:
            frame_id = self._frame_ids.get(key)
            if frame_id is None:
                frame_id = len(self._frame_ids) + 1
                self._frame_rows.append((frame_id, file_sid, line, function_sid, col, end_col, end_line))
                self._frame_ids[key] = frame_id
        return frame_id

    def _run_values(self, fields: dict[str, Any]) -> dict[str, Any]:
        unknown = set(fields) - set(RUNS.column_names)
        if unknown:
            raise TypeError(f"unknown runs columns: {', '.join(sorted(unknown))}")
        values = dict(fields)
        if isinstance(values.get("argv"), (list, tuple)):
            values["argv"] = json.dumps(list(values["argv"]))
        return values

    def commit_soon(self) -> None:
        """Have the commit thread commit now rather than at the end of its interval (cheap: it sets an event). A rank
        about to wait in a collective asks for it: a peer issuing a mismatched call can make the transport abort the
        process in that wait, and what was committed by then is what its trace keeps."""
        self._wake.set()

    def _commit_loop(self) -> None:
        while True:
            self._wake.wait(self.commit_interval_s)
            self._wake.clear()
            if self._stop_event.is_set():
                return
            self._drain_and_commit()

    def _drain_and_commit(self) -> None:
        with self._db_lock:
            if self._connection is None:  # closed: rows appended after close() are ignored
                return
            # Order matters: rows first, then the frames and strings they may reference.
            batches = [(table, _take(queue)) for table, queue in self._row_queues.items()]
            statements = _take(self._statements)
            frame_rows = _take(self._frame_rows)
            string_rows = _take(self._string_rows)
            connection = self._connection
            if self._disk_full:
                self.dropped_rows += sum(len(rows) for _, rows in batches) + len(frame_rows) + len(string_rows)
                self._commit_statements(connection, statements)
                return
            try:
                if connection.in_transaction:
                    # A drain interrupted by an exception (SIGTERM's SystemExit) left valid rows behind.
                    connection.execute("COMMIT")
                connection.execute("BEGIN")
                for table, rows in batches:
                    if rows:
                        self._insert(connection, table, rows)
                for sql, params in statements:
                    self._execute_statement(connection, sql, params)
                if frame_rows:
                    self._insert(connection, "frames", frame_rows)
                if string_rows:
                    self._insert(connection, "strings", string_rows)
                connection.execute("COMMIT")
            except sqlite3.Error as error:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                total = sum(len(rows) for _, rows in batches) + len(frame_rows) + len(string_rows)
                if not is_disk_full(error):
                    self._note_error(f"commit failed: {error}", total)
                else:
                    references = [("strings", string_rows), ("frames", frame_rows)]
                    stored = store_in_parts(functools.partial(self._commit_part, connection), batches, references)
                    self._note_error(f"commit failed: {error}", total - stored)
                    # The reserve given back is room for the run's facts (its end record, at close) and
                    # the note that the trace is incomplete.
                    release_reserve(self.path)
                    self._disk_full = True
                    note = ("incomplete", f"rows from {_now_text()} on could not be stored: {error}")
                    statements.append(("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", note))
                self._commit_statements(connection, statements)

    def _commit_part(self, connection: sqlite3.Connection, parts: Sequence[tuple[str, list[Row]]]) -> bool:
        """Commit some tables' rows in one transaction; False (rolled back) if that failed."""
        try:
            connection.execute("BEGIN")
            for table, rows in parts:
                if rows:
                    self._insert(connection, table, rows)
            connection.execute("COMMIT")
            return True
        except sqlite3.Error:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            return False

    def _commit_statements(self, connection: sqlite3.Connection, statements: list[tuple[str, Row]]) -> None:
        """Commit run updates and meta entries on their own; count them as dropped if that fails too."""
        if not statements:
            return
        try:
            connection.execute("BEGIN")
            for sql, params in statements:
                self._execute_statement(connection, sql, params)
            connection.execute("COMMIT")
        except sqlite3.Error as error:
            self._note_error(f"commit failed: {error}", len(statements))
            if connection.in_transaction:
                connection.execute("ROLLBACK")

    def _insert(self, connection: sqlite3.Connection, table: str, rows: list[Row]) -> None:
        """Insert a batch; if it fails, insert row by row and drop (and count) the bad rows."""
        sql = self._insert_sql[table]
        connection.execute("SAVEPOINT batch")
        try:
            self._inserters[table].insert(connection, rows)
        except _ROW_ERRORS as error:
            if isinstance(error, sqlite3.Error) and is_disk_full(error):
                raise  # no row is bad: the transaction fails, and the caller stores what fits
            connection.execute("ROLLBACK TO batch")
            kind = RECORD_KINDS_BY_TABLE[table]
            width = len(kind.columns)
            for row in rows:
                if width - kind.optional_trailing <= len(row) < width:
                    row = (*row, *(None,) * (width - len(row)))  # a row without the table's later trailing columns
                try:
                    connection.execute(sql, row)
                except _ROW_ERRORS as row_error:
                    if isinstance(row_error, sqlite3.Error) and is_disk_full(row_error):
                        raise
                    self._note_error(f"bad {table} row {row!r:.200}: {row_error}", 1)
        connection.execute("RELEASE batch")

    def _execute_statement(self, connection: sqlite3.Connection, sql: str, params: Row) -> None:
        try:
            connection.execute(sql, params)
        except _ROW_ERRORS as error:
            self._note_error(f"run update failed: {error}", 1)

    def _note_error(self, message: str, dropped: int) -> None:
        self.dropped_rows += dropped
        if self._first_error is None:
            self._first_error = message
            # Said at once (from whichever thread commits): the run goes on, and the user may free space.
            _warn(f"tputrace: warning: cannot store rows in {self.path} ({message}); the run goes on and the trace will be incomplete\n")

    def _raise_if_dropped(self) -> None:
        if self._first_error is not None and self.dropped_rows != self._reported_dropped:
            self._reported_dropped = self.dropped_rows
            raise TraceWriteError(
                f"{self.dropped_rows} rows could not be stored in {self.path}; first error: {self._first_error}"
            )


def _now_text() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _warn(text: str) -> None:
    try:
        os.write(2, text.encode())
    except OSError:
        pass


def _connect(path: Path, *, bulk: bool = False) -> sqlite3.Connection:
    """The writer's connection: autocommit (the writer opens its own transactions), WAL (bulk: the journal
    in memory, no fsync), any thread."""
    bind_none_cheaply()
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode=MEMORY" if bulk else "PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=OFF" if bulk else "PRAGMA synchronous=NORMAL")
    connection.execute("PRAGMA wal_autocheckpoint=10000")
    return connection


def _register_fork_hooks() -> None:
    """Close every open writer's connection across `os.fork()` (once per process, on first use)."""
    global _fork_hooks_registered
    if _fork_hooks_registered:
        return
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
    _fork_hooks_registered = True


def _before_fork() -> None:
    for writer in list(_open_writers):
        writer._close_before_fork()


def _after_fork_in_parent() -> None:
    for writer in list(_open_writers):
        writer._reopen_after_fork()


def _after_fork_in_child() -> None:
    inherited = [writer for writer in _open_writers if writer._pid != os.getpid()]
    for writer in inherited:
        writer._abandon_in_child()
        _open_writers.discard(writer)


def _take(queue: deque[Any]) -> list[Any]:
    """Pop the rows queued so far; rows appended meanwhile by other threads stay for next time (one `popleft` per
    row, called from C)."""
    return list(itertools.starmap(queue.popleft, itertools.repeat((), len(queue))))
