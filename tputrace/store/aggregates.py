"""Aggregates that views need, computed in SQL over a trace and returned as dataclasses.

Every function takes a trace (what `TraceQueries` names; `tputrace.store.reader.Trace` is one) and an
optional `rank` (None: all ranks together). `Trace` exposes each of them as a method
(`trace.op_stats(...)`), which is how views should call them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Any, Literal, Protocol

from tputrace.schema import RECORD_KINDS
from tputrace.store.errors import TputraceError
from tputrace.store.records import SourceLocation


class TraceQueries(Protocol):
    """What the aggregates read from a trace."""

    def sql(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def string(self, sid: int | None) -> str | None: ...

    def frame(self, frame_id: int | None) -> SourceLocation | None: ...


OpGrouping = Literal["op", "op_shapes", "source", "module"]
OpOrder = Literal["total", "count", "mean"]

_OP_GROUP_COLUMNS: dict[str, tuple[str, ...]] = {
    "op": ("op_sid",),
    "op_shapes": ("op_sid", "inputs_sid"),
    "source": ("frame_id",),
    "module": ("module_sid",),
}
_OP_ORDER_COLUMNS = {"total": "total_ns", "count": "calls", "mean": "mean_ns"}


@dataclass(frozen=True, slots=True)
class OpStat:
    """Time spent dispatching one group of ops; `share` is of all ops' time (in the rank filter)."""

    label: str
    count: int
    total_ns: int
    mean_ns: float
    share: float
    op: str | None = None
    inputs: str | None = None
    source: SourceLocation | None = None
    module: str | None = None


@dataclass(frozen=True, slots=True)
class StepTime:
    """One training step with the work recorded in it."""

    rank: int
    step: int
    start_ns: int
    end_ns: int | None
    source: str | None
    ops: int
    compiles: int
    compile_ns: int
    syncs: int
    sync_ns: int

    @property
    def dur_ns(self) -> int | None:
        return None if self.end_ns is None else self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
class TimeSplit:
    """Where the run's time went, in ns. Categories can overlap (chips run while the host dispatches)."""

    wall_ns: int
    compile_ns: int
    execution_ns: int
    dispatch_ns: int
    sync_ns: int
    transfer_ns: int
    fallback_ns: int
    collective_ns: int

    def parts(self) -> list[tuple[str, int]]:
        """(label, ns) for each category, in a fixed order."""
        return [
            ("compile", self.compile_ns),
            ("program execution", self.execution_ns),
            ("host dispatch", self.dispatch_ns),
            ("sync stalls", self.sync_ns),
            ("transfers", self.transfer_ns),
            ("fallbacks", self.fallback_ns),
            ("collectives", self.collective_ns),
        ]


@dataclass(frozen=True, slots=True)
class CompileStats:
    """Compile records and the wall time they took; nested records (a Dynamo frame's AOT and XLA
    compiles) are each counted, but every instant of compiling counts once in the times."""

    count: int
    total_ns: int
    recompiles: int
    recompile_ns: int
    programs: int
    loaded_from_disk: int = 0  # compiles that read the program from the on-disk compile cache
    loaded_ns: int = 0  # ... and the time they took


@dataclass(frozen=True, slots=True)
class RecompileGroup:
    """Recompiles of one thing for one reason and difference."""

    name: str | None
    reason: str | None
    diff: str | None
    count: int
    total_ns: int
    first_step: int | None
    source: SourceLocation | None


@dataclass(frozen=True, slots=True)
class SyncStat:
    """Host syncs of one kind at one source line."""

    source: SourceLocation | None
    kind: str | None
    count: int
    total_ns: int
    pending_ops: int
    compile_ns: int = 0  # of total_ns, the compiles that ran while the host waited (a first flush compiles)


@dataclass(frozen=True, slots=True)
class FallbackStat:
    """CPU fallbacks of one op."""

    op: str | None
    count: int
    total_ns: int
    source: SourceLocation | None


@dataclass(frozen=True, slots=True)
class CollectiveStat:
    """Collectives of one kind."""

    kind: str | None
    count: int
    bytes: int
    total_ns: int
    wait_ns: int


