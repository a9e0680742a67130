"""Trace: read-only access to a trace file as typed records, DataFrames, SQL and aggregates.

Reading never imports torch or jax and never evaluates anything stored in the file. A `Trace` may
be used from several threads; it reads a trace that is still being written (or whose writer was
killed) as of the writer's last commit.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from tputrace.forks import ForkOrigin, fork_origins
from tputrace.schema import RECORD_KINDS_BY_TABLE, RecordKind
from tputrace.source_digests import SourceDigest
from tputrace.store import aggregates
from tputrace.store.aggregates import (
    CollectiveStat,
    CompileStats,
    FallbackStat,
    OpGrouping,
    OpOrder,
    OpStat,
    RecompileGroup,
    StepTime,
    SyncStat,
    TimeSplit,
)
from tputrace.store.columns import line_character_offset
from tputrace.store.errors import QueryError, TputraceError
from tputrace.store.opening import (
    check_trace_file,
    connect_read_only,
    describe_database_error,
    read_meta,
)
from tputrace.store.records import (
    RECORD_TYPES,
    AnnotationRecord,
    CollectiveRecord,
    CompileRecord,
    ExecutionRecord,
    FallbackRecord,
    FlushRecord,
    FrameRecord,
    FusionRecord,
    GraphBreakRecord,
    MemorySample,
    OpRecord,
    ProgramRecord,
    Record,
    RunInfo,
    SourceFileRecord,
    SourceLocation,
    StepRecord,
    StringRecord,
    SyncRecord,
    TransferRecord,
)
from tputrace.store.sources import copy_as_run_saw
from tputrace.wording import printable

if TYPE_CHECKING:
    import pandas

_FETCH_ROWS = 4096
_Value = TypeVar("_Value")
# What `Trace.run` returns for a trace whose writer died before committing a runs row.
_NO_RUN = RunInfo(
    rank=0,
    world_size=None,
    script=None,
    argv=(),
    cwd=None,
    host=None,
    pid=None,
    chips=None,
    platform=None,
    eager_mode=None,
    torch_version=None,
    jax_version=None,
    tputrace_version=None,
    start_unix_ns=None,
    end_ns=None,
    exit_status=None,
    error=None,
)


def open_trace(path: str | os.PathLike[str], *, source_roots: Sequence[str | os.PathLike[str]] = ()) -> Trace:
    """Open a trace file; raises `TraceError` with a one-sentence message if it is not a readable trace.
    `source_roots` are searched for a copy of a source file the run saw, where an older trace's byte
    columns need the file's text (see `Trace.frame`)."""
    trace_path = Path(path)
    check_trace_file(trace_path)
    connection = connect_read_only(trace_path)
    try:
        meta = read_meta(connection, trace_path)
    except BaseException:
        connection.close()
        raise
    return Trace(trace_path, connection, meta, tuple(str(root) for root in source_roots))


