"""Ops ranked by what they cost, for every view that ranks ops (summary, TUI, HTML treemap, compare).

Two figures per op, each labelled by `HOST_DISPATCH_LABEL` and `CHIP_SHARE_LABEL`:
- Host dispatch without the flushes and compiles that ran inside the call (measured on this host). In
  DeferAndFuse one op's call can run the pending graph and compile it; that time belongs to the flush and
  the compile, not to the op that happened to trigger them.
- Its share of chip time: the time of the programs it ran in, shared out among their ops by the
  device-run model (`tputrace.derived.device_runs`, a roofline on the target chip), as XProf ranks ops;
  in strict mode, where each op is a program of its own, that program's roofline time on the target.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

from tputrace.derived.device_runs import PROGRAM_OPS_LABEL, ProgramRun, is_strict, scan_rank
from tputrace.derived.op_cost import TargetChip
from tputrace.derived.strict_chip_time import strict_chip_time_by_op
from tputrace.derived.trace_tables import OpBatch, TraceTables

if TYPE_CHECKING:
    from tputrace.derived.op_ranking_columns import RankingColumns
    from tputrace.store.reader import Trace

HOST_DISPATCH_LABEL = "host dispatch (excl. flushes/compiles)"
CHIP_SHARE_LABEL = "chip time share"
NOT_PROJECTED = "not projected"
"""What the views show for the chip time share of an op that ran on a chip with nothing to project from."""


@dataclass(frozen=True)
class RankedOp:
    """One op: its calls, host dispatch with and without the flushes and compiles inside its calls, and
    its estimated chip time on the target chip (and both as shares of all ops')."""

    op: str
    calls: int
    dispatch_ns: int
    self_dispatch_ns: int
    self_dispatch_share: float
    chip_ns: float
    chip_share: float
    projected: bool = True  # False: it ran on a chip with nothing to project its time from (no chip time share)


@dataclass(frozen=True)
class OpRanking:
    """Every op of a rank, by host dispatch without nested flushes and compiles, biggest first; the
    chip time is estimated for `target` (None: not computed)."""

    ops: tuple[RankedOp, ...]
    self_dispatch_ns: int
    nested_ns: int
    chip_ns: float
    target: str | None

    def top(self, count: int) -> tuple[RankedOp, ...]:
        return self.ops[:count]

    def by_chip_time(self) -> tuple[RankedOp, ...]:
        return tuple(sorted(self.ops, key=lambda op: -op.chip_ns))


class _Covered:
    """How much of a time range the union of some intervals covers, in two bisections."""

    def __init__(self, intervals: list[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for start, end in sorted(intervals):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts = [start for start, _ in merged]
        self.ends = [end for _, end in merged]
        self.before = [0, *accumulate(end - start for start, end in merged)]

    def upto(self, moment: int) -> int:
        index = bisect_right(self.starts, moment)
        if index == 0:
            return 0
        return self.before[index - 1] + min(moment, self.ends[index - 1]) - self.starts[index - 1]

    def within(self, start: int, end: int) -> int:
        return self.upto(end) - self.upto(start)


def nested_intervals(trace: Trace, rank: int) -> list[tuple[int, int]]:
    """The flushes and compiles of `rank` as (start, end) ns."""
    return [(start, start + duration) for start, duration in trace.sql(
        "SELECT start_ns, dur_ns FROM flushes WHERE rank = ? AND dur_ns IS NOT NULL "
        "UNION ALL SELECT start_ns, dur_ns FROM compiles WHERE rank = ? AND dur_ns IS NOT NULL",
        (rank, rank),
    )]


def nested_ns_by(trace: Trace, columns: str) -> dict[tuple[object, ...], int]:
    """The time of flushes and compiles that ran inside ops, summed per value of the ops' `columns` (a
    comma-separated list of `ops` columns), over every rank."""
    nested: dict[tuple[object, ...], int] = {}
    for rank in trace.ranks:
        covered = _Covered(nested_intervals(trace, rank))
        if not covered.starts:
            continue
        for row in trace.sql(f"SELECT {columns}, start_ns, dur_ns FROM ops WHERE rank = ? AND dur_ns > 0 AND start_ns IS NOT NULL", (rank,)):
            inside = covered.within(row[-2], row[-2] + row[-1])
            if inside:
                key = tuple(row[:-2])
                nested[key] = nested.get(key, 0) + inside
    return nested


def chip_time_by_op(trace: Trace, rank: int, chip: TargetChip, tables: TraceTables | None = None) -> dict[str, float]:
    """Estimated chip ns per op name on `chip` (ops of programs without recorded ops go under
    `PROGRAM_OPS_LABEL`); in strict mode each op's projected time (`strict_chip_time_by_op`)."""
    tables = tables or TraceTables(trace)
    if is_strict(trace, rank):
        return strict_chip_time_by_op(trace, rank, chip, tables)[0]
    chip_ns: dict[str, float] = {}

    def on_run(run: ProgramRun) -> None:
        for key, duration in zip(run.op_keys, run.op_durs_ns):
            name = tables.text(key[2]) if key[2] is not None else PROGRAM_OPS_LABEL
            chip_ns[name or "?"] = chip_ns.get(name or "?", 0.0) + duration

    def on_ops(_rows: OpBatch) -> None:
        return None

    scan_rank(tables, rank, chip, on_run, on_ops, chip_ns.clear)
    return chip_ns


def rank_ops(trace: Trace, rank: int, chip: TargetChip | None = None, columns: RankingColumns | None = None) -> OpRanking:
    """The ops of `rank` ranked by host dispatch without nested flushes and compiles, with their chip
    time share on `chip` when given. Computed over columns (`op_ranking_columns`; `columns` when the
    caller read them already); row by row (`rank_ops_by_rows`) where numpy is not installed or the
    columns cannot be read as integers."""
    try:
        from tputrace.derived.op_ranking_columns import op_sums
    except ImportError:  # numpy is installed with the views, not with the core
        return rank_ops_by_rows(trace, rank, chip)
    sums = op_sums(trace, rank, nested_intervals(trace, rank), chip, columns)
    if sums is None:
        return rank_ops_by_rows(trace, rank, chip)
    calls: dict[str, int] = {}
    dispatch: dict[str, int] = {}
    self_dispatch: dict[str, int] = {}
    for sid, count in sums.calls.items():
        name = (trace.string(sid) if sid is not None else None) or "?"
        calls[name] = calls.get(name, 0) + count
        dispatch[name] = dispatch.get(name, 0) + sums.dispatch_ns[sid]
        self_dispatch[name] = self_dispatch.get(name, 0) + sums.self_dispatch_ns[sid]
    return _ranking(calls, dispatch, self_dispatch, sums.nested_ns, sums.chip_ns, chip, sums.unprojected)


def rank_ops_by_rows(trace: Trace, rank: int, chip: TargetChip | None = None) -> OpRanking:
    """`rank_ops`, reading the ops one row at a time (what the columns' figures are checked against)."""
    covered = _Covered(nested_intervals(trace, rank))
    names = dict(trace.sql("SELECT id, text FROM strings WHERE id IN (SELECT DISTINCT op_sid FROM ops NOT INDEXED WHERE rank = ?)", (rank,)))
    calls: dict[str, int] = {}
    dispatch: dict[str, int] = {}
    self_dispatch: dict[str, int] = {}
    nested_total = 0
    for op_sid, start, duration in trace.sql("SELECT op_sid, start_ns, dur_ns FROM ops WHERE rank = ?", (rank,)):
        name = names.get(op_sid) or "?"
        duration = duration or 0
        nested = covered.within(start, start + duration) if start is not None else 0
        nested_total += nested
        calls[name] = calls.get(name, 0) + 1
        dispatch[name] = dispatch.get(name, 0) + duration
        self_dispatch[name] = self_dispatch.get(name, 0) + duration - nested
    chip_ns: dict[str, float] = {}
    unprojected: frozenset[str] = frozenset()
    if chip is not None and is_strict(trace, rank):
        chip_ns, unprojected = strict_chip_time_by_op(trace, rank, chip)
    elif chip is not None:
        chip_ns = chip_time_by_op(trace, rank, chip)
    return _ranking(calls, dispatch, self_dispatch, nested_total, chip_ns, chip, unprojected)


def _ranking(calls: dict[str, int], dispatch: dict[str, int], self_dispatch: dict[str, int], nested_total: int,
             chip_ns: dict[str, float], chip: TargetChip | None, unprojected: frozenset[str] = frozenset()) -> OpRanking:
    all_self = sum(self_dispatch.values())
    all_chip = sum(chip_ns.values())
    ranked = [
        RankedOp(name, calls.get(name, 0), dispatch.get(name, 0), self_dispatch.get(name, 0),
                 self_dispatch.get(name, 0) / all_self if all_self else 0.0,
                 chip_ns.get(name, 0.0), chip_ns.get(name, 0.0) / all_chip if all_chip else 0.0,
                 name not in unprojected)
        for name in {*calls, *chip_ns}
    ]
    ranked.sort(key=lambda op: (-op.self_dispatch_ns, -op.chip_ns, op.op))
    return OpRanking(tuple(ranked), all_self, nested_total, all_chip, chip.name if chip is not None else None)


def self_dispatch_by_frame_and_module(trace: Trace, rank: int) -> tuple[dict[int | None, int], dict[str, int]]:
    """Host dispatch without nested flushes and compiles, summed per source frame id and per module path,
    for `rank`."""
    covered = _Covered(nested_intervals(trace, rank))
    by_frame: dict[int | None, int] = {}
    by_module: dict[int | None, int] = {}
    for frame_id, module_sid, start, duration in trace.sql(
            "SELECT frame_id, module_sid, start_ns, dur_ns FROM ops WHERE rank = ? AND dur_ns > 0", (rank,)):
        own = duration - (covered.within(start, start + duration) if covered.starts and start is not None else 0)
        by_frame[frame_id] = by_frame.get(frame_id, 0) + own
        by_module[module_sid] = by_module.get(module_sid, 0) + own
    modules: dict[str, int] = {}
    for module_sid, total in by_module.items():
        label = trace.string(module_sid) or "(no module)"
        modules[label] = modules.get(label, 0) + total
    return by_frame, modules