def rank_filter(rank: int | None, prefix: str = "WHERE ") -> tuple[str, tuple[int, ...]]:
    """SQL limiting a query to `rank` (`" WHERE rank = ?"` and its parameter), or nothing for every rank."""
    if rank is None:
        return "", ()
    return f" {prefix}rank = ?", (rank,)


def _limit_clause(limit: int | None) -> str:
    return "" if limit is None else f" LIMIT {int(limit)}"


def op_stats(
    trace: TraceQueries,
    group_by: OpGrouping = "op",
    *,
    limit: int | None = None,
    order: OpOrder = "total",
    rank: int | None = None,
) -> list[OpStat]:
    """Op dispatch time grouped by op, op and input shapes, source line or module; biggest first."""
    if group_by not in _OP_GROUP_COLUMNS:
        raise TputraceError(f"unknown op grouping {group_by!r}; use one of {', '.join(_OP_GROUP_COLUMNS)}")
    if order not in _OP_ORDER_COLUMNS:
        raise TputraceError(f"unknown op order {order!r}; use one of {', '.join(_OP_ORDER_COLUMNS)}")
    group_columns = ", ".join(_OP_GROUP_COLUMNS[group_by])
    where, params = rank_filter(rank)
    (all_ns,) = trace.sql(f"SELECT COALESCE(SUM(dur_ns), 0) FROM ops{where}", params)[0]
    rows = trace.sql(
        f"SELECT {group_columns}, COUNT(*) AS calls, COALESCE(SUM(dur_ns), 0) AS total_ns, "
        f"COALESCE(AVG(dur_ns), 0) AS mean_ns FROM ops{where} GROUP BY {group_columns} "
        f"ORDER BY {_OP_ORDER_COLUMNS[order]} DESC{_limit_clause(limit)}",
        params,
    )
    stats = []
    for row in rows:
        keys, (count, total_ns, mean_ns) = row[:-3], row[-3:]
        share = total_ns / all_ns if all_ns else 0.0
        if group_by == "op":
            op = trace.string(keys[0])
            stats.append(OpStat(op or "?", count, total_ns, mean_ns, share, op=op))
        elif group_by == "op_shapes":
            op, inputs = trace.string(keys[0]), trace.string(keys[1])
            label = f"{op or '?'}({inputs or ''})"
            stats.append(OpStat(label, count, total_ns, mean_ns, share, op=op, inputs=inputs))
        elif group_by == "source":
            source = trace.frame(keys[0])
            label = str(source) if source else "?"
            stats.append(OpStat(label, count, total_ns, mean_ns, share, source=source))
        else:
            module = trace.string(keys[0])
            stats.append(OpStat(module or "(no module)", count, total_ns, mean_ns, share, module=module))
    return stats


def step_times(trace: TraceQueries, *, rank: int | None = None) -> list[StepTime]:
    """Every step, in (rank, step) order, with its op, compile and sync counts."""
    where, params = rank_filter(rank)
    ops_per_step = _per_step(trace, "SELECT rank, step, COUNT(*), 0 FROM ops{where} GROUP BY rank, step", where, params)
    compile_counts = _per_step(trace, "SELECT rank, step, COUNT(*), 0 FROM compiles{where} GROUP BY rank, step", where, params)
    compile_ns_per_step = compile_wall_ns(trace, rank=rank, by="step")
    syncs_per_step = _per_step(
        trace,
        "SELECT rank, step, COUNT(*), COALESCE(SUM(dur_ns), 0) FROM syncs{where} GROUP BY rank, step",
        where,
        params,
    )
    steps = []
    for step_rank, step, start_ns, end_ns, source in trace.sql(
        f"SELECT rank, step, start_ns, end_ns, source FROM steps{where} ORDER BY rank, step", params
    ):
        key = (step_rank, step)
        compiles, compile_ns = compile_counts.get(key, (0, 0))[0], compile_ns_per_step.get(key, 0)
        syncs, sync_ns = syncs_per_step.get(key, (0, 0))
        steps.append(
            StepTime(
                step_rank,
                step,
                start_ns,
                end_ns,
                source,
                ops=ops_per_step.get(key, (0, 0))[0],
                compiles=compiles,
                compile_ns=compile_ns,
                syncs=syncs,
                sync_ns=sync_ns,
            )
        )
    return steps