class Trace:
    """A trace file opened for reading. Create it with `tputrace.open(path)`."""

    def __init__(self, path: Path, connection: sqlite3.Connection, meta: dict[str, str],
                 source_roots: tuple[str, ...] = ()) -> None:
        self.path = path
        self.meta = meta
        self.source_roots = source_roots
        self.format_version = int(meta["format_version"])
        self._connection = connection
        self._lock = threading.RLock()
        self._strings: dict[int, str] | None = None
        self._frames: dict[int, SourceLocation] | None = None
        self._tables: frozenset[str] | None = None
        self._columns_by_table: dict[str, frozenset[str]] = {}
        self._seen_digests: dict[str, frozenset[SourceDigest]] | None = None
        self._column_texts: dict[str, str | None] = {}
        self._source_copies: dict[str, str | None] = {}

    # -- the file ---------------------------------------------------------------------------------

    @property
    def created(self) -> str | None:
        """When the writer created the file (ISO 8601, UTC)."""
        return self.meta.get("created")

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Trace({str(self.path)!r}, format_version={self.format_version})"

    # -- runs -------------------------------------------------------------------------------------

    @property
    def runs(self) -> list[RunInfo]:
        """One `RunInfo` per recorded rank, in rank order."""
        return [record for record in self.records("runs", order_by="rank") if isinstance(record, RunInfo)]

    @property
    def run(self) -> RunInfo:
        """Rank 0's run (or the first rank's); all fields None if the writer died before writing one."""
        runs = self.runs
        for run in runs:
            if run.rank == 0:
                return run
        if runs:
            return runs[0]
        return _NO_RUN

    @property
    def ranks(self) -> list[int]:
        """The ranks recorded in the trace ([0] when there is no run row)."""
        ranks = [rank for (rank,) in self.sql("SELECT DISTINCT rank FROM runs ORDER BY rank")]
        return ranks or [0]

    @property
    def forked_ranks(self) -> dict[int, ForkOrigin]:
        """The ranks that are processes forked during the recording (see `tputrace.forks`), by rank."""
        return fork_origins(self.meta)

    @property
    def distributed_ranks(self) -> list[int]:
        """The ranks that are not forked processes: the distributed ranks of the run."""
        forked = self.forked_ranks
        return [rank for rank in self.ranks if rank not in forked] or self.ranks

    # -- records ----------------------------------------------------------------------------------

    def count(self, table: str, *, where: str | None = None, params: Sequence[Any] = ()) -> int:
        """Number of records in `table` (optionally matching `where`)."""
        kind = _record_kind(table)
        if not self.has_table(kind.table):
            return 0
        query = f"SELECT COUNT(*) FROM {kind.table}" + (f" WHERE {where}" if where else "")
        return self.sql(query, params)[0][0]

    def has_table(self, table: str) -> bool:
        """Whether the file has `table`: a file written before a table was added to the format lacks
        it, and reads it as empty."""
        if self._tables is None:
            self._tables = frozenset(name for (name,) in self.sql("SELECT name FROM sqlite_master WHERE type = 'table'"))
        return table in self._tables

    def source_files(self, *, rank: int | None = None) -> dict[str, SourceFileRecord]:
        """The user's source files as the run saw them (digest and size), by recorded path; of `rank`
        when given, else of every rank (the lowest rank's where ranks differ)."""
        where, params = ("rank = ?", (rank,)) if rank is not None else (None, ())
        files: dict[str, SourceFileRecord] = {}
        for record in self.records("source_files", where=where, params=params, order_by="rank DESC, rowid"):
            if record.file is not None:
                files[record.file] = record
        return files

    def counts(self) -> dict[str, int]:
        """Number of records in every table, in schema order."""
        return {table: self.count(table) for table in RECORD_KINDS_BY_TABLE}

    # One overload per table, so that type checkers know each table's record type.
    @overload
    def records(
        self,
        table: Literal["strings"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[StringRecord]: ...
    @overload
    def records(
        self,
        table: Literal["frames"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[FrameRecord]: ...
    @overload
    def records(
        self,
        table: Literal["runs"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[RunInfo]: ...
    @overload
    def records(
        self,
        table: Literal["ops"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[OpRecord]: ...
    @overload
    def records(
        self,
        table: Literal["programs"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[ProgramRecord]: ...
    @overload
    def records(
        self,
        table: Literal["compiles"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[CompileRecord]: ...
    @overload
    def records(
        self,
        table: Literal["executions"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[ExecutionRecord]: ...
    @overload
    def records(
        self,
        table: Literal["fusions"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[FusionRecord]: ...
    @overload
    def records(
        self,
        table: Literal["flushes"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[FlushRecord]: ...
    @overload
    def records(
        self,
        table: Literal["syncs"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[SyncRecord]: ...
    @overload
    def records(
        self,
        table: Literal["transfers"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[TransferRecord]: ...
    @overload
    def records(
        self,
        table: Literal["fallbacks"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[FallbackRecord]: ...
    @overload
    def records(
        self,
        table: Literal["memory"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[MemorySample]: ...
    @overload
    def records(
        self,
        table: Literal["annotations"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[AnnotationRecord]: ...
    @overload
    def records(
        self,
        table: Literal["steps"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[StepRecord]: ...
    @overload
    def records(
        self,
        table: Literal["collectives"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[CollectiveRecord]: ...
    @overload
    def records(
        self,
        table: Literal["graph_breaks"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[GraphBreakRecord]: ...
    @overload
    def records(
        self,
        table: Literal["source_files"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[SourceFileRecord]: ...
    @overload
    def records(
        self,
        table: str,
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[Record]: ...

    def records(
        self,
        table: str,
        *,
        where: str | None = None,
        params: Sequence[Any] = (),
        order_by: str | None = None,
        limit: int | None = None,
    ) -> Iterator[Record]:
        """Typed records of `table` (see `tputrace.store.records`), in insertion order by default.

        `where` and `order_by` are SQL over the stored columns (e.g. `where="op_sid = ?"`, with
        `params=(trace.string_id("aten.mm.default"),)`).
        """
        kind = _record_kind(table)
        record_type = RECORD_TYPES[kind.table]
        converters = self._converters(kind)
        for rows in self._table_batches(kind, where, params, order_by, limit):
            for row in rows:
                yield record_type(*[convert(value) for convert, value in zip(converters, row)])

    def raw_records(
        self,
        table: str,
        *,
        where: str | None = None,
        params: Sequence[Any] = (),
        order_by: str | None = None,
        limit: int | None = None,
    ) -> Iterator[tuple[Any, ...]]:
        """Rows of `table` as stored (ids unresolved), in the table's column order."""
        for rows in self._table_batches(_record_kind(table), where, params, order_by, limit):
            yield from rows

    def dataframe(
        self,
        table: str,
        *,
        where: str | None = None,
        params: Sequence[Any] = (),
        order_by: str | None = None,
        limit: int | None = None,
        resolve: bool = True,
    ) -> pandas.DataFrame:
        """`table` as a pandas DataFrame. With `resolve`, `*_sid` columns become text columns named
        without the suffix (`op`, `inputs`, `module`, ...) and `frame_id` becomes `file`, `line`,
        `function`."""
        import pandas

        kind = _record_kind(table)
        rows = list(self.raw_records(table, where=where, params=params, order_by=order_by, limit=limit))
        frame = pandas.DataFrame.from_records(rows, columns=list(kind.column_names))
        if not resolve:
            return frame
        strings = self._string_table()
        frames = self._frame_table()
        resolved: dict[str, Any] = {}
        for column in kind.columns:
            values = frame[column.name]
            if column.ref == "strings":
                resolved[column.name.removesuffix("_sid")] = values.map(strings)
            elif column.ref == "frames":
                locations = values.map(frames)
                resolved["file"] = locations.map(lambda location: location.file, na_action="ignore")
                resolved["line"] = locations.map(lambda location: location.line, na_action="ignore")
                resolved["function"] = locations.map(lambda location: location.function, na_action="ignore")
            else:
                resolved[column.name] = values
        return pandas.DataFrame(resolved)

    def sql(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a read-only SQL query over the trace's tables and return all rows."""
        with self._lock:
            try:
                return self._connection.execute(query, tuple(params)).fetchall()
            except sqlite3.Error as error:
                raise self._describe(error) from None

    def sql_batches(self, query: str, params: Sequence[Any] = ()) -> Iterator[list[tuple[Any, ...]]]:
        """Run a read-only SQL query and yield its rows in lists of a few thousand, for readers that
        handle a big table's rows in bulk."""
        yield from self._fetch_chunks(query, params)

    # -- interned values --------------------------------------------------------------------------

    def string(self, sid: int | None) -> str | None:
        """The text of string id `sid` (None for None or an unknown id)."""
        return self._interned(self._string_table, sid, "SELECT text FROM strings WHERE id = ?", _text_column)

    def string_id(self, text: str) -> int | None:
        """The id of an interned string, or None if the trace does not contain it."""
        rows = self.sql("SELECT id FROM strings WHERE text = ? LIMIT 1", (text,))
        return rows[0][0] if rows else None

    def frame(self, frame_id: int | None) -> SourceLocation | None:
        """The source location of frame id `frame_id` (None for None or an unknown id), its columns in
        characters (an older trace's byte columns converted on the run's text, or None where that text
        is not found: docs/trace-format.md, `frames`)."""
        return self._interned(self._frame_table, frame_id,
                              f"SELECT file_sid, line, function_sid, {self._frame_columns()} FROM frames WHERE id = ?",
                              self._location)

    def _interned(self, table: Callable[[], dict[int, _Value]], key: int | None, query: str,
                  build: Callable[[tuple[Any, ...]], _Value]) -> _Value | None:
        """The value of an interned id: from its table (read whole at first use), else (written since
        then by a live writer) its row read by `query` and kept; None for None or an unknown id."""
        if key is None:
            return None
        values = table()
        value = values.get(key)
        if value is None:
            rows = self.sql(query, (key,))
            if rows:
                value = values[key] = build(rows[0])
        return value

    def _location(self, row: tuple[Any, ...]) -> SourceLocation:
        file_sid, line, function_sid, *columns = row
        return self._source_location(self.string(file_sid) or "?", _line_number(line), self.string(function_sid) or "?",
                                     *columns)

    def unchecked_column_files(self) -> list[str]:
        """The recorded files whose calls' columns could not be checked: the trace stored them as UTF-8
        bytes, and neither the file nor a copy under `source_roots` is the one the run saw, so they read as
        None (`SourceLocation.columns_unchecked`). Empty for a trace that stores characters."""
        return sorted({location.file for location in self._frame_table().values() if location.columns_unchecked})

    def _source_location(self, file: str, line: int, function: str, col: int | None, end_col: int | None,
                         end_line: int | None) -> SourceLocation:
        """A frame's location with character columns: a file whose frames have `col` but no `end_line` stored
        UTF-8 byte offsets on `line` (a call going on past it without an end), converted here from the line's
        text: of the copy the run saw where the trace has the file's digest (no columns when there is none),
        else of the file at its recorded path where it can be read."""
        if col is not None and "end_line" not in self._stored_columns("frames"):
            text_file = self._column_text_file(file)
            if text_file is None:
                return SourceLocation(file, line, function, columns_unchecked=True)
            col = line_character_offset(text_file, line, col)
            if end_col is not None:
                end_col, end_line = line_character_offset(text_file, line, end_col), line
        return SourceLocation(file, line, function, col, end_col, end_line)

    def _column_text_file(self, file: str) -> str | None:
        """The file whose text turns `file`'s byte columns into characters: `file` itself when the trace has no
        digest of it (as before digests were recorded), else the copy with a recorded digest, or None."""
        if file not in self._column_texts:
            self._column_texts[file] = self.source_copy(file) if file in self._source_digests() else file
        return self._column_texts[file]

    def source_copy(self, file: str) -> str | None:
        """The copy of recorded source `file` whose content is the one the run saw: at its recorded path or
        under `source_roots`. None when there is none, or when the trace has no digest of the file, so that
        a trace from elsewhere never quotes a local file that merely shares a path with its own."""
        if file not in self._source_copies:
            seen = self._source_digests().get(file)
            copy = None if seen is None else copy_as_run_saw(file, self.source_roots, seen)
            self._source_copies[file] = None if copy is None else str(copy)
        return self._source_copies[file]

    def _source_digests(self) -> dict[str, frozenset[SourceDigest]]:
        """Every rank's recorded digests of each source file, by recorded path."""
        if self._seen_digests is None:
            digests: dict[str, set[SourceDigest]] = {}
            for record in self.records("source_files"):
                if record.file is not None:
                    digests.setdefault(record.file, set()).add(SourceDigest(record.sha256, record.size))
            self._seen_digests = {file: frozenset(seen) for file, seen in digests.items()}
        return self._seen_digests

    # -- aggregates (computed in SQL; see tputrace.store.aggregates) ------------------------------

    def op_stats(
        self,
        group_by: OpGrouping = "op",
        *,
        limit: int | None = None,
        order: OpOrder = "total",
        rank: int | None = None,
    ) -> list[OpStat]:
        """Op time grouped by "op", "op_shapes", "source" or "module"; ordered by "total", "count" or "mean"."""
        return aggregates.op_stats(self, group_by, limit=limit, order=order, rank=rank)

    def step_times(self, *, rank: int | None = None) -> list[StepTime]:
        """Every step with its duration and op, compile and sync counts."""
        return aggregates.step_times(self, rank=rank)

    def time_split(self, *, rank: int | None = None) -> TimeSplit:
        """Wall time and ns spent compiling, executing, dispatching, syncing, transferring, falling back, communicating."""
        return aggregates.time_split(self, rank=rank)

    def time_range(self, *, rank: int | None = None) -> tuple[int, int]:
        """(first event start, last event end) in ns since the run's start."""
        return aggregates.time_range(self, rank=rank)

    def wall_ns(self, *, rank: int | None = None) -> int:
        """The run's wall time in ns (from the run's end record, else the last event)."""
        return aggregates.wall_ns(self, rank=rank)

    def compile_stats(self, *, rank: int | None = None) -> CompileStats:
        """Compile and recompile counts and times."""
        return aggregates.compile_stats(self, rank=rank)

    def recompile_groups(self, *, limit: int | None = 10, rank: int | None = None) -> list[RecompileGroup]:
        """Recompiles grouped by name, reason and difference; most frequent first."""
        return aggregates.recompile_groups(self, limit=limit, rank=rank)

    def sync_stats(self, *, limit: int | None = None, rank: int | None = None) -> list[SyncStat]:
        """Host syncs grouped by source line and kind; longest stall first."""
        return aggregates.sync_stats(self, limit=limit, rank=rank)

    def fallback_stats(self, *, limit: int | None = None, rank: int | None = None) -> list[FallbackStat]:
        """CPU fallbacks grouped by op; longest first."""
        return aggregates.fallback_stats(self, limit=limit, rank=rank)

    def collective_stats(self, *, rank: int | None = None) -> list[CollectiveStat]:
        """Collectives grouped by kind; longest first."""
        return aggregates.collective_stats(self, rank=rank)

    # -- internals --------------------------------------------------------------------------------

    def _table_batches(self, kind: RecordKind, where: str | None, params: Sequence[Any], order_by: str | None,
                       limit: int | None) -> Iterator[list[tuple[Any, ...]]]:
        """The stored rows of one table (all columns, in schema order), batch by batch."""
        if not self.has_table(kind.table):
            return iter(())
        stored = self._stored_columns(kind.table)
        selected = (name if name in stored else f"NULL AS {name}" for name in kind.column_names)
        query = f"SELECT {', '.join(selected)} FROM {kind.table}"
        if where:
            query += f" WHERE {where}"
        query += f" ORDER BY {order_by or 'rowid'}"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        return self._fetch_chunks(query, params)

    def _stored_columns(self, table: str) -> frozenset[str]:
        """The columns `table` has in this file: a file from an older writer lacks later trailing columns."""
        stored = self._columns_by_table.get(table)
        if stored is None:
            stored = self._columns_by_table[table] = frozenset(row[1] for row in self.sql(f"PRAGMA table_info({table})"))
        return stored

    def _frame_columns(self) -> str:
        """`col, end_col, end_line` of `frames`, NULL for those a file from an older writer lacks."""
        stored = self._stored_columns("frames")
        return ", ".join(name if name in stored else "NULL" for name in ("col", "end_col", "end_line"))

    def _fetch_chunks(self, query: str, params: Sequence[Any]) -> Iterator[list[tuple[Any, ...]]]:
        with self._lock:
            try:
                cursor = self._connection.execute(query, tuple(params))
            except sqlite3.Error as error:
                raise self._describe(error) from None
        while True:
            with self._lock:
                try:
                    rows = cursor.fetchmany(_FETCH_ROWS)
                except sqlite3.Error as error:
                    raise self._describe(error) from None
            if not rows:
                return
            yield rows

    def _describe(self, error: sqlite3.Error) -> TputraceError:
        if isinstance(error, sqlite3.OperationalError) and not _is_file_problem(error):
            return QueryError(f"query failed on {self.path}: {error}")
        return describe_database_error(error, self.path)

    def _string_table(self) -> dict[int, str]:
        if self._strings is None:
            self._strings = {sid: printable(text) for sid, text in self.sql("SELECT id, text FROM strings") if isinstance(text, str)}
        return self._strings

    def _frame_table(self) -> dict[int, SourceLocation]:
        if self._frames is None:
            strings = self._string_table()
            self._frames = {
                frame_id: self._source_location(strings.get(file_sid) or "?", _line_number(line), strings.get(function_sid) or "?",
                                                *columns)
                for frame_id, file_sid, line, function_sid, *columns in self.sql(
                    f"SELECT id, file_sid, line, function_sid, {self._frame_columns()} FROM frames"
                )
            }
        return self._frames

    def _converters(self, kind: RecordKind) -> list[Callable[[Any], Any]]:
        converters: list[Callable[[Any], Any]] = []
        for column in kind.columns:
            if column.ref == "strings":
                converters.append(self.string)
            elif column.ref == "frames":
                converters.append(self.frame)
            elif kind.table == "runs" and column.name == "argv":
                converters.append(_decode_argv)
            elif column.kind == "TEXT":
                converters.append(_text)
            else:
                converters.append(_identity)
        return converters


def _record_kind(table: str) -> RecordKind:
    kind = RECORD_KINDS_BY_TABLE.get(table)
    if kind is None:
        raise TputraceError(f"unknown record kind {table!r}; kinds: {', '.join(RECORD_KINDS_BY_TABLE)}")
    return kind


def _is_file_problem(error: sqlite3.Error) -> bool:
    message = str(error)
    return any(part in message for part in ("malformed", "not a database", "disk I/O", "unable to open"))


def _identity(value: Any) -> Any:
    return value


def _first_column(row: tuple[Any, ...]) -> Any:
    return row[0]


def _text_column(row: tuple[Any, ...]) -> str | None:
    """A string's text (`_text`); None for a value that is not text (a damaged file's NULL, number or blob), read
    as an unknown id is, so that every view gets text or None from `string`."""
    return printable(row[0]) if isinstance(row[0], str) else None


def _text(value: Any) -> Any:
    """A TEXT column's value with its control characters written as escapes (`\\x1b`): a trace is another
    person's text, and an escape sequence in a name would act on the terminal of whoever views it."""
    return printable(value) if isinstance(value, str) else value


def _line_number(line: Any) -> int:
    """A frame's line; 0 for a value that is not a whole number (a damaged file's NULL or text)."""
    return line if isinstance(line, int) else 0


def _decode_argv(value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    try:
        decoded = json.loads(value)
    except ValueError:
        return (printable(value),)
    if isinstance(decoded, list):
        return tuple(printable(str(item)) for item in decoded)
    return (printable(str(decoded)),)
