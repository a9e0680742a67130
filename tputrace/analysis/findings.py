"""What an analysis produces: findings (ranked, tied to source lines) and the data behind them.

This is the contract between the analyzers and every view (report, TUI, HTML, exports). It imports
only the standard library.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, is_dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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


CostBasis = Literal["measured on this host", "projected for the target chip", "estimate"]
MEASURED_ON_HOST: CostBasis = "measured on this host"
PROJECTED_FOR_TARGET: CostBasis = "projected for the target chip"


@dataclass(frozen=True)
class Finding:
    """A diagnosis: what is wrong, where, what it costs, and what to change.

    Costs are in nanoseconds computed from the trace (never hard-coded); `cost_per_step_ns` is None when
    the run has no steps. `cost_basis` says what the cost is: time measured on the host that recorded
    the trace (a compile on XLA:CPU, a host stall: the same whatever the target), a projection for the
    target chip (its peaks and bandwidth applied to the recorded work), or an estimate of another kind.
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
    cost_basis: CostBasis = "estimate"


DataT = TypeVar("DataT", bound="DataclassInstance")


@dataclass(frozen=True)
class AnalysisResult(Generic[DataT]):
    """One analyzer's output: its data (a frozen dataclass of its own, see each analyzer's module) and its
    findings."""

    analyzer: str
    data: DataT
    findings: tuple[Finding, ...] = ()

    def plain_data(self) -> dict[str, Any]:
        """The data as plain dicts, lists and numbers: the form `tputrace report --json` writes."""
        data: dict[str, Any] = plain(asdict(self.data))
        return data


def plain(value: Any) -> Any:
    """`value` with dataclasses as dicts and tuples as lists, at any depth, for JSON and tables."""
    if is_dataclass(value) and not isinstance(value, type):
        return plain(asdict(value))
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


REFERENCE_STEPS = 100
"""The run length findings are ranked for: a cost paid every step outweighs a one-time cost of the same size
in a traced run of a few steps, as it does in the training run the trace stands for."""


def ranking_cost_ns(finding: Finding) -> float:
    """What `finding` costs over a run of `REFERENCE_STEPS` steps: a cost paid every step
    (`cost_per_step_ns` set) over that many steps, a one-time cost as it was measured; never less than the
    cost measured in the traced run."""
    if finding.cost_per_step_ns is None:
        return finding.cost_total_ns
    return max(finding.cost_total_ns, finding.cost_per_step_ns * REFERENCE_STEPS)


def rank(findings: Iterable[Finding]) -> list[Finding]:
    """Highest cost over a run of `REFERENCE_STEPS` steps first; severity breaks ties."""
    return sorted(findings, key=lambda finding: (-ranking_cost_ns(finding), SEVERITY_ORDER[finding.severity], finding.title))
