"""Data for the HTML report: pure functions from a `Trace` to plain dataclasses, one per section.

Everything here is analysis and aggregation (in SQL, so that a trace of a million events stays quick);
nothing here imports plotly or builds a figure (that is `plotly_figures`). Values are raw: times in
ns, sizes in bytes, strings as they are in the trace (unescaped); presentation formats and escapes them.

Findings come from `tputrace.analysis.analyze`; the target chip (tiles, MXU, peak FLOP/s, HBM and ICI
bandwidth) from `tputrace.analysis.chips`, and matmul shapes are read and padded exactly as the padding
analyzer does. If the diagnoses fail, the sections carry no findings and say so. Nothing here invents a
figure: what is not in the trace or the analysis is left out and said to be left out.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tputrace.analysis import chips
from tputrace.analysis.call_sites import call_label
from tputrace.analysis.chips import Chip
from tputrace.analysis.context import steady
from tputrace.analysis.findings import AnalysisResult, Finding, plain, rank as rank_findings
from tputrace.analysis.padding import pad_product
from tputrace.analysis.recompiles import RecompileData as RecompileAnalysis, SizeSource, StormData
from tputrace.analysis.shapes import Matmul, matmuls_of, op_family, parse_specs
from tputrace.store.aggregates import RECOMPILE, TimeSplit, compile_total_ns, merged_ns
from tputrace.store.records import SourceLocation

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

# The timeline draws at most this many events individually (the longest ones of each lane when a lane
# has more); everything else is merged into per-lane time bins. Both bound the file size and keep
# WebGL drawing and hovering smooth however big the trace is.
TIMELINE_EVENT_BUDGET = 30_000
TIMELINE_BINS_PER_LANE = 1_500
TREEMAP_LEAVES = 500
TOP_SOURCE_LINES = 15
MAX_SCATTER_POINTS = 20_000
MEMORY_POINTS_PER_SERIES = 4_000
COMPARE_TOP_OPS = 15

# Which report section shows an analyzer's findings: by name for the analyzers of tputrace.analysis,
# else by words in the analyzer's name (first match wins), else "where".
ANALYZER_SECTIONS: dict[str, str] = {
    "recompiles": "recompilations",
    "program_cache": "recompilations",
    "set_up_work": "recompilations",
    "compile_cache": "recompilations",
    "syncs": "timeline",
    "fallbacks": "timeline",
    "fusion": "timeline",
    "transfers": "timeline",
    "index_errors": "timeline",
    "padding": "shapes",
    "precision": "shapes",
    "host_bound": "steps",
    "memory": "memory",
    "collectives": "collectives",
}
SECTION_KEYWORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("recompilations", ("recompil", "compile", "bucket", "graph_break")),
    ("shapes", ("padding", "tile", "mxu", "float32", "fp32", "precision", "dtype", "shape")),
    ("collectives", ("collective", "straggler", "fsdp", "dtensor", "mesh")),
    ("memory", ("memory", "hbm", "oom")),
    ("roofline", ("roofline", "intensity", "bound_by")),
    ("steps", ("host_bound", "host-bound", "hostbound", "step")),
    ("timeline", ("sync", "fallback", "fusion", "flush", "transfer", "copy")),
)
SECTIONS: tuple[str, ...] = (
    "timeline", "steps", "where", "recompilations", "shapes", "roofline", "collectives", "memory",
)


# -- analysis (findings) and the target chip ---------------------------------------------------------


@dataclass
class AnalysisData:
    """Findings and per-analyzer results from `tputrace.analysis`, and the target chip they assume."""

    available: bool
    note: str
    target: Chip
    target_is_default: bool
    findings: list[Finding] = field(default_factory=list)
    results: dict[str, AnalysisResult] = field(default_factory=dict)

    def findings_for(self, section: str) -> list[Finding]:
        return [finding for finding in self.findings if section_of(finding.analyzer) == section]

    def results_for(self, section: str) -> list[AnalysisResult]:
        return [result for name, result in self.results.items() if section_of(name) == section]

    @property
    def target_text(self) -> str:
        return f"{self.target.label}" + (" (the default target; choose with --target)" if self.target_is_default else "")


def section_of(analyzer: str) -> str:
    """The report section that shows an analyzer's findings ("where" when nothing matches)."""
    if analyzer in ANALYZER_SECTIONS:
        return ANALYZER_SECTIONS[analyzer]
    lowered = analyzer.lower()
    for section, keywords in SECTION_KEYWORDS:
        if any(keyword in lowered for keyword in keywords):
            return section
    return "where"


def prepare_analysis(trace: Trace, target: str | None = None) -> AnalysisData:
    """Run the diagnoses for `target` (None: the default chip). An unknown target is the caller's error
    (`TputraceError`); a failing analyzer leaves the report without findings and says why."""
    target_chip = chips.chip(target)
    try:
        from tputrace.analysis import analyze
    except ImportError as error:
        return AnalysisData(False, f"the diagnoses are not available ({error}): no findings shown", target_chip, target is None)
    try:
        report = analyze(trace, target)
    except Exception as error:  # noqa: BLE001 - the pictures are still worth having without diagnoses
        note = f"the diagnoses failed ({type(error).__name__}: {error}): no findings shown"
        return AnalysisData(False, note, target_chip, target is None)
    return AnalysisData(True, "", report.target, report.target_is_default, rank_findings(list(report.findings)),
                        dict(report.results))


