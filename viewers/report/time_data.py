"""Where the run's time goes, for the report: the steps by category, time by category, op time by
module path and op, and the source lines that cost most. Aggregated in SQL; values are raw (ns)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tputrace.derived.imported_sources import imported_device, measured_on
from tputrace.derived.op_ranking import nested_ns_by
from tputrace.derived.op_time import HOST_DISPATCH, op_time_kind
from tputrace.derived.steps import StepRow, step_rows
from tputrace.store.aggregates import TimeSplit, compile_total_ns
from tputrace.store.records import SourceLocation

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

TREEMAP_LEAVES = 500
TOP_SOURCE_LINES = 15


@dataclass
class StepData:
    """The timed steps of every rank (with their time by category), and the ranks."""

    steps: list[StepRow]
    ranks: list[int]


def prepare_steps(trace: Trace) -> StepData:
    """Per step and rank: duration and the time in compiles, syncs, collectives, programs, dispatch, fallbacks."""
    rows = [row for row in step_rows(trace, breakdown=True) if row.end_ns is not None]
    return StepData(rows, sorted({row.rank for row in rows}))


@dataclass
class TreeNode:
    id: str
    label: str
    parent: str
    value_ns: int
    count: int
    path: str


@dataclass
class SourceLineRow:
    source: SourceLocation | None
    total_ns: int
    parts_ns: dict[str, int]
    counts: dict[str, int]


@dataclass
class WhereData:
    """Time by category and op time by module and op, over all ranks (`wall_ns` adds up the ranks' wall times)."""

    time_split: list[tuple[str, int]]
    wall_ns: int
    ranks: int
    tree: list[TreeNode]
    tree_total_ns: int
    leaves_merged: int
    source_lines: list[SourceLineRow]
    op_label: str = HOST_DISPATCH  # what the ops' times are: host dispatch, or an XProf import's device op time
    measured_on: str = "this host"  # where the times were measured (`tputrace.derived.imported_sources.measured_on`)


def prepare_where(trace: Trace, *, leaves: int = TREEMAP_LEAVES, top_lines: int = TOP_SOURCE_LINES) -> WhereData:
    """Time split by category, op time by module path → op, and the source lines that cost most.

    Op time is host dispatch without the flushes and compiles that ran inside the calls (an XProf import's: each
    op's device time), as the summary ranks ops (`tputrace.derived.op_ranking`). Ops are read in one pass, grouped by module, op and line;
    the tree, the lines' op time and the dispatch total all come from it (the ops table is nearly all of
    a big trace)."""
    nested = nested_ns_by(trace, "module_sid, op_sid, frame_id")
    op_groups = [
        (module_sid, op_sid, frame_id, count, total - nested.get((module_sid, op_sid, frame_id), 0))
        for module_sid, op_sid, frame_id, count, total in trace.sql(
            "SELECT module_sid, op_sid, frame_id, COUNT(*), COALESCE(SUM(dur_ns), 0) FROM ops GROUP BY module_sid, op_sid, frame_id"
        )
    ]
    by_module_op: dict[tuple[Any, Any], list[int]] = defaultdict(lambda: [0, 0])
    by_frame: dict[Any, list[int]] = defaultdict(lambda: [0, 0])
    for module_sid, op_sid, frame_id, count, total in op_groups:
        for key_total in (by_module_op[(module_sid, op_sid)], by_frame[frame_id]):
            key_total[0] += count
            key_total[1] += total
    rows = sorted(((module, op, count, total) for (module, op), (count, total) in by_module_op.items()),
                  key=lambda row: -row[3])
    tree, merged = _module_tree(trace, rows, leaves)
    tree_total = sum(row[3] for row in rows)
    split = _time_split(trace, dispatch_ns=tree_total)
    ranks = trace.ranks
    wall = sum(trace.wall_ns(rank=rank) for rank in ranks) if len(ranks) > 1 else split.wall_ns
    op_label = op_time_kind(trace, trace.run.rank).label
    parts = [(op_label if label == HOST_DISPATCH else label, ns) for label, ns in split.parts()]
    return WhereData(parts, wall, len(ranks), tree, tree_total, merged, _source_lines(trace, by_frame, top_lines),
                     op_label, measured_on(imported_device(trace, trace.run.rank)))


def _time_split(trace: Trace, *, dispatch_ns: int) -> TimeSplit:
    """`trace.time_split()` without summing the ops table again."""
    (execution_ns, sync_ns, transfer_ns, fallback_ns, collective_ns) = trace.sql(
        "SELECT " + ", ".join(f"(SELECT COALESCE(SUM(dur_ns), 0) FROM {table})" for table in
                              ("executions", "syncs", "transfers", "fallbacks", "collectives"))
    )[0]
    return TimeSplit(trace.wall_ns(), compile_total_ns(trace), execution_ns, dispatch_ns, sync_ns, transfer_ns, fallback_ns,
                     collective_ns)


def _module_tree(trace: Trace, rows: list[tuple[Any, ...]], leaves: int) -> tuple[list[TreeNode], int]:
    """Treemap nodes: module path components down to ops; leaves beyond `leaves` merge per module."""
    nodes: dict[str, TreeNode] = {}
    ids: dict[str, str] = {}

    def node_id(path: str) -> str:
        if path not in ids:
            ids[path] = f"n{len(ids)}"
        return ids[path]

    def add(path: str, label: str, parent_path: str | None, value: int, count: int) -> None:
        key = node_id(path)
        node = nodes.get(key)
        if node is None:
            nodes[key] = TreeNode(key, label, node_id(parent_path) if parent_path is not None else "", value, count, path)
        else:
            node.value_ns += value
            node.count += count

    merged = 0
    for position, (module_sid, op_sid, count, total) in enumerate(rows):
        module = trace.string(module_sid) or "(no module)"
        parts = module.split(".") if module_sid is not None else ["(no module)"]
        for depth in range(len(parts)):
            path = "\x00".join(parts[: depth + 1])
            add(path, parts[depth], "\x00".join(parts[:depth]) if depth else None, total, count)
        module_path = "\x00".join(parts)
        if position < leaves:
            op = trace.string(op_sid) or "?"
            add(module_path + "\x01" + op, op, module_path, total, count)
        else:
            merged += 1
            add(module_path + "\x01(other ops)", "(other ops)", module_path, total, count)
    return list(nodes.values()), merged


_SOURCE_TABLES = (
    ("sync stall", "syncs"),
    ("fallback", "fallbacks"),
    ("compile", "compiles"),
    ("transfer", "transfers"),
    ("collective", "collectives"),
)


def _source_lines(trace: Trace, ops_by_frame: dict[Any, list[int]], top: int) -> list[SourceLineRow]:
    """The lines with the most recorded time, one row per line: a line's frames (one per call's columns, and the
    whole line's for a flush's compile) are added up, as `SourceLocation` equality counts them one location."""
    parts: dict[SourceLocation | None, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    counts: dict[SourceLocation | None, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for frame_id, (count, total) in ops_by_frame.items():
        location = trace.frame(frame_id)
        parts[location]["op dispatch"] += total
        counts[location]["op dispatch"] += count
    for label, table in _SOURCE_TABLES:
        for frame_id, count, total in trace.sql(
            f"SELECT frame_id, COUNT(*), COALESCE(SUM(dur_ns), 0) FROM {table} GROUP BY frame_id"
        ):
            location = trace.frame(frame_id)
            parts[location][label] += total
            counts[location][label] += count
    ordered = sorted(parts, key=lambda location: -sum(parts[location].values()))[:top]
    return [
        SourceLineRow(location, sum(parts[location].values()), dict(parts[location]), dict(counts[location]))
        for location in ordered
    ]

