"""Diagnoses: from a trace to ranked findings tied to source lines.

`analyze(trace, target=None)` runs every analyzer (each a pure function of the trace reader, the rank
and the target chip; see `ANALYZERS`) and returns a `Report`: the findings ranked by estimated cost,
and each analyzer's `AnalysisResult` (its data and findings). Rendering lives in
`tputrace.analysis.render`. Nothing here imports torch or jax.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from tputrace.analysis import (
    collectives,
    compile_cache,
    fallbacks,
    fusion,
    graph_breaks,
    host_bound,
    index_errors,
    memory,
    padding,
    precision,
    program_cache,
    recompiles,
    set_up_work,
    syncs,
    transfers,
)
from tputrace.analysis.chips import CHIPS, DEFAULT_TARGET, Chip, chip
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding, rank as rank_findings

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

__all__ = [
    "ANALYZERS", "CHIPS", "DEFAULT_TARGET", "AnalysisResult", "Chip", "Evidence", "Finding", "Report", "analyze",
    "analyze_path", "chip", "print_top_findings",
]

Analyzer = Callable[[AnalysisContext], AnalysisResult]

# Every analyzer, by name, in the order their results are listed.
ANALYZERS: dict[str, Analyzer] = {
    index_errors.NAME: index_errors.analyze,
    recompiles.NAME: recompiles.analyze,
    program_cache.NAME: program_cache.analyze,
    set_up_work.NAME: set_up_work.analyze,
    compile_cache.NAME: compile_cache.analyze,
    graph_breaks.NAME: graph_breaks.analyze,
    syncs.NAME: syncs.analyze,
    fallbacks.NAME: fallbacks.analyze,
    fusion.NAME: fusion.analyze,
    padding.NAME: padding.analyze,
    precision.NAME: precision.analyze,
    host_bound.NAME: host_bound.analyze,
    transfers.NAME: transfers.analyze,
    memory.NAME: memory.analyze,
    collectives.NAME: collectives.analyze,
}


@dataclass
class Report:
    """A trace's diagnosis: ranked findings and every analyzer's result, for one rank and target."""

    trace_path: str
    target: Chip
    target_is_default: bool
    rank: int
    ranks: list[int]
    step_count: int
    median_step_ns: float | None
    wall_ns: int
    findings: list[Finding] = field(default_factory=list)
    results: dict[str, AnalysisResult] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Findings per severity."""
        counts = {"critical": 0, "warning": 0, "info": 0}
        for finding in self.findings:
            counts[finding.severity] += 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON: the target's figures, the run's steps, ranked findings, analyzer data."""
        return {
            "trace": self.trace_path,
            "target": {**self.target.describe(), "is_default": self.target_is_default},
            "rank": self.rank,
            "ranks": self.ranks,
            "steps": self.step_count,
            "median_step_ns": self.median_step_ns,
            "wall_ns": self.wall_ns,
            "costs_are_estimates": True,
            "findings": [asdict(finding) for finding in self.findings],
            "results": {name: _plain(result.data) for name, result in self.results.items()},
        }


def analyze(trace: Trace, target: str | Chip | None = None, *, rank: int | None = None,
            analyzers: dict[str, Analyzer] | None = None) -> Report:
    """Run the analyzers over `trace` for `target` (a name such as "v6e", a `Chip`, or None for
    `DEFAULT_TARGET`) and `rank` (default: the first rank); findings ranked by estimated cost."""
    target_chip = target if isinstance(target, Chip) else chip(target)
    context = AnalysisContext.build(trace, target_chip, target is None, rank)
    results: dict[str, AnalysisResult] = {}
    findings: list[Finding] = []
    for name, analyzer in (analyzers or ANALYZERS).items():
        result = analyzer(context)
        results[name] = result
        findings.extend(result.findings)
    return Report(
        trace_path=str(trace.path),
        target=target_chip,
        target_is_default=target is None,
        rank=context.rank,
        ranks=list(trace.distributed_ranks),
        step_count=context.step_count,
        median_step_ns=context.median_step_ns,
        wall_ns=context.wall_ns,
        findings=rank_findings(findings),
        results=results,
    )


def analyze_path(path: str | os.PathLike[str], target: str | Chip | None = None, *, rank: int | None = None) -> Report:
    """Open the trace at `path`, analyse it and close it."""
    from tputrace.store.reader import open_trace

    with open_trace(path) as trace:
        return analyze(trace, target, rank=rank)


def print_top_findings(trace_path: str | os.PathLike[str], file: TextIO | None = None, *, limit: int = 3,
                       target: str | None = None) -> None:
    """Print the top `limit` findings of a saved trace (the end of `tputrace run`). Never raises for a
    bad analysis: the run has already finished, so a failure here is one line of output."""
    from tputrace.analysis.render import print_report

    stream = file if file is not None else sys.stderr
    try:
        report = analyze_path(trace_path, target)
    except Exception as error:  # noqa: BLE001 - the recorded run must still end cleanly
        print(f"tputrace: could not analyse the trace: {error}", file=stream)
        return
    print_report(report, stream, top=limit, brief=True)


def _plain(value: Any) -> Any:
    """`value` with tuples as lists and dataclasses as dicts, for JSON."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "__dataclass_fields__"):
        return _plain(asdict(value))
    return value
