"""torch.compile graph breaks: lines where Dynamo stopped capturing a graph, ran Python instead, and
compiled the rest of the function as another graph.

A break is recorded once per compile of the function (with Dynamo's reason); it then happens on every
call. What it costs is what the trace shows at its line: the host syncs there (a `print` or `.item()`
that broke the graph reads the value on every call), and the frames Dynamo compiled to resume after
it (`torch_dynamo_resume_in_<function>_at_<line>`), each an extra graph to compile and launch. The
syncs at a break's line are this analyzer's, not the syncs analyzer's.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

from tputrace.analysis.context import MIN_LISTED_COST_NS, AnalysisContext, Cost
from tputrace.analysis.findings import AnalysisResult, Finding, Severity
from tputrace.analysis.syncs import STALL, SUGGESTIONS
from tputrace.store.aggregates import merged_ns
from tputrace.wording import format_ns, plural

NAME = "graph_breaks"
RESUME_PREFIX = "torch_dynamo_resume_in_"
SUGGESTION = (
    "Keep the compiled function free of Python that needs a value: return the tensor and print, log or "
    "branch on it outside the compiled function (every N steps), or use a traceable op; "
    "`torch._dynamo.explain(fn)(*args)` lists every break."
)


@dataclass(frozen=True)
class LineSyncs:
    """Host syncs at a line in the loop (count, kinds, stall) and in the steady steps."""

    syncs: int
    kinds: tuple[str, ...]
    stall_ns: int
    steady_syncs: int
    steady_stall_ns: int


@dataclass(frozen=True)
class GraphBreak:
    """The graph breaks at one line: Dynamo's reasons, the graphs compiled to resume after them, and the host
    syncs at the line."""

    where: str
    reasons: tuple[str, ...]
    breaks: int
    resumed_graphs: int
    resume_compiles: int
    resume_compile_ns: int
    syncs: int
    kinds: tuple[str, ...]
    stall_ns: int
    steady_syncs: int
    steady_stall_ns: int


@dataclass(frozen=True)
class GraphBreaksData:
    breaks: tuple[GraphBreak, ...] = ()


def analyze(context: AnalysisContext) -> AnalysisResult[GraphBreaksData]:
    trace, rank = context.trace, context.rank
    rows = trace.sql(
        "SELECT f.file_sid, f.line, MIN(g.frame_id), g.reason_sid, COUNT(*) FROM graph_breaks g "
        "JOIN frames f ON f.id = g.frame_id WHERE g.rank = ? GROUP BY f.file_sid, f.line, g.reason_sid",
        (rank,),
    )
    breaks_by_line: dict[tuple[int, int], list[tuple[int, str, int]]] = defaultdict(list)
    for file_sid, line, frame_id, reason_sid, count in rows:
        breaks_by_line[(file_sid, line)].append((frame_id, trace.string(reason_sid) or "graph break", count))
    found = [_finding(context, file_sid, line, breaks) for (file_sid, line), breaks in breaks_by_line.items()]
    return AnalysisResult(NAME, GraphBreaksData(tuple(data for _, data in found)), tuple(finding for finding, _ in found))


def _finding(context: AnalysisContext, file_sid: int, line: int,
             breaks: list[tuple[int, str, int]]) -> tuple[Finding, GraphBreak]:
    frame_id = breaks[0][0]
    where = context.where(frame_id)
    count = sum(times for _, _, times in breaks)
    reasons = [reason for _, reason, _ in breaks]
    syncs = _syncs(context, file_sid, line)
    graphs, compiles, compile_ns = _resumed_frames(context, file_sid, line)
    data = GraphBreak(where, tuple(reasons), count, graphs, compiles, compile_ns, syncs.syncs, syncs.kinds,
                      syncs.stall_ns, syncs.steady_syncs, syncs.steady_stall_ns)
    cost: Cost = context.loop_cost(syncs.steady_stall_ns, syncs.stall_ns)
    if cost["cost_total_ns"] < MIN_LISTED_COST_NS:
        cost = {"cost_total_ns": 0.0, "cost_per_step_ns": None}  # the resumed graphs' compiles only: a one-time cost
    cost["cost_total_ns"] += compile_ns  # the extra graphs' compiles, once
    share = context.share_of_steps_less_compiles(syncs.steady_stall_ns)
    severity: Severity = "warning" if syncs.steady_syncs else "info"
    if context.severity(share) == "critical":
        severity = "critical"
    what = _what_broke(reasons[0])
    title = f"Graph break at {where} ({what}): the compiled function runs as {plural(graphs + 1, 'graph')}"
    if syncs.steady_syncs and context.steps:
        title += f", {format_ns(syncs.steady_stall_ns / max(context.steady_count, 1))} of host sync per step"
    explanation = (
        f"torch.compile broke the graph at {where} {plural(count, 'time')} (once per compile of the function): "
        f"{reasons[0].rstrip('.')}. Dynamo compiled the code before it as one graph, runs the line in Python on every call, "
        f"and compiled the rest as {plural(graphs, 'more graph')} ({plural(compiles, 'compile')}, "
        f"{format_ns(compile_ns)}, counted in the cost: an estimate, as one graph would compile some of it too)."
    )
    if syncs.syncs:
        explanation += (
            f" At that line the host waited for the chip {plural(syncs.syncs, 'time')} "
            f"({', '.join(syncs.kinds)}), {format_ns(syncs.stall_ns)} in all ({context.share_text(share)})."
        )
    suggestion = SUGGESTION
    kind_advice = [SUGGESTIONS[kind] for kind in syncs.kinds if kind in SUGGESTIONS]
    if kind_advice:
        suggestion += " " + kind_advice[0]
    evidence = [context.evidence_at(f"{plural(times, 'break')}: {reason}", break_frame, table="graph_breaks")
                for break_frame, reason, times in breaks]
    evidence.append(context.evidence_at(
        f"{plural(graphs, 'resumed graph')} after the break, {plural(compiles, 'compile')}, {format_ns(compile_ns)}",
        frame_id, table="compiles"))
    if syncs.syncs:
        evidence.append(context.evidence_at(
            f"{plural(syncs.syncs, 'host sync')} at the break, {format_ns(syncs.stall_ns)} stalled", frame_id,
            table="syncs"))
    finding = Finding(
        analyzer=NAME,
        severity=severity,
        title=title,
        explanation=explanation,
        suggestion=suggestion,
        **cost,
        evidence=tuple(evidence),
        **context.location_fields(frame_id),
    )
    return finding, data


def _what_broke(reason: str) -> str:
    """A short name for what broke the graph: the builtin or function Dynamo names in backquotes, if any."""
    parts = reason.split("`")
    return parts[1] if len(parts) >= 3 and parts[1] else reason.split(" - ")[0][:60]


def _syncs(context: AnalysisContext, file_sid: int, line: int) -> LineSyncs:
    """Host syncs at the break's line in the loop: count, kinds, stall; and in the steady steps."""
    trace = context.trace
    on_line = "s.frame_id IN (SELECT id FROM frames WHERE file_sid = ? AND line = ?)"
    where, params = context.loop_line_where("s")
    steady_where, steady_params = context.steady_where("s")
    rows = trace.sql(
        f"SELECT s.kind, COUNT(*), COALESCE(SUM({STALL}), 0) FROM syncs s WHERE {where} AND {on_line} GROUP BY s.kind",
        (*params, file_sid, line),
    )
    (steady_syncs, steady_stall), = trace.sql(
        f"SELECT COUNT(*), COALESCE(SUM({STALL}), 0) FROM syncs s WHERE {steady_where} AND {on_line}",
        (*steady_params, file_sid, line),
    )
    return LineSyncs(
        syncs=int(sum(row[1] for row in rows)), kinds=tuple(sorted(row[0] for row in rows)),
        stall_ns=int(max(0, sum(row[2] for row in rows))), steady_syncs=int(steady_syncs),
        steady_stall_ns=int(max(0, steady_stall)),
    )


def _resumed_frames(context: AnalysisContext, file_sid: int, line: int) -> tuple[int, int, int]:
    """(graphs, compiles, wall ns) of the Dynamo frames compiled to resume after the break at the line;
    their nested AOTAutograd and XLA compiles count each instant once."""
    trace = context.trace
    frames = trace.sql(
        "SELECT c.start_ns, c.start_ns + COALESCE(c.dur_ns, 0), c.detail FROM compiles c JOIN frames f ON f.id = c.frame_id "
        "JOIN strings fn ON fn.id = f.function_sid WHERE c.rank = ? AND c.kind = 'dynamo_frame' AND f.file_sid = ? "
        "AND f.line = ? AND fn.text LIKE ?",
        (context.rank, file_sid, line, RESUME_PREFIX + "%"),
    )
    graph_ids: set[int] = set()
    for _, _, detail in frames:
        try:
            graph_ids.update(json.loads(detail or "{}").get("graph_ids", []))
        except (ValueError, AttributeError):
            continue
    graphs = len(graph_ids) or (1 if frames else 0)
    return graphs, len(frames), merged_ns((start, end) for start, end, _ in frames)
