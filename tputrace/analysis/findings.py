"""What an analysis produces: findings (ranked, tied to source lines) and the data behind them.

This is the contract between the analyzers and every view (report, TUI, HTML, exports). It imports
only the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["critical", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"critical": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Evidence:
    """One piece of evidence: a line of text, optionally tied to a source line, a module path, or records."""

    text: str
    file: str | None = None
    line: int | None = None
    module: str | None = None
    table: str | None = None
    record_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Finding:
    """A diagnosis: what is wrong, where, what it costs, and what to change.

    Costs are estimates in nanoseconds computed from the trace (never hard-coded); `cost_per_step_ns`
    is None when the run has no steps.
    """

    analyzer: str
    severity: Severity
    title: str
    explanation: str
    suggestion: str
    cost_total_ns: float
    cost_per_step_ns: float | None = None
    evidence: tuple[Evidence, ...] = ()
    file: str | None = None
    line: int | None = None
    module: str | None = None


@dataclass
class AnalysisResult:
    """One analyzer's output: its data (tables as lists of dicts, numbers) and its findings."""

    analyzer: str
    data: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)


def rank(findings: list[Finding]) -> list[Finding]:
    """Highest estimated cost first; severity breaks ties."""
    return sorted(findings, key=lambda finding: (-finding.cost_total_ns, SEVERITY_ORDER[finding.severity], finding.title))
