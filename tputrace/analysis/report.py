"""A trace's diagnosis: every analyzer run over one rank for one target chip, findings ranked by cost.

`ANALYZERS` names each analyzer (a pure function of an `AnalysisContext`); `analyze` runs them and
returns a `Report`. Rendering it is `tputrace.analysis.render`'s job.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tputrace.analysis import (
    collectives,
    compile_cache,
    data_movement,
    fallbacks,
    frozen_backward,
    fusion,
    graph_breaks,
    guard_recompiles,
    host_bound,
    index_errors,
    input_wait,
    memory,
    no_device_ops,
    padding,
    precision,
    program_cache,
    recompile_limit,
    recompiles,
    remade_optimizers,
    set_up_work,
    sharding,
    step_tail,
    syncs,
    transfers,
)
from tputrace.analysis.chips import Chip, chip
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import MEASURED_ON_HOST, AnalysisResult, Finding, rank as rank_findings
from tputrace.analysis.imported import ImportFacts, context_import_facts
from tputrace.analysis.run_end import bad_ending
from tputrace.analysis.target import capture_chip, target_of
from tputrace.derived.chip_pace import ChipPace, chip_pace
from tputrace.derived.imported_sources import imported_source, measured_on
from tputrace.derived.projection import PROJECTION_NOTE, projected_steps
from tputrace.derived.recording_window import RecordingWindow, recording_window

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

Analyzer = Callable[[AnalysisContext], AnalysisResult[Any]]
DataT = TypeVar("DataT")

# Every analyzer, by name, in the order their results are listed.
ANALYZERS: dict[str, Analyzer] = {
    no_device_ops.NAME: no_device_ops.analyze,
    index_errors.NAME: index_errors.analyze,
    recompiles.NAME: recompiles.analyze,
    guard_recompiles.NAME: guard_recompiles.analyze,
    recompile_limit.NAME: recompile_limit.analyze,
    program_cache.NAME: program_cache.analyze,
    set_up_work.NAME: set_up_work.analyze,
    step_tail.NAME: step_tail.analyze,
    remade_optimizers.NAME: remade_optimizers.analyze,
    compile_cache.NAME: compile_cache.analyze,
    graph_breaks.NAME: graph_breaks.analyze,
    syncs.NAME: syncs.analyze,
    fallbacks.NAME: fallbacks.analyze,
    fusion.NAME: fusion.analyze,
    padding.NAME: padding.analyze,
    frozen_backward.NAME: frozen_backward.analyze,
    precision.NAME: precision.analyze,
    host_bound.NAME: host_bound.analyze,
    input_wait.NAME: input_wait.analyze,
    transfers.NAME: transfers.analyze,
    data_movement.NAME: data_movement.analyze,
    memory.NAME: memory.analyze,
    collectives.NAME: collectives.analyze,
    sharding.NAME: sharding.analyze,
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
    projected_median_step_ns: float | None = None  # chip time per step projected for `target` (tputrace.derived.projection)
    programs_costed: int = 0  # program runs with XLA's costs, which projections for the target are made from
    findings: list[Finding] = field(default_factory=list)
    results: dict[str, AnalysisResult[Any]] = field(default_factory=dict)
    imported: ImportFacts | None = None
    recording_window: RecordingWindow | None = None  # the steps a `--steps`/`--schedule`/`--from-code` run kept (None: all)
    target_from_capture: str | None = None  # the device type of the imported TPU capture the target was taken from
    chip_pace: ChipPace | None = None  # the chip's time per step where the host ran ahead of it (None: it did not)
    ending: str | None = None  # how the rank's script ended where it did not end well (tputrace.analysis.run_end)

    def counts(self) -> dict[str, int]:
        """Findings per severity."""
        counts = {"critical": 0, "warning": 0, "info": 0}
        for finding in self.findings:
            counts[finding.severity] += 1
        return counts

    def data(self, kind: type[DataT]) -> DataT | None:
        """The data of the analyzer whose data is a `kind` (e.g. `recompiles.RecompileData`); None when that
        analyzer did not run."""
        for result in self.results.values():
            if isinstance(result.data, kind):
                return result.data
        return None

    def _finding_data(self, finding: Finding) -> dict[str, Any]:
        """A finding as plain data; an imported capture's measured costs say on which device they were measured."""
        data = asdict(finding)
        if self.imported is not None and finding.cost_basis == MEASURED_ON_HOST:
            data["cost_basis"] = f"measured on {measured_on(self.imported.device)}"
        return data

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON: the target's figures, the run's steps, ranked findings, analyzer data. An imported
        capture's measured times say which device measured them."""
        return {
            "trace": self.trace_path,
            "target": {**self.target.describe(), "is_default": self.target_is_default,
                       **({"from_capture": self.target_from_capture} if self.target_from_capture else {})},
            "rank": self.rank,
            "ranks": self.ranks,
            "steps": self.step_count,
            "median_step_ns": self.median_step_ns,
            "median_step_basis": f"measured on {measured_on(self.imported.device if self.imported else None)}",
            "projected_median_step_ns": self.projected_median_step_ns,
            "projection": PROJECTION_NOTE,
            "wall_ns": self.wall_ns,
            "costs_are_estimates": True,
            "findings": [self._finding_data(finding) for finding in self.findings],
            "results": {name: result.plain_data() for name, result in self.results.items()},
            "imported": self.imported.plain_data() if self.imported else None,
            "recording_window": self.recording_window.plain_data() if self.recording_window else None,
            "chip_pace": asdict(self.chip_pace) if self.chip_pace else None,
            "ending": self.ending,
        }


def analyze(trace: Trace, target: str | Chip | None = None, *, rank: int | None = None,
            analyzers: dict[str, Analyzer] | None = None) -> Report:
    """Run the analyzers over `trace` for `target` (a name such as "v6e", a `Chip`, or None for
    `DEFAULT_TARGET`) and `rank` (default: the first rank); findings ranked by estimated cost."""
    captured = capture_chip(trace, rank) if target is None else None  # an imported TPU capture's own chip
    target_chip = captured or (target if isinstance(target, Chip) else chip(target))
    context = AnalysisContext.build(trace, target_chip, target is None and captured is None, rank)
    results: dict[str, AnalysisResult[Any]] = {}
    findings: list[Finding] = []
    imported = context_import_facts(context)
    for name, analyzer in (analyzers or ANALYZERS).items():
        if imported and name in imported.skipped:
            continue
        result = analyzer(context)
        results[name] = result
        findings.extend(result.findings)
    projected = projected_steps(trace, context.rank, target_of(target_chip))
    return Report(
        trace_path=str(trace.path),
        target=target_chip,
        target_is_default=target is None and captured is None,
        target_from_capture=str((imported_source(trace, context.rank) or {}).get("device_name")) if captured else None,
        rank=context.rank,
        ranks=list(trace.distributed_ranks),
        step_count=context.step_count,
        median_step_ns=context.median_step_ns,
        wall_ns=context.wall_ns,
        projected_median_step_ns=projected.median_ns,
        programs_costed=projected.programs_costed,
        findings=rank_findings(findings),
        results=results,
        imported=imported,
        recording_window=recording_window(trace),
        chip_pace=chip_pace(trace, context.rank),
        ending=None if imported else next((bad_ending(run) for run in trace.runs if run.rank == context.rank), None),
    )


def analyze_path(path: str | os.PathLike[str], target: str | Chip | None = None, *, rank: int | None = None) -> Report:
    """Open the trace at `path`, analyse it and close it."""
    from tputrace.store.reader import open_trace

    with open_trace(path) as trace:
        return analyze(trace, target, rank=rank)