# -- run facts ----------------------------------------------------------------------------------------


@dataclass
class RunFacts:
    """The header of the report."""

    path: str
    script: str | None
    argv: tuple[str, ...]
    platform: str | None
    eager_mode: str | None
    host: str | None
    ranks: list[int]
    chips: int | None
    wall_ns: int
    steps: int
    exit_status: int | None
    finished: bool
    error: str | None
    counts: dict[str, int]
    created: str | None
    rank_offsets_ns: dict[int, int]


def prepare_run_facts(trace: Trace) -> RunFacts:
    run = trace.run
    offsets = rank_offsets(trace)
    (steps,) = trace.sql("SELECT COUNT(DISTINCT step) FROM steps")[0]
    return RunFacts(
        path=str(trace.path), script=run.script, argv=tuple(run.argv), platform=run.platform,
        eager_mode=run.eager_mode, host=run.host, ranks=trace.ranks, chips=run.chips, wall_ns=trace.wall_ns(),
        steps=steps, exit_status=run.exit_status, finished=run.finished, error=run.error, counts=trace.counts(),
        created=trace.created, rank_offsets_ns=offsets,
    )


def rank_offsets(trace: Trace) -> dict[int, int]:
    """Per rank, ns to add to its event times to put every rank on one clock (the earliest rank's)."""
    starts = {rank: start for rank, start in trace.sql("SELECT rank, start_unix_ns FROM runs") if start is not None}
    if not starts:
        return {}
    earliest = min(starts.values())
    return {rank: start - earliest for rank, start in starts.items()}


# -- 1 timeline ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _LaneSpec:
    name: str
    kind: str
    rank: int
    chip: int | None
    table: str
    where: str
    params: tuple[Any, ...]


# Per kind: the detail columns (SQL over the table aliased `t`, with joins) and their field names.
_LANE_DETAILS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "dispatch": ("", ("t.op_sid", "t.inputs_sid", "t.outputs_sid", "t.frame_id", "t.module_sid", "t.step"),
                 ("op", "inputs", "outputs", "source", "module", "step")),
    "program": (
        " LEFT JOIN programs p ON p.id = t.program_id AND p.rank = t.rank"
        " LEFT JOIN flushes f ON f.id = t.flush_id AND f.rank = t.rank",
        ("p.name_sid", "p.signature_sid", "p.n_ops", "p.flops", "p.bytes_accessed", "f.trigger", "f.frame_id", "t.step"),
        ("program", "inputs", "ops", "flops", "bytes_accessed", "flush_trigger", "source", "step"),
    ),
    "compile": ("", ("t.name_sid", "t.kind", "t.reason", "t.diff_sid", "t.signature_sid", "t.frame_id", "t.step"),
                ("compiled", "kind", "reason", "changed", "inputs", "source", "step")),
    "sync": ("", ("t.kind", "t.pending_ops", "t.frame_id", "t.step"), ("sync", "pending_ops", "source", "step")),
    "transfer": ("", ("t.direction", "t.bytes", "t.src_chip", "t.dst_chip", "t.frame_id", "t.step"),
                 ("direction", "bytes", "from_chip", "to_chip", "source", "step")),
    "fallback": ("", ("t.op_sid", "t.inputs_sid", "t.frame_id", "t.step"), ("op", "inputs", "source", "step")),
    "collective": ("", ("t.kind", "t.bytes", "t.dtype", "t.wait_ns", "t.bus_bandwidth", "t.group_sid", "t.frame_id", "t.step"),
                   ("collective", "bytes", "dtype", "wait_ns", "bus_bandwidth", "group", "source", "step")),
    "annotation": ("", ("t.name_sid", "t.source", "t.frame_id", "t.step"), ("range", "origin", "source", "step")),
    "step": ("", ("t.step", "t.source"), ("step", "marked_by")),
}
_STRING_FIELDS = {"op", "inputs", "outputs", "module", "program", "compiled", "changed", "group", "range"}
_DURATION_SQL = {"step": "COALESCE(t.end_ns, t.start_ns) - t.start_ns"}


@dataclass
class Lane:
    """One row of the timeline."""

    index: int
    name: str
    kind: str
    rank: int
    chip: int | None
    total_events: int
    drawn_events: int

    @property
    def decimated(self) -> bool:
        return self.drawn_events < self.total_events


@dataclass
class LaneEvents:
    """Events of one lane drawn one by one; times already on the common clock."""

    lane: int
    kind: str
    starts_ns: list[int]
    durs_ns: list[int]
    fields: tuple[str, ...]
    details: list[tuple[Any, ...]]


@dataclass
class LaneBins:
    """All events of a decimated lane merged into time bins (count and busy time per bin)."""

    lane: int
    kind: str
    bin_ns: int
    starts_ns: list[int]
    ends_ns: list[int]
    counts: list[int]
    busy_ns: list[int]


