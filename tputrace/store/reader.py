"""Trace: read-only access to a trace file as typed records, DataFrames, SQL and aggregates.

Reading never imports torch or jax and never evaluates anything stored in the file. A `Trace` may
be used from several threads; it reads a trace that is still being written (or whose writer was
killed) as of the writer's last commit.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from tputrace.forks import ForkOrigin, fork_origins
from tputrace.schema import RECORD_KINDS_BY_TABLE, RecordKind, location_prefix
from tputrace.store import aggregates, cells
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
from tputrace.store.connection import TraceConnection
from tputrace.store.errors import TputraceError
from tputrace.store.interned import InternedValues
from tputrace.store.indexing import DEFERRED_META_KEY, build_deferred_indexes
from tputrace.store.opening import check_trace_file, connect_read_only, read_meta
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
    BufferRecord,
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

if TYPE_CHECKING:
    import pandas

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
    if DEFERRED_META_KEY in meta and build_deferred_indexes(trace_path, meta):
        meta.pop(DEFERRED_META_KEY)
    return Trace(trace_path, connection, meta, tuple(str(root) for root in source_roots))


class Trace:
    """A trace file opened for reading. Create it with `tputrace.open(path)`."""

    def __init__(self, path: Path, connection: sqlite3.Connection, meta: dict[str, str],
                 source_roots: tuple[str, ...] = ()) -> None:
        self.path = path
        self.meta = meta
        self.source_roots = source_roots
        self.format_version = int(meta["format_version"])
        self._connection = TraceConnection(path, connection)
        self._interned = InternedValues(self._connection, source_roots)

    # -- the file ---------------------------------------------------------------------------------

    @property
    def created(self) -> str | None:
        """When the writer created the file (ISO 8601, UTC)."""
        return self.meta.get("created")

    def close(self) -> None:
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
        return int(self.sql(query, params)[0][0])  # COUNT(*) is always an integer

    def has_table(self, table: str) -> bool:
        """Whether the file has `table`: a file written before a table was added to the format lacks
        it, and reads it as empty."""
        return self._connection.has_table(table)

    def has_column(self, table: str, column: str) -> bool:
        """Whether the file's `table` has `column`: a file from an older writer lacks later trailing columns,
        which `records` reads as None (raw `sql` must leave them out)."""
        return column in self._connection.stored_columns(table)

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
        table: Literal["buffers"],
        *,
        where: str | None = ...,
        params: Sequence[Any] = ...,
        order_by: str | None = ...,
        limit: int | None = ...,
    ) -> Iterator[BufferRecord]: ...
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
        `function` (`origin_frame_id` beside it: `origin_file`, ...)."""
        import pandas

        kind = _record_kind(table)
        rows = list(self.raw_records(table, where=where, params=params, order_by=order_by, limit=limit))
        frame = pandas.DataFrame.from_records(rows, columns=list(kind.column_names))
        if not resolve:
            return frame
        strings = self._interned.string_table()
        frames = self._interned.frame_table()
        resolved: dict[str, Any] = {}
        for column in kind.columns:
            values = frame[column.name]
            if column.ref == "strings":
                resolved[column.name.removesuffix("_sid")] = values.map(strings)
            elif column.ref == "frames":
                locations = values.map(frames)
                prefix = location_prefix(column.name, kind.column_names)
                resolved[f"{prefix}file"] = locations.map(lambda location: location.file, na_action="ignore")
                resolved[f"{prefix}line"] = locations.map(lambda location: location.line, na_action="ignore")
                resolved[f"{prefix}function"] = locations.map(lambda location: location.function, na_action="ignore")
            else:
                resolved[column.name] = values
        return pandas.DataFrame(resolved)

    def sql(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a read-only SQL query over the trace's tables and return all rows."""
        return self._connection.sql(query, params)

    def sql_batches(self, query: str, params: Sequence[Any] = ()) -> Iterator[list[tuple[Any, ...]]]:
        """Run a read-only SQL query and yield its rows in lists of a few thousand, for readers that
        handle a big table's rows in bulk."""
        yield from self._connection.batches(query, params)

    # -- interned values --------------------------------------------------------------------------

    def string(self, sid: int | None) -> str | None:
        """The text of string id `sid` (None for None or an unknown id)."""
        return self._interned.string(sid)

    def string_id(self, text: str) -> int | None:
        """The id of an interned string, or None if the trace does not contain it."""
        rows = self.sql("SELECT id FROM strings WHERE text = ? LIMIT 1", (text,))
        return rows[0][0] if rows else None

    def frame(self, frame_id: int | None) -> SourceLocation | None:
        """The source location of frame id `frame_id` (None for None or an unknown id), its columns in
        characters (an older trace's byte columns converted on the run's text, or None where that text
        is not found: docs/trace-format.md, `frames`)."""
        return self._interned.frame(frame_id)

    def unchecked_column_files(self) -> list[str]:
        """The recorded files whose calls' columns could not be checked: the trace stored them as UTF-8
        bytes, and neither the file nor a copy under `source_roots` is the one the run saw, so they read as
        None (`SourceLocation.columns_unchecked`). Empty for a trace that stores characters."""
        return self._interned.unchecked_column_files()

    def source_copy(self, file: str) -> str | None:
        """The copy of recorded source `file` whose content is the one the run saw: at its recorded path or
        under `source_roots`. None when there is none, or when the trace has no digest of the file, so that
        a trace from elsewhere never quotes a local file that merely shares a path with its own."""
        return self._interned.source_copy(file)

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
        return aggregates.time_split(self, rank=rank, calls_once=not self.meta.get("imported"))

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
        """Collectives grouped by kind; longest first (a recorded run's time is each kind's calls in flight)."""
        return aggregates.collective_stats(self, rank=rank, calls_once=not self.meta.get("imported"))

    # -- internals --------------------------------------------------------------------------------

    def _table_batches(self, kind: RecordKind, where: str | None, params: Sequence[Any], order_by: str | None,
                       limit: int | None) -> Iterator[list[tuple[Any, ...]]]:
        """The stored rows of one table (all columns, in schema order), batch by batch."""
        if not self.has_table(kind.table):
            return iter(())
        stored = self._connection.stored_columns(kind.table)
        selected = (name if name in stored else f"NULL AS {name}" for name in kind.column_names)
        query = f"SELECT {', '.join(selected)} FROM {kind.table}"
        if where:
            query += f" WHERE {where}"
        query += f" ORDER BY {order_by or 'rowid'}"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        return self._connection.batches(query, params)

    def _converters(self, kind: RecordKind) -> list[Callable[[Any], Any]]:
        converters: list[Callable[[Any], Any]] = []
        for column in kind.columns:
            if column.ref == "strings":
                converters.append(self.string)
            elif column.ref == "frames":
                converters.append(self.frame)
            elif kind.table == "runs" and column.name == "argv":
                converters.append(cells.decode_argv)
            elif column.kind == "TEXT":
                converters.append(cells.text)
            else:
                converters.append(cells.identity)
        return converters


def _record_kind(table: str) -> RecordKind:
    kind = RECORD_KINDS_BY_TABLE.get(table)
    if kind is None:
        raise TputraceError(f"unknown record kind {table!r}; kinds: {', '.join(RECORD_KINDS_BY_TABLE)}")
    return kind