def _per_step(trace: TraceQueries, query: str, where: str, params: tuple[int, ...]) -> dict[tuple[int, int], tuple[int, int]]:
    return {(rank, step): (count, total) for rank, step, count, total in trace.sql(query.format(where=where), params)}


def time_split(trace: TraceQueries, *, rank: int | None = None, calls_once: bool = False) -> TimeSplit:
    """Total ns per category; `wall_ns` is the run's wall time (the longest rank's, for all ranks).

    Compile time is the wall time spent compiling (nested compile records count once); the other
    categories are sums of their records' durations, but for a recorded run's collectives (`calls_once`): each
    rank's time with a call in flight, as asynchronous calls waited for together overlap (an import's rows of
    several chips are summed)."""
    where, params = rank_filter(rank)
    tables = ("ops", "syncs", "transfers", "fallbacks", "collectives")
    sums = ", ".join(f"(SELECT COALESCE(SUM(dur_ns), 0) FROM {table}{where})" for table in tables)
    totals = list(trace.sql(f"SELECT {sums}", params * len(tables))[0])
    if calls_once:
        totals[-1] = sum(in_flight_ns for in_flight_ns, _ in collectives_in_flight(trace, "rank", rank_filter(rank, "AND ")).values())
    wall = wall_ns(trace, rank=rank)
    execution_ns = sum(execution_busy_ns(trace, rank=rank).values())
    # A share of the wall: an imported profile's compiles from its process's TORCH_TRACE log can lie before the
    # profile's window (a compile in a profiling schedule's warm-up step); only their time inside it counts.
    return TimeSplit(wall, compile_total_ns(trace, rank=rank, within=(0, wall)), execution_ns, *totals)


def execution_spans_sql(where: str, partition: str = "rank, chip") -> str:
    """SQL of the `executions` rows matching `where` (over its columns), each with the part in which its chip had no
    earlier program in flight: (rank, step, program_id, chip, begin_ns, end_ns, busy_ns).

    A row lasts from its launch to its outputs seen ready, so a program launched while others ran on its chip includes
    its wait behind them. Each row counts from where the rows launched before it in its `partition` (its chip's, by
    default) end, so that summing `busy_ns` counts each instant a chip had a program in flight once."""
    return (
        "SELECT rank, step, program_id, chip, begin_ns, start_ns + dur_ns AS end_ns, "
        "MAX(0, start_ns + dur_ns - begin_ns) AS busy_ns FROM (SELECT *, MAX(start_ns, COALESCE(MAX(start_ns + dur_ns) "
        f"OVER (PARTITION BY {partition} ORDER BY start_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)) "
        f"AS begin_ns FROM executions WHERE dur_ns IS NOT NULL AND start_ns IS NOT NULL AND ({where}))"
    )


def execution_busy_ns(trace: TraceQueries, *, rank: int | None = None, by: CompileGrouping = "rank"
                      ) -> dict[tuple[int, int], int]:
    """Time each chip had a program in flight, summed over the chips of each (rank, 0) or (rank, step); with
    `by="step"`, each step's programs on their own (a program waiting behind the previous step's counts from its
    launch)."""
    where, params = rank_filter(rank, prefix="")
    partition = "rank, chip, step" if by == "step" else "rank, chip"
    rows = trace.sql(
        f"SELECT rank, {_COMPILE_GROUP_COLUMNS[by]} AS group_key, SUM(busy_ns) "
        f"FROM ({execution_spans_sql(where or '1', partition)}) GROUP BY rank, group_key",
        params,
    )
    return {(row_rank, group_key): int(busy_ns) for row_rank, group_key, busy_ns in rows}