@dataclass
class TimelineData:
    lanes: list[Lane]
    events: list[LaneEvents]
    bins: list[LaneBins]
    end_ns: int
    event_budget: int

    @property
    def total_events(self) -> int:
        return sum(lane.total_events for lane in self.lanes)

    @property
    def drawn_events(self) -> int:
        return sum(lane.drawn_events for lane in self.lanes)


def _lane_specs(trace: Trace) -> list[_LaneSpec]:
    ranks = trace.ranks
    multi_rank = len(ranks) > 1
    specs: list[_LaneSpec] = []
    for rank in ranks:
        prefix = f"rank {rank} · " if multi_rank else ""
        by_rank = ("t.rank = ?", (rank,))
        specs.append(_LaneSpec(f"{prefix}steps", "step", rank, None, "steps", *by_rank))
        specs.append(_LaneSpec(f"{prefix}ranges", "annotation", rank, None, "annotations", *by_rank))
        specs.append(_LaneSpec(f"{prefix}host dispatch", "dispatch", rank, None, "ops", *by_rank))
        specs.append(_LaneSpec(f"{prefix}host compiles", "compile", rank, None, "compiles", *by_rank))
        specs.append(_LaneSpec(f"{prefix}host syncs", "sync", rank, None, "syncs", *by_rank))
        specs.append(_LaneSpec(f"{prefix}host fallbacks", "fallback", rank, None, "fallbacks", *by_rank))
        chips = sorted(
            {chip for (chip,) in trace.sql("SELECT DISTINCT chip FROM executions WHERE rank = ?", (rank,)) if chip is not None}
            | {chip for (chip,) in trace.sql(
                "SELECT DISTINCT CASE WHEN dst_chip >= 0 THEN dst_chip ELSE src_chip END FROM transfers WHERE rank = ?",
                (rank,)) if chip is not None}
        )
        for chip in chips:
            specs.append(_LaneSpec(f"{prefix}tpu:{chip} programs", "program", rank, chip, "executions",
                                   "t.rank = ? AND t.chip = ?", (rank, chip)))
            specs.append(_LaneSpec(f"{prefix}tpu:{chip} transfers", "transfer", rank, chip, "transfers",
                                   "t.rank = ? AND (CASE WHEN t.dst_chip >= 0 THEN t.dst_chip ELSE t.src_chip END) = ?",
                                   (rank, chip)))
        specs.append(_LaneSpec(f"{prefix}collectives", "collective", rank, None, "collectives", *by_rank))
    return specs


def _budgets(counts: Sequence[int], total_budget: int) -> list[int]:
    """Split the event budget over lanes: small lanes get all their events, big ones share the rest."""
    budgets = [0] * len(counts)
    remaining = total_budget
    order = sorted(range(len(counts)), key=lambda index: counts[index])
    for position, index in enumerate(order):
        share = remaining // (len(order) - position)
        budgets[index] = min(counts[index], share)
        remaining -= budgets[index]
    return budgets


