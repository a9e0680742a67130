"""The findings the report shows, from `tputrace.analysis`, and which section shows each analyzer's.

If the diagnoses fail, the report carries no findings and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tputrace.analysis import chips
from tputrace.analysis.chips import Chip
from tputrace.analysis.findings import MEASURED_ON_HOST, AnalysisResult, Finding, rank as rank_findings
from tputrace.derived.imported_sources import measured_on

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

# Which report section shows an analyzer's findings: by name for the analyzers of tputrace.analysis,
# else by words in the analyzer's name (first match wins), else "where".
ANALYZER_SECTIONS: dict[str, str] = {
    "no_device_ops": "where",
    "recompiles": "recompilations",
    "guard_recompiles": "recompilations",
    "recompile_limit": "recompilations",
    "program_cache": "recompilations",
    "set_up_work": "recompilations",
    "step_tail": "recompilations",
    "remade_optimizers": "steps",
    "compile_cache": "recompilations",
    "graph_breaks": "recompilations",
    "syncs": "timeline",
    "fallbacks": "timeline",
    "fusion": "timeline",
    "transfers": "timeline",
    "data_movement": "timeline",
    "index_errors": "timeline",
    "padding": "shapes",
    "frozen_backward": "steps",
    "precision": "shapes",
    "host_bound": "steps",
    "input_wait": "steps",
    "memory": "memory",
    "collectives": "collectives",
    "sharding": "collectives",
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



@dataclass
class AnalysisData:
    """Findings and per-analyzer results from `tputrace.analysis`, and the target chip they assume."""

    available: bool
    note: str
    target: Chip
    target_is_default: bool
    findings: list[Finding] = field(default_factory=list)
    results: dict[str, AnalysisResult] = field(default_factory=dict)
    measured_on: str = "this host"  # where a cost "measured on this host" was measured: an import's own device

    def cost_basis(self, finding: Finding) -> str:
        """How `finding`'s cost was found, a measured cost naming where it was measured (an import's device)."""
        return f"measured on {self.measured_on}" if finding.cost_basis == MEASURED_ON_HOST else finding.cost_basis

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
                        dict(report.results), measured_on(report.imported.device if report.imported else None))

