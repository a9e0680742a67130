"""The data source the TUI is given: an open trace, the rank on show, where to find sources, and
results that several views share (computed once, on whichever worker thread asks first).

Workers read through `reader()`, which lends each one a `Trace` of its own (a pool of read-only
connections to the same file), so a long aggregation in one view never makes another view wait
for a shared connection. No Textual here: the app is handed a `Session`, and tests can build one
around any trace.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tputrace.derived.imported_sources import imported_device, imported_source, measured_on
from tputrace.derived.op_time import OpTimeKind, op_time_kind
from tputrace.derived.run_facts import default_rank, run_facts
from tputrace.derived.steps import StepRow, step_rows
from tputrace.source_digests import SourceDigest
from tputrace.tui import queries

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

T = TypeVar("T")


@dataclass
class Session:
    """What every view reads through. `rank` is the rank on show; `source_roots` are searched for
    recorded files that are not at their recorded path."""

    trace: Trace
    rank: int
    source_roots: tuple[str, ...] = ()
    baseline_path: Path | None = None  # the run the Compare view compares with (`--compare`)
    _cache: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _idle_readers: list[Trace] = field(default_factory=list, repr=False)
    _readers: list[Trace] = field(default_factory=list, repr=False)

    @classmethod
    def open(cls, trace: Trace, *, rank: int | None = None, source_roots: Sequence[str] = (),
             baseline_path: Path | None = None) -> Session:
        """A session on `trace` showing `rank` (default: rank 0 or the first rank), compared with the run at
        `baseline_path` when given."""
        chosen = default_rank(trace) if rank is None else rank
        roots = [*source_roots]
        run_cwd = trace.run.cwd
        if run_cwd:
            roots.append(run_cwd)
        roots.extend([str(Path(trace.path).resolve().parent), str(Path.cwd())])
        return cls(trace, chosen, tuple(dict.fromkeys(roots)), baseline_path)

    @property
    def measured_on(self) -> str:
        """Where the shown rank's times were measured: this host, or an imported capture's device."""
        return measured_on(imported_device(self.trace, self.rank))

    @property
    def imported_format(self) -> str | None:
        """The capture format the shown rank was imported from (`torch_profiler_json`, ...); None for a recording."""
        source = imported_source(self.trace, self.rank)
        return str(source.get("format") or "imported") if source is not None else None

    def check(self) -> None:
        """Read what the first screen needs, so that a damaged file fails here (one `TraceError`)
        before any UI starts: every table's row count, the ops table's pages, strings and frames."""
        trace = self.trace
        trace.counts()
        trace.sql("SELECT COUNT(*) FROM ops NOT INDEXED")
        trace.string(-1)
        trace.frame(-1)
        run_facts(trace, self.rank)

    @contextmanager
    def reader(self) -> Iterator[Trace]:
        """A `Trace` on the same file for one worker's queries (opened on first need, then reused), searching
        `source_roots` for the copy of a file the run saw where an older trace's columns need its text."""
        with self._lock:
            trace = self._idle_readers.pop() if self._idle_readers else None
        if trace is None:
            from tputrace.store.reader import open_trace

            trace = open_trace(Path(self.trace.path).resolve(), source_roots=self.source_roots)
            with self._lock:
                self._readers.append(trace)
        try:
            yield trace
        finally:
            with self._lock:
                self._idle_readers.append(trace)

    def close(self) -> None:
        """Close the readers the pool opened (not `trace`, which belongs to the caller)."""
        with self._lock:
            readers, self._readers, self._idle_readers = self._readers, [], []
        for trace in readers:
            trace.close()

    def forget(self) -> None:
        """Drop every shared result: later requests compute them again (the load benchmark uses this
        to time aggregations a second time)."""
        with self._lock:
            self._cache.clear()

    def shared(self, key: tuple[Any, ...], compute: Callable[[Trace], T]) -> T:
        """`compute(trace)` once per key; concurrent callers of the same key wait for the first."""
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                entry = self._cache[key] = _Once()

        def run() -> T:
            with self.reader() as trace:
                return compute(trace)

        return entry.get(run)

    def op_time(self, rank: int) -> OpTimeKind:
        """What `rank`'s op times are (host dispatch or the device's op times) and whether a chip time share is
        told beside them, as the summary says."""
        return self.shared(("op_time", rank), lambda trace: op_time_kind(trace, rank))

    def findings(self, rank: int | None = None) -> queries.FindingsResult:
        """The analysis of `rank` (default: the rank on show), its slowest analyzer on a second reader."""
        chosen = self.rank if rank is None else rank
        return self.shared(("findings", chosen), lambda trace: queries.load_findings(trace, chosen, reader=self.reader))

    def op_groups(self, rank: int, grouping: queries.OpGrouping, text: str = "") -> list[queries.OpGroup]:
        """Ops of `rank` grouped by `grouping`, aggregated once (by op and by op and shapes from one read of the
        ops' columns, the others from another); a filter narrows those groups without another scan (unless
        they were capped)."""
        if grouping == "op":
            groups = self._ops_read(rank).by_op
        elif grouping == "op_shapes":
            groups = self._ops_read(rank).by_op_shapes
        else:  # the other groupings come from one read of their columns
            others = [other for other in queries.OP_GROUPINGS if other not in ("op", "op_shapes")]
            with self._lock:
                read_started = ("ops_read", rank) in self._cache
            durations = self._ops_read(rank).durs_ns if read_started else None  # the durations that read has
            groups = self.shared(("op_groups", rank, "others"), lambda trace: queries.op_groups_by(trace, others, rank, durations))[grouping]
        if not text:
            return groups
        matching = queries.filter_groups(groups, text)
        if matching is not None:
            return matching
        all_ns = self.ops_total_ns(rank)
        with self.reader() as trace:
            return queries.op_groups(trace, grouping, rank, text, all_ns=all_ns)

    def _ops_read(self, rank: int) -> queries.OpsRead:
        return self.shared(("ops_read", rank), lambda trace: queries.ops_read(trace, rank))

    def op_times(self, rank: int) -> queries.OpTimes | None:
        """The ops' times the Timeline buckets: those the Ops view's read kept when it has run or is
        running (one read of the ops serves both), else read alone (two columns instead of four)."""
        with self._lock:
            read_started = ("ops_read", rank) in self._cache
        if read_started:
            return self._ops_read(rank).times
        return self.shared(("op_times", rank), lambda trace: queries.op_times(trace, rank))

    def steps(self) -> list[StepRow]:
        rank = self.rank
        return self.shared(("steps", rank), lambda trace: step_rows(trace, rank))

    def ops_total_ns(self, rank: int | None = None) -> int:
        rank = self.rank if rank is None else rank
        return self.shared(("ops_total", rank), lambda trace: queries.ops_total_ns(trace, rank))

    def source_stats(self) -> list[queries.FileStat]:
        """Per-line stats of the rank on show; the ops' part is the Ops view's grouping by source line."""
        rank = self.rank

        def compute(trace: Trace) -> list[queries.FileStat]:
            ops_by_source = self.op_groups(rank, "source")
            uncapped = len(ops_by_source) < queries.MAX_GROUPS
            return queries.source_stats(trace, rank, ops_by_source if uncapped else None,
                                        queries.caused_compiles(trace, rank))

        return self.shared(("source", rank), compute)

    def source_digests(self) -> dict[str, SourceDigest]:
        """The rank's source files as its run saw them, by recorded path."""
        rank = self.rank

        def compute(trace: Trace) -> dict[str, SourceDigest]:
            return {file: SourceDigest(record.sha256, record.size) for file, record in trace.source_files(rank=rank).items()}

        return self.shared(("source_digests", rank), compute)

    def source_digest(self, recorded: str) -> SourceDigest | None:
        return self.source_digests().get(recorded)

    def resolve_source(self, recorded: str) -> Path | None:
        return queries.resolve_source(recorded, self.source_roots, self.source_digest(recorded))


class _Once:
    """A value computed by the first caller; later callers wait and share it (or its exception)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def get(self, compute: Callable[[], T]) -> T:
        with self._lock:
            if not self._done:
                try:
                    self._value = compute()
                except Exception as error:
                    self._error = error
                self._done = True
        if self._error is not None:
            raise self._error
        return self._value