def prepare_timeline(
    trace: Trace, *, event_budget: int = TIMELINE_EVENT_BUDGET, bins_per_lane: int = TIMELINE_BINS_PER_LANE
) -> TimelineData:
    """Lanes per rank for the host and each chip, with level-of-detail decimation of busy lanes.

    A lane with more events than its share of `event_budget` draws its longest events one by one and
    all of its events as `bins_per_lane` time bins (count and busy time per bin).
    """
    offsets = rank_offsets(trace)
    bin_ns = {rank: max(1, -(-trace.wall_ns(rank=rank) // bins_per_lane)) for rank in trace.ranks}
    # One pass per lane bins its events (on the rank's clock, from 0) and so also counts them.
    binned = [(spec, _lane_bins(trace, spec, bin_ns.get(spec.rank, 1), offsets.get(spec.rank, 0))) for spec in _lane_specs(trace)]
    binned = [(spec, lane_bins) for spec, lane_bins in binned if lane_bins.counts]
    budgets = _budgets([sum(lane_bins.counts) for _, lane_bins in binned], event_budget)
    lanes: list[Lane] = []
    events: list[LaneEvents] = []
    bins: list[LaneBins] = []
    end_ns = 0
    for index, ((spec, lane_bins), budget) in enumerate(zip(binned, budgets)):
        count = sum(lane_bins.counts)
        offset = offsets.get(spec.rank, 0)
        joins, columns, fields = _LANE_DETAILS[spec.kind]
        duration = _DURATION_SQL.get(spec.kind, "COALESCE(t.dur_ns, 0)")
        query = (
            f"SELECT t.start_ns, {duration} AS d, {', '.join(columns)} FROM {spec.table} t{joins} WHERE {spec.where}"
        )
        if budget < count:
            query += f" ORDER BY d DESC LIMIT {int(budget)}"
        rows = trace.sql(query, spec.params)
        rows.sort(key=lambda row: row[0])
        starts = [row[0] + offset for row in rows]
        durs = [max(row[1] or 0, 0) for row in rows]
        details = [_resolve_details(trace, fields, row[2:]) for row in rows]
        events.append(LaneEvents(index, spec.kind, starts, durs, fields, details))
        lanes.append(Lane(index, spec.name, spec.kind, spec.rank, spec.chip, count, len(rows)))
        end_ns = max(end_ns, max(lane_bins.ends_ns))
        if budget < count:
            lane_bins.lane = index
            bins.append(lane_bins)
    return TimelineData(lanes, events, bins, end_ns, event_budget)


def _lane_bins(trace: Trace, spec: _LaneSpec, bin_ns: int, offset: int) -> LaneBins:
    """A lane's events merged into bins of `bin_ns` (count, first start, last end, busy time per bin)."""
    duration = _DURATION_SQL.get(spec.kind, "COALESCE(t.dur_ns, 0)")
    rows = trace.sql(
        f"SELECT t.start_ns / ? AS b, COUNT(*), MIN(t.start_ns), MAX(t.start_ns + {duration}), SUM({duration}) "
        f"FROM {spec.table} t WHERE {spec.where} GROUP BY b ORDER BY b",
        (bin_ns, *spec.params),
    )
    return LaneBins(
        -1, spec.kind, bin_ns,
        starts_ns=[row[2] + offset for row in rows], ends_ns=[row[3] + offset for row in rows],
        counts=[row[1] for row in rows], busy_ns=[row[4] or 0 for row in rows],
    )


def _resolve_details(trace: Trace, fields: tuple[str, ...], values: Sequence[Any]) -> tuple[Any, ...]:
    resolved = []
    for name, value in zip(fields, values):
        if name == "source":
            resolved.append(trace.frame(value))
        elif name in _STRING_FIELDS:
            resolved.append(trace.string(value))
        else:
            resolved.append(value)
    return tuple(resolved)


# -- 2 step times -------------------------------------------------------------------------------------

STEP_CATEGORIES = ("compile", "sync stall", "collective", "compute", "host")


@dataclass
class StepRow:
    """One step with the (overlapping) time of each category and the category that dominated."""

    rank: int
    step: int
    start_ns: int
    dur_ns: int
    ops: int
    compile_ns: int
    sync_ns: int
    collective_ns: int
    execution_ns: int
    dispatch_ns: int
    fallback_ns: int

    @property
    def category_ns(self) -> dict[str, int]:
        return {
            "compile": self.compile_ns,
            "sync stall": self.sync_ns,
            "collective": self.collective_ns,
            "compute": self.execution_ns,
            "host": self.dispatch_ns + self.fallback_ns,
        }

    @property
    def dominant(self) -> str:
        parts = self.category_ns
        return max(STEP_CATEGORIES, key=lambda name: parts[name])


@dataclass
class StepData:
    steps: list[StepRow]
    ranks: list[int]


def prepare_steps(trace: Trace) -> StepData:
    """Per step and rank: duration and the time in compiles, syncs, collectives, programs, dispatch, fallbacks."""

    def per_step(table: str) -> dict[tuple[int, int], tuple[int, int]]:
        rows = trace.sql(f"SELECT rank, step, COUNT(*), COALESCE(SUM(dur_ns), 0) FROM {table} GROUP BY rank, step")
        return {(rank, step): (count, total) for rank, step, count, total in rows}

    sums = {table: per_step(table) for table in ("compiles", "syncs", "collectives", "executions", "ops", "fallbacks")}
    rows: list[StepRow] = []
    offsets = rank_offsets(trace)
    for rank, step, start_ns, end_ns in trace.sql("SELECT rank, step, start_ns, end_ns FROM steps ORDER BY rank, step"):
        if end_ns is None:
            continue
        key = (rank, step)

        def total(table: str) -> int:
            return sums[table].get(key, (0, 0))[1]

        rows.append(StepRow(
            rank, step, start_ns + offsets.get(rank, 0), end_ns - start_ns, sums["ops"].get(key, (0, 0))[0],
            total("compiles"), total("syncs"), total("collectives"), total("executions"), total("ops"), total("fallbacks"),
        ))
    return StepData(rows, sorted({row.rank for row in rows}))


# -- 3 where time goes --------------------------------------------------------------------------------


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


def prepare_where(trace: Trace, *, leaves: int = TREEMAP_LEAVES, top_lines: int = TOP_SOURCE_LINES) -> WhereData:
    """Time split by category, op time by module path → op, and the source lines that cost most.

    Ops are read in one pass, grouped by module, op and line; the tree, the lines' op time and the
    dispatch total all come from it (the ops table is nearly all of a big trace)."""
    op_groups = trace.sql(
        "SELECT module_sid, op_sid, frame_id, COUNT(*), COALESCE(SUM(dur_ns), 0) FROM ops GROUP BY module_sid, op_sid, frame_id"
    )
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
    return WhereData(split.parts(), wall, len(ranks), tree, tree_total, merged, _source_lines(trace, by_frame, top_lines))


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
    parts: dict[Any, dict[str, int]] = defaultdict(dict)
    counts: dict[Any, dict[str, int]] = defaultdict(dict)
    for frame_id, (count, total) in ops_by_frame.items():
        parts[frame_id]["op dispatch"] = total
        counts[frame_id]["op dispatch"] = count
    for label, table in _SOURCE_TABLES:
        for frame_id, count, total in trace.sql(
            f"SELECT frame_id, COUNT(*), COALESCE(SUM(dur_ns), 0) FROM {table} GROUP BY frame_id"
        ):
            parts[frame_id][label] = total
            counts[frame_id][label] = count
    ordered = sorted(parts, key=lambda frame_id: -sum(parts[frame_id].values()))[:top]
    return [
        SourceLineRow(trace.frame(frame_id), sum(parts[frame_id].values()), parts[frame_id], counts[frame_id])
        for frame_id in ordered
    ]


# -- 4 recompilations ---------------------------------------------------------------------------------


@dataclass
class CompilePoint:
    rank: int
    start_ns: int
    dur_ns: int
    site: str
    name: str | None
    kind: str | None
    reason: str | None
    diff: str | None
    signature: str | None
    step: int | None
    source: SourceLocation | None


@dataclass
class VaryingDim:
    """An input dim that took several values across the compiles of one call site and program, with the
    bucket advisor's proposal when the recompiles analyzer made one (a storm), or what the size is when the
    data chose it (a storm no padding fixes, e.g. "the count of a boolean mask at train.py:10")."""

    site: str
    name: str | None
    label: str
    values: list[int]
    compiles: int
    proposal: dict[str, Any] | None = None
    size_from: str | None = None
    copied_at: str | None = None  # the line copying the batch whose size this is: the proposal is the batch's


@dataclass
class RecompileData:
    points: list[CompilePoint]
    total: int
    sites: list[str]
    site_counts: dict[str, tuple[int, int, int]]
    varying: list[VaryingDim]
    advisor_ran: bool


def _site_label(source: SourceLocation | None) -> str:
    return source.short if source is not None else "(no source line)"


def prepare_recompilations(
    trace: Trace, analysis: AnalysisData | None = None, *, max_points: int = MAX_SCATTER_POINTS
) -> RecompileData:
    """Compiles over time per call site; per call site and program, the input dims that varied, with
    the bucket advisor's proposals from the recompiles analyzer."""
    offsets = rank_offsets(trace)
    (total,) = trace.sql("SELECT COUNT(*) FROM compiles")[0]
    rows = trace.sql(
        "SELECT rank, start_ns, COALESCE(dur_ns, 0) AS d, frame_id, name_sid, kind, reason, diff_sid, signature_sid, step "
        f"FROM compiles ORDER BY d DESC LIMIT {int(max_points)}"
    )
    points = []
    for rank, start_ns, dur_ns, frame_id, name_sid, kind, reason, diff_sid, signature_sid, step in rows:
        source = trace.frame(frame_id)
        points.append(CompilePoint(
            rank, start_ns + offsets.get(rank, 0), dur_ns, _site_label(source), trace.string(name_sid), kind, reason,
            trace.string(diff_sid), trace.string(signature_sid), step, source,
        ))
    points.sort(key=lambda point: point.start_ns)
    site_counts: dict[str, list[int]] = {}
    labels: dict[int | None, str] = {}
    for frame_id, count, recompiles in trace.sql(
        f"SELECT frame_id, COUNT(*), SUM({RECOMPILE}) FROM compiles GROUP BY frame_id"
    ):
        site = labels[frame_id] = _site_label(trace.frame(frame_id))
        previous = site_counts.setdefault(site, [0, 0, 0])
        previous[0] += count
        previous[1] += recompiles or 0
    # A site's compile time: per rank, the union of its compiles' intervals (nested or overlapping
    # compiles, of one call or of several calls on its line, count each instant once), summed over ranks.
    intervals: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for rank, frame_id, start_ns, end_ns in trace.sql(
        "SELECT rank, frame_id, start_ns, start_ns + COALESCE(dur_ns, 0) FROM compiles ORDER BY start_ns"
    ):
        intervals[labels[frame_id], rank].append((start_ns, end_ns))
    for (site, _), site_intervals in intervals.items():
        site_counts[site][2] += merged_ns(site_intervals)
    sites = sorted(site_counts, key=lambda site: (-site_counts[site][0], site))
    storms = _storms(analysis)
    varying = _storm_dims(storms)
    covered = {(storm.where, storm.name) for storm in storms if storm.varying_dims}
    varying.extend(_varying_dims(trace, covered))
    return RecompileData(points, total, sites, {site: (c[0], c[1], c[2]) for site, c in site_counts.items()},
                         varying, advisor_ran=analysis is not None and "recompiles" in analysis.results)


def _storms(analysis: AnalysisData | None) -> tuple[StormData, ...]:
    data = analysis.results["recompiles"].data if analysis is not None and "recompiles" in analysis.results else None
    return data.storms if isinstance(data, RecompileAnalysis) else ()


def _storm_dims(storms: tuple[StormData, ...]) -> list[VaryingDim]:
    rows = []
    for storm in storms:
        for dim in storm.varying_dims:
            rows.append(VaryingDim(
                storm.call or storm.where, storm.name, dim.label, list(dim.values), storm.compiles,
                plain(storm.proposed) if storm.proposed is not None else None,
                _size_from(storm.size_from), storm.copied_at,
            ))
    return rows


def _size_from(origin: SizeSource | None) -> str | None:
    """`the count of a boolean mask at train.py:10` from a storm's `size_from` (None without one)."""
    return None if origin is None else f"{origin.what} at {origin.where}"


def _varying_dims(trace: Trace, covered: set[tuple[str, str | None]]) -> list[VaryingDim]:
    """Dims that differ between the signatures compiled at one call site for one program name, but for the
    (line, name) pairs in `covered` (the storms'); a call is named by its column and text when its line has others."""
    rows = trace.sql(
        "SELECT frame_id, name_sid, signature_sid, COUNT(*) FROM compiles GROUP BY frame_id, name_sid, signature_sid"
    )
    groups: dict[tuple[Any, Any], list[tuple[Any, int]]] = defaultdict(list)
    for frame_id, name_sid, signature_sid, count in rows:
        groups[(frame_id, name_sid)].append((signature_sid, count))
    calls_per_line = Counter((_site_label(trace.frame(frame_id)), name_sid) for frame_id, name_sid in groups)
    varying: list[VaryingDim] = []
    for (frame_id, name_sid), signatures in groups.items():
        source = trace.frame(frame_id)
        line_site = _site_label(source)
        if len(signatures) < 2 or (line_site, trace.string(name_sid)) in covered:
            continue
        parsed = [parse_specs(trace.string(signature_sid)) for signature_sid, _ in signatures]
        compiles = sum(count for _, count in signatures)
        width = len(parsed[0])
        if any(len(specs) != width for specs in parsed):
            continue
        site = call_label(source, trace) if source is not None and calls_per_line[(line_site, name_sid)] > 1 else line_site
        for input_index in range(width):
            column = [specs[input_index] for specs in parsed]
            if any(spec is None for spec in column):
                continue
            ranks = {len(spec.shape) for spec in column if spec is not None}
            if len(ranks) != 1:
                continue
            for dim in range(ranks.pop()):
                values = sorted({spec.shape[dim] for spec in column if spec is not None})
                if len(values) > 1:
                    varying.append(VaryingDim(site, trace.string(name_sid), f"input {input_index} dim {dim}", values, compiles))
    varying.sort(key=lambda item: (-item.compiles, item.site, item.label))
    return varying


# -- 5 shapes and padding -----------------------------------------------------------------------------


@dataclass
class MatmulShape:
    """One matrix product of a matmul-like op with given input shapes, padded for the target."""

    op: str
    inputs: str | None
    product: Matmul
    padded: tuple[int, int, int]
    wasted_share: float
    count: int
    total_ns: int
    fallback: bool
    module: str | None
    source: SourceLocation | None


@dataclass
class ShapeData:
    shapes: list[MatmulShape]
    target: Chip


def prepare_shapes(trace: Trace, target: Chip) -> ShapeData:
    """Matmul-like ops (dispatched to the chip, or run as CPU fallbacks) by input shapes, each product
    padded to the target's tiles (m) and MXU (k, n) as the padding analyzer pads it."""
    shapes: list[MatmulShape] = []
    for table, module_column in (("ops", "module_sid"), ("fallbacks", "NULL")):
        op_sids = [sid for (sid,) in trace.sql(f"SELECT DISTINCT op_sid FROM {table}") if op_family(trace.string(sid))]
        if not op_sids:
            continue
        marks = ", ".join("?" for _ in op_sids)
        rows = trace.sql(
            f"SELECT op_sid, inputs_sid, COUNT(*), COALESCE(SUM(dur_ns), 0), MIN({module_column}), MIN(frame_id) "
            f"FROM {table} WHERE op_sid IN ({marks}) GROUP BY op_sid, inputs_sid",
            op_sids,
        )
        for op_sid, inputs_sid, count, total_ns, module_sid, frame_id in rows:
            op, inputs = trace.string(op_sid) or "?", trace.string(inputs_sid)
            for product in matmuls_of(op, inputs):
                padding = pad_product(product, target)
                sublane = target.tile(product.dtype)[0]
                padded = (_round_up(product.m, sublane), _round_up(product.k, target.mxu), _round_up(product.n, target.mxu))
                shapes.append(MatmulShape(op, inputs, product, padded, padding.flop_waste, count, total_ns,
                                          table == "fallbacks", trace.string(module_sid), trace.frame(frame_id)))
    shapes.sort(key=lambda shape: -shape.total_ns)
    return ShapeData(shapes, target)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple if multiple > 0 else value


# -- 6 roofline ---------------------------------------------------------------------------------------


@dataclass
class ProgramPoint:
    program_id: int
    rank: int
    name: str | None
    kind: str | None
    n_ops: int | None
    dtype: str
    flops: float
    bytes_accessed: float
    executions: int
    total_ns: int
    mean_ns: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_accessed if self.bytes_accessed else 0.0

    @property
    def achieved_flops(self) -> float:
        return self.flops / (self.mean_ns / 1e9) if self.mean_ns else 0.0


@dataclass
class RooflineData:
    programs: list[ProgramPoint]
    skipped: int
    platform: str | None
    target: Chip

    def estimated_flops(self, point: ProgramPoint) -> float:
        """FLOP/s on the target by its roofline (an estimate): min(peak for the dtype, intensity × HBM bandwidth)."""
        estimate_ns = self.target.roofline_ns(point.flops, point.bytes_accessed, point.dtype)
        return point.flops / (estimate_ns / 1e9) if estimate_ns else 0.0


def _program_dtype(signature: str | None) -> str:
    """The first floating-point input dtype of a program (bf16 when the signature names none)."""
    for spec in parse_specs(signature):
        if spec is not None and spec.dtype.startswith(("f", "bf")):
            return spec.dtype
    return "bf16"


def prepare_roofline(trace: Trace, target: Chip, *, max_points: int = MAX_SCATTER_POINTS) -> RooflineData:
    """Each executed program's XLA FLOPs and bytes with its measured mean execution time."""
    rows = trace.sql(
        "SELECT p.id, p.rank, p.name_sid, p.kind, p.n_ops, p.signature_sid, p.flops, p.bytes_accessed, "
        "COUNT(e.program_id), COALESCE(SUM(e.dur_ns), 0) AS total, AVG(e.dur_ns) FROM programs p "
        "JOIN executions e ON e.program_id = p.id AND e.rank = p.rank "
        "GROUP BY p.rank, p.id ORDER BY total DESC"
    )
    programs, skipped = [], 0
    for program_id, rank, name_sid, kind, n_ops, signature_sid, flops, bytes_accessed, executions, total_ns, mean_ns in rows:
        if not flops or not bytes_accessed or not mean_ns or len(programs) >= max_points:
            skipped += 1
            continue
        programs.append(ProgramPoint(program_id, rank, trace.string(name_sid), kind, n_ops,
                                     _program_dtype(trace.string(signature_sid)), float(flops), float(bytes_accessed),
                                     executions, total_ns, float(mean_ns)))
    return RooflineData(programs, skipped, trace.run.platform, target)


# -- 7 collectives ------------------------------------------------------------------------------------


@dataclass
class CollectivePoint:
    rank: int
    kind: str | None
    bytes: int
    dur_ns: int
    wait_ns: int
    bus_bandwidth: float | None
    step: int | None
    source: SourceLocation | None


@dataclass
class CollectiveData:
    points: list[CollectivePoint]
    total: int
    ranks: list[int]
    steps: list[int]
    wait_ns: list[list[int]]
    target: Chip

    @property
    def present(self) -> bool:
        return self.total > 0


def prepare_collectives(trace: Trace, target: Chip, *, max_points: int = MAX_SCATTER_POINTS) -> CollectiveData:
    """Message size against time per collective, and wait time per rank and step."""
    (total,) = trace.sql("SELECT COUNT(*) FROM collectives")[0]
    rows = trace.sql(
        "SELECT rank, kind, COALESCE(bytes, 0), COALESCE(dur_ns, 0) AS d, COALESCE(wait_ns, 0), bus_bandwidth, step, frame_id "
        f"FROM collectives ORDER BY d DESC LIMIT {int(max_points)}"
    )
    points = [CollectivePoint(rank, kind, size, dur, wait, bandwidth, step, trace.frame(frame_id))
              for rank, kind, size, dur, wait, bandwidth, step, frame_id in rows]
    waits = trace.sql("SELECT rank, COALESCE(step, 0), COALESCE(SUM(wait_ns), 0) FROM collectives GROUP BY rank, step")
    ranks = sorted({rank for rank, _, _ in waits})
    steps = sorted({step for _, step, _ in waits})
    grid = [[0] * len(steps) for _ in ranks]
    rank_index = {rank: index for index, rank in enumerate(ranks)}
    step_index = {step: index for index, step in enumerate(steps)}
    for rank, step, wait in waits:
        grid[rank_index[rank]][step_index[step]] = wait
    return CollectiveData(points, total, ranks, steps, grid, target)


# -- 8 memory -----------------------------------------------------------------------------------------


@dataclass
class MemorySeries:
    rank: int
    chip: int | None
    t_ns: list[int]
    live_bytes: list[int]
    peak_bytes: list[int]
    samples: int


@dataclass
class MemoryPeak:
    rank: int
    chip: int | None
    t_ns: int
    peak_bytes: int


@dataclass
class MemoryData:
    series: list[MemorySeries]
    peaks: list[MemoryPeak]
    target: Chip


def prepare_memory(trace: Trace, target: Chip, *, max_points: int = MEMORY_POINTS_PER_SERIES) -> MemoryData:
    """Live and peak bytes per rank and chip over time; long series keep each bin's lowest and highest sample."""
    offsets = rank_offsets(trace)
    series: list[MemorySeries] = []
    peaks: list[MemoryPeak] = []
    for rank, chip, samples in trace.sql("SELECT rank, chip, COUNT(*) FROM memory GROUP BY rank, chip ORDER BY rank, chip"):
        offset = offsets.get(rank, 0)
        where, params = "rank = ? AND chip IS ?", (rank, chip)
        if samples <= max_points:
            rows = trace.sql(f"SELECT t_ns, live_bytes, peak_bytes FROM memory WHERE {where} ORDER BY t_ns", params)
        else:
            first, last = trace.sql(f"SELECT MIN(t_ns), MAX(t_ns) FROM memory WHERE {where}", params)[0]
            bin_ns = max(1, -(-(last - first) // (max_points // 2)))
            rows = trace.sql(
                "SELECT t_ns, live_bytes, peak_bytes FROM ("
                "SELECT t_ns, live_bytes, peak_bytes, "
                "ROW_NUMBER() OVER (PARTITION BY (t_ns - ?) / ? ORDER BY live_bytes) AS low, "
                "ROW_NUMBER() OVER (PARTITION BY (t_ns - ?) / ? ORDER BY live_bytes DESC) AS high "
                f"FROM memory WHERE {where}) WHERE low = 1 OR high = 1 ORDER BY t_ns",
                (first, bin_ns, first, bin_ns, *params),
            )
        series.append(MemorySeries(rank, chip, [row[0] + offset for row in rows], [row[1] or 0 for row in rows],
                                   [row[2] or 0 for row in rows], samples))
        peak_row = trace.sql(
            f"SELECT t_ns, MAX(COALESCE(peak_bytes, live_bytes)) FROM memory WHERE {where}", params
        )[0]
        if peak_row[1] is not None:
            first_at_peak = trace.sql(
                f"SELECT MIN(t_ns) FROM memory WHERE {where} AND COALESCE(peak_bytes, live_bytes) = ?", (*params, peak_row[1])
            )[0][0]
            peaks.append(MemoryPeak(rank, chip, first_at_peak + offset, peak_row[1]))
    return MemoryData(series, peaks, target)


# -- the whole report ---------------------------------------------------------------------------------


@dataclass
class ReportData:
    run: RunFacts
    analysis: AnalysisData
    timeline: TimelineData
    steps: StepData
    where: WhereData
    recompilations: RecompileData
    shapes: ShapeData
    roofline: RooflineData
    collectives: CollectiveData
    memory: MemoryData


def prepare_report(trace: Trace, *, target: str | None = None, analysis: AnalysisData | None = None) -> ReportData:
    """Everything the HTML report shows, from one open trace."""
    analysis = analysis if analysis is not None else prepare_analysis(trace, target)
    model = analysis.target
    return ReportData(
        run=prepare_run_facts(trace),
        analysis=analysis,
        timeline=prepare_timeline(trace),
        steps=prepare_steps(trace),
        where=prepare_where(trace),
        recompilations=prepare_recompilations(trace, analysis),
        shapes=prepare_shapes(trace, model),
        roofline=prepare_roofline(trace, model),
        collectives=prepare_collectives(trace, model),
        memory=prepare_memory(trace, model),
    )


# -- comparison of two traces -------------------------------------------------------------------------


@dataclass
class TraceSummary:
    """One side of a comparison."""

    label: str
    path: str
    script: str | None
    wall_ns: int
    step_durations_ns: list[tuple[int, int]]
    op_total_ns: dict[str, int]
    op_counts: dict[str, int]
    compiles: int
    recompiles: int
    compile_ns: int
    compiles_per_step: dict[int, int]
    time_split: list[tuple[str, int]]

    @property
    def median_step_ns(self) -> float | None:
        """The median steady step, as the report and the summary give it (the warm-up step left out)."""
        durations = [duration for _, duration in steady(self.step_durations_ns)]
        return float(statistics.median(durations)) if durations else None


@dataclass
class ComparisonData:
    before: TraceSummary
    after: TraceSummary
    ops: list[str]


def summarize_for_compare(trace: Trace, label: str, *, rank: int | None = None) -> TraceSummary:
    """The loop's step times (rank 0 unless `rank`; a trailing `end` step left out, as the summary counts
    them), op time by op, compiles per step, time split."""
    chosen = rank if rank is not None else trace.ranks[0]
    timed = [step for step in trace.step_times(rank=chosen) if step.dur_ns is not None]
    loop = [step for step in timed if step.source != "end"] or timed
    steps = [(step.step, step.dur_ns) for step in loop]
    op_stats = trace.op_stats("op", rank=chosen)
    stats = trace.compile_stats(rank=chosen)
    per_step = dict(trace.sql("SELECT step, COUNT(*) FROM compiles WHERE rank = ? GROUP BY step ORDER BY step", (chosen,)))
    return TraceSummary(
        label, str(trace.path), trace.run.script, trace.wall_ns(rank=chosen), steps,
        {stat.label: stat.total_ns for stat in op_stats}, {stat.label: stat.count for stat in op_stats},
        stats.count, stats.recompiles, stats.total_ns, per_step, trace.time_split(rank=chosen).parts(),
    )


def prepare_comparison(before: Trace, after: Trace, *, top_ops: int = COMPARE_TOP_OPS) -> ComparisonData:
    """Two traces side by side: the ops to show are the union of each side's most expensive ones."""
    first = summarize_for_compare(before, "before")
    second = summarize_for_compare(after, "after")
    ranked: list[str] = []
    for side in (first, second):
        for op in sorted(side.op_total_ns, key=lambda name: -side.op_total_ns[name])[:top_ops]:
            if op not in ranked:
                ranked.append(op)
    ranked.sort(key=lambda op: -max(first.op_total_ns.get(op, 0), second.op_total_ns.get(op, 0)))
    return ComparisonData(first, second, ranked)
