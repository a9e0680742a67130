"""Everything the HTML report shows, prepared from a trace as plain dataclasses (no plotly here), and
the summary of each side of a before/after comparison.

Values are raw: times in ns, sizes in bytes, strings as they are in the trace (unescaped); the page
formats and escapes them. Nothing here invents a figure: what is not in the trace or the analysis is
left out and said to be left out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.analysis.context import steady
from tputrace.analysis.target import target_of
from tputrace.compare.diff import RunDiff, compare
from tputrace.compare.figures import run_figures
from tputrace.compare.sites import unreadable_files
from tputrace.derived.op_ranking import rank_ops
from tputrace.derived.projection import ProjectedSteps, projected_steps
from tputrace.derived.run_facts import RunFacts, run_facts
from tputrace.derived.timeline import TimelineData, prepare_timeline
from tputrace.viewers.report.analysis_data import AnalysisData, prepare_analysis
from tputrace.viewers.report.chip_data import (
    CollectiveData,
    MemoryData,
    RooflineData,
    ShapeData,
    prepare_collectives,
    prepare_memory,
    prepare_roofline,
    prepare_shapes,
)
from tputrace.viewers.report.compile_data import RecompileData, prepare_recompilations
from tputrace.viewers.report.memory_section import MemoryBreakdownData, prepare_memory_breakdown
from tputrace.viewers.report.sharding_section import ShardingSectionData, prepare_sharding
from tputrace.viewers.report.time_data import StepData, WhereData, prepare_steps, prepare_where

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

COMPARE_TOP_OPS = 15


@dataclass
class ReportData:
    """Every section of the report, prepared."""

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
    sharding: ShardingSectionData
    projected: ProjectedSteps  # chip time per step projected for the analysis's target
    memory_breakdown: MemoryBreakdownData = MemoryBreakdownData(present=False)  # from buffer lifetimes


def prepare_report(trace: Trace, *, target: str | None = None, analysis: AnalysisData | None = None) -> ReportData:
    """Everything the HTML report shows, from one open trace."""
    analysis = analysis if analysis is not None else prepare_analysis(trace, target)
    model = analysis.target
    return ReportData(
        run=run_facts(trace),
        analysis=analysis,
        timeline=prepare_timeline(trace),
        steps=prepare_steps(trace),
        where=prepare_where(trace),
        recompilations=prepare_recompilations(trace, analysis),
        shapes=prepare_shapes(trace, model),
        roofline=prepare_roofline(trace, model),
        collectives=prepare_collectives(trace, model),
        memory=prepare_memory(trace, model),
        sharding=prepare_sharding(trace, analysis),
        projected=projected_steps(trace, trace.run.rank, target_of(model)),
        memory_breakdown=prepare_memory_breakdown(trace, analysis),
    )


# -- comparison of two traces ---------------------------------------------------------------------------


@dataclass
class TraceSummary:
    """One side of a comparison."""

    label: str
    path: str
    script: str | None
    wall_ns: int
    step_durations_ns: list[tuple[int, int]]
    op_total_ns: dict[str, int]  # host dispatch without the flushes and compiles inside the calls (op_ranking)
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
    difference: RunDiff


def summarize_for_compare(trace: Trace, label: str, *, rank: int | None = None) -> TraceSummary:
    """The loop's step times (rank 0 unless `rank`; a trailing `end` step left out, as the summary counts
    them), op time by op, compiles per step, time split."""
    chosen = rank if rank is not None else trace.ranks[0]
    timed = [step for step in trace.step_times(rank=chosen) if step.dur_ns is not None]
    loop = [step for step in timed if step.source != "end"] or timed
    steps = [(step.step, step.dur_ns) for step in loop]
    ranked_ops = rank_ops(trace, chosen).ops
    stats = trace.compile_stats(rank=chosen)
    per_step = dict(trace.sql("SELECT step, COUNT(*) FROM compiles WHERE rank = ? GROUP BY step ORDER BY step", (chosen,)))
    return TraceSummary(
        label, str(trace.path), trace.run.script, trace.wall_ns(rank=chosen), steps,
        {op.op: op.self_dispatch_ns for op in ranked_ops}, {op.op: op.calls for op in ranked_ops},
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
    by_number = unreadable_files(before) | unreadable_files(after)
    difference = compare(run_figures(before, before.ranks[0], by_line_number=by_number),
                         run_figures(after, after.ranks[0], by_line_number=by_number))
    return ComparisonData(first, second, ranked, difference)