def merged_spans(intervals: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """The union of (start_ns, end_ns) intervals sorted by start, as disjoint intervals in order; read as it goes, so
    a query's rows need not be held at once."""
    span: tuple[int, int] | None = None  # the current run of overlapping intervals
    for start_ns, end_ns in intervals:
        if span is not None and start_ns <= span[1]:
            span = (span[0], max(span[1], end_ns))
            continue
        if span is not None:
            yield span
        span = (start_ns, end_ns)
    if span is not None:
        yield span


def merged_intervals(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of (start_ns, end_ns) intervals in any order, as sorted disjoint intervals."""
    return list(merged_spans(sorted(intervals)))


def merged_ns(intervals: Iterable[tuple[int, int]]) -> int:
    """The length of the union of (start_ns, end_ns) intervals sorted by start: each instant counts once."""
    return sum(end_ns - start_ns for start_ns, end_ns in merged_spans(intervals))


CompileGrouping = Literal["rank", "step"]
_COMPILE_GROUP_COLUMNS: dict[str, str] = {"rank": "0", "step": "step"}


def compile_wall_ns(
    trace: TraceQueries, *, rank: int | None = None, condition: str = "1", by: CompileGrouping = "rank"
) -> dict[tuple[int, int], int]:
    """Wall time spent compiling per (rank, 0) or (rank, step): the union
    of the intervals of the `compiles` rows matching the SQL `condition`, so nested or overlapping
    compiles (a Dynamo frame's AOTAutograd and XLA compiles) count each instant once."""
    where, params = rank_filter(rank, prefix="AND ")
    rows = trace.sql(
        f"SELECT rank, {_COMPILE_GROUP_COLUMNS[by]} AS group_key, start_ns, start_ns + COALESCE(dur_ns, 0) "
        f"FROM compiles WHERE ({condition}){where} ORDER BY rank, group_key, start_ns",
        params,
    )
    return {
        key: merged_ns((start_ns, end_ns) for _, _, start_ns, end_ns in group)
        for key, group in groupby(rows, key=lambda row: (row[0], row[1]))
    }


def compile_total_ns(trace: TraceQueries, *, rank: int | None = None, condition: str = "1",
                     within: tuple[int, int] | None = None) -> int:
    """Wall time spent compiling (rows matching `condition`), each rank's instants once, summed over ranks; with
    `within` (start, end), only the time inside it."""
    if within is None:
        return sum(compile_wall_ns(trace, rank=rank, condition=condition).values())
    where, params = rank_filter(rank, prefix="AND ")
    rows = trace.sql(f"SELECT rank, MAX(start_ns, ?), MIN(start_ns + COALESCE(dur_ns, 0), ?) FROM compiles "
                     f"WHERE ({condition}){where} ORDER BY rank, 2", (*within, *params))
    return sum(merged_ns((start_ns, end_ns) for _, start_ns, end_ns in group if end_ns > start_ns)
               for _, group in groupby(rows, key=lambda row: row[0]))


def wall_ns(trace: TraceQueries, *, rank: int | None = None) -> int:
    """The run's wall time: the runs' end times, or the last event for a run without an end record."""
    where, params = rank_filter(rank)
    ends: list[int | None] = [end_ns for (end_ns,) in trace.sql(f"SELECT end_ns FROM runs{where}", params)]
    finished = [end_ns for end_ns in ends if end_ns is not None]
    if ends and len(finished) == len(ends):
        return max(finished)
    return time_range(trace, rank=rank)[1]


def _event_bounds() -> list[tuple[str, str, str]]:
    """(table, start expression, end expression) for every table with a time column."""
    bounds = []
    for kind in RECORD_KINDS:
        names = kind.column_names
        if "start_ns" in names:
            if "dur_ns" in names:
                end = "start_ns + COALESCE(dur_ns, 0)"
            elif "end_ns" in names:
                end = "COALESCE(end_ns, start_ns)"
            else:
                end = "start_ns"
            bounds.append((kind.table, "start_ns", end))
        elif "t_ns" in names:
            bounds.append((kind.table, "t_ns", "t_ns"))
    return bounds


def time_range(trace: TraceQueries, *, rank: int | None = None) -> tuple[int, int]:
    """(first event start, last event end) in ns since the run's start; (0, 0) for an empty trace."""
    where, params = rank_filter(rank)
    bounds = _event_bounds()
    parts = " UNION ALL ".join(
        f"SELECT MIN({start}) AS first_ns, MAX({end}) AS last_ns FROM {table}{where}" for table, start, end in bounds
    )
    first_ns, last_ns = trace.sql(f"SELECT MIN(first_ns), MAX(last_ns) FROM ({parts})", params * len(bounds))[0]
    return (first_ns or 0, last_ns or 0)


# SQL over `compiles`: the compile is a recompile.
RECOMPILE = "reason IS NOT NULL AND reason != 'first'"

# SQL over `compiles c`: no other compile of the rank encloses this one (a Dynamo frame encloses its
# AOTAutograd compile, which encloses its XLA compile); of identical intervals, the lowest id is outermost.
# An enclosing compile starts at most the longest compile's duration before c, which bounds the index scan.
OUTERMOST_COMPILE = (
    "NOT EXISTS (SELECT 1 FROM compiles p WHERE p.rank = c.rank "
    "AND p.start_ns >= c.start_ns - (SELECT COALESCE(MAX(dur_ns), 0) FROM compiles) AND p.start_ns <= c.start_ns "
    "AND p.id != c.id AND p.start_ns + p.dur_ns >= c.start_ns + c.dur_ns AND (p.start_ns < c.start_ns "
    "OR p.start_ns + p.dur_ns > c.start_ns + c.dur_ns OR p.id < c.id))"
)

# SQL over `compiles`: the compile was a load from the on-disk compile cache (the recorder's
# `json.dumps` spelling of the detail key; SQLite's JSON functions are not on every Python build).
LOADED_FROM_DISK = "detail LIKE '%\"loaded_from_disk\": true%'"


def compile_stats(trace: TraceQueries, *, rank: int | None = None) -> CompileStats:
    """Compile and recompile counts and wall time (each instant once), and the number of distinct programs."""
    where, params = rank_filter(rank)
    count, recompiles, loaded_from_disk = trace.sql(
        f"SELECT COUNT(*), COALESCE(SUM({RECOMPILE}), 0), COALESCE(SUM({LOADED_FROM_DISK}), 0) FROM compiles{where}",
        params,
    )[0]
    (programs,) = trace.sql(f"SELECT COUNT(*) FROM programs{where}", params)[0]
    return CompileStats(
        count,
        compile_total_ns(trace, rank=rank),
        recompiles,
        compile_total_ns(trace, rank=rank, condition=RECOMPILE),
        programs,
        loaded_from_disk,
        compile_total_ns(trace, rank=rank, condition=LOADED_FROM_DISK),
    )


def recompile_groups(trace: TraceQueries, *, limit: int | None = 10, rank: int | None = None) -> list[RecompileGroup]:
    """Recompiles grouped by what was compiled, the reason and the difference; most frequent first."""
    where, params = rank_filter(rank, prefix="AND ")
    rows = trace.sql(
        "SELECT name_sid, reason, diff_sid, COUNT(*) AS n, COALESCE(SUM(dur_ns), 0) AS total_ns, MIN(step), "
        f"MIN(frame_id) FROM compiles WHERE {RECOMPILE}{where} "
        f"GROUP BY name_sid, reason, diff_sid ORDER BY n DESC, total_ns DESC{_limit_clause(limit)}",
        params,
    )
    return [
        RecompileGroup(
            trace.string(name_sid), reason, trace.string(diff_sid), count, total_ns, first_step, trace.frame(frame_id)
        )
        for name_sid, reason, diff_sid, count, total_ns, first_step, frame_id in rows
    ]


# The time of the compiles that ran inside sync `s`'s stall (SQL over `syncs s`): the first flush of a
# new program compiles it while the host waits.
SYNC_COMPILE_NS = (
    "MIN(s.dur_ns, COALESCE((SELECT SUM(MIN(c.start_ns + c.dur_ns, s.start_ns + s.dur_ns) - MAX(c.start_ns, s.start_ns)) "
    "FROM compiles c WHERE c.rank = s.rank AND c.start_ns < s.start_ns + s.dur_ns AND c.start_ns + c.dur_ns > s.start_ns "
    f"AND {OUTERMOST_COMPILE}), 0))"
)


def sync_stats(trace: TraceQueries, *, limit: int | None = None, rank: int | None = None) -> list[SyncStat]:
    """Host syncs grouped by source line and kind; longest total stall first."""
    where, params = rank_filter(rank, prefix="WHERE s.")
    rows = trace.sql(
        "SELECT s.frame_id, s.kind, COUNT(*), COALESCE(SUM(s.dur_ns), 0) AS total_ns, COALESCE(SUM(s.pending_ops), 0), "
        f"COALESCE(SUM({SYNC_COMPILE_NS}), 0) FROM syncs s{where} GROUP BY s.frame_id, s.kind "
        f"ORDER BY total_ns DESC{_limit_clause(limit)}",
        params,
    )
    return [
        SyncStat(trace.frame(frame_id), kind, count, total_ns, pending_ops, compile_ns)
        for frame_id, kind, count, total_ns, pending_ops, compile_ns in rows
    ]


def fallback_stats(trace: TraceQueries, *, limit: int | None = None, rank: int | None = None) -> list[FallbackStat]:
    """CPU fallbacks grouped by op; longest total time first."""
    where, params = rank_filter(rank)
    rows = trace.sql(
        "SELECT op_sid, COUNT(*), COALESCE(SUM(dur_ns), 0) AS total_ns, MIN(frame_id) "
        f"FROM fallbacks{where} GROUP BY op_sid ORDER BY total_ns DESC{_limit_clause(limit)}",
        params,
    )
    return [
        FallbackStat(trace.string(op_sid), count, total_ns, trace.frame(frame_id))
        for op_sid, count, total_ns, frame_id in rows
    ]


def collectives_in_flight(trace: TraceQueries, by: str, condition: tuple[str, tuple[Any, ...]] = ("", ())
                          ) -> dict[tuple[Any, ...], tuple[int, int]]:
    """Per group of the collectives' `by` columns (`"rank, kind"`), among the calls `condition` selects (`" AND
    rank = ?"` and its parameters): the time a call was in flight and the time one waited for the last rank's arrival
    (a call waits from its own arrival, `start_ns`, for `wait_ns`), each instant once."""
    where, params = condition
    spans: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
    waits: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
    for *key, start_ns, end_ns, wait_ns in trace.sql(
        f"SELECT {by}, start_ns, start_ns + COALESCE(dur_ns, 0), COALESCE(wait_ns, 0) FROM collectives "
        f"WHERE start_ns IS NOT NULL{where} ORDER BY start_ns", params
    ):
        spans.setdefault(tuple(key), []).append((start_ns, end_ns))
        waits.setdefault(tuple(key), []).append((start_ns, start_ns + wait_ns))
    return {key: (merged_ns(intervals), merged_ns(waits[key])) for key, intervals in spans.items()}


def collective_stats(trace: TraceQueries, *, rank: int | None = None, calls_once: bool = False) -> list[CollectiveStat]:
    """Collectives grouped by kind; longest total time first. A kind's time and waiting are its calls' summed durations
    and waits, but for a recorded run's (`calls_once`): each rank's time with a call of that kind in flight, and with one
    waiting for the last rank's arrival (a call waits from its own arrival, `start_ns`, for `wait_ns`), as asynchronous
    calls waited for together overlap (the time split's collectives, kind by kind; an import's rows of several chips
    are summed)."""
    where, params = rank_filter(rank)
    rows = trace.sql(
        "SELECT kind, COUNT(*), COALESCE(SUM(bytes), 0), COALESCE(SUM(dur_ns), 0) AS total_ns, "
        f"COALESCE(SUM(wait_ns), 0) FROM collectives{where} GROUP BY kind ORDER BY total_ns DESC",
        params,
    )
    stats = [CollectiveStat(*row) for row in rows]
    if not calls_once:
        return stats
    in_flight_ns: dict[str | None, int] = {}
    waiting_ns: dict[str | None, int] = {}
    for (_, kind), (flight_ns, wait_ns) in collectives_in_flight(trace, "rank, kind", rank_filter(rank, "AND ")).items():
        in_flight_ns[kind] = in_flight_ns.get(kind, 0) + flight_ns
        waiting_ns[kind] = waiting_ns.get(kind, 0) + wait_ns
    stats = [replace(stat, total_ns=in_flight_ns.get(stat.kind, 0), wait_ns=waiting_ns.get(stat.kind, 0)) for stat in stats]
    return sorted(stats, key=lambda stat: -stat.total_ns)
