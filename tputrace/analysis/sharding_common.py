"""What the sharding analyzers share: the ICI cost model, the steady-step filter, and how a finding
names its line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tputrace.analysis.collectives import bus_factor
from tputrace.analysis.context import AnalysisContext, Cost, LocationFields
from tputrace.analysis.findings import Evidence, Finding
from tputrace.store.records import SourceLocation
from tputrace.store.sharding import CausedCollective

NAME = "sharding"

# Per cause id: calls and summed duration in the steady steps, and bytes per call.
TimeByCause = dict[int, tuple[int, float, int]]


def ici_estimate_ns(kind: str, nbytes: float, ranks: int, ici_bandwidth: float) -> float:
    """A ring collective's time on the target: bytes moved per rank over its ICI bandwidth."""
    if ici_bandwidth <= 0:
        return 0.0
    return nbytes * bus_factor(kind, ranks) / ici_bandwidth * 1e9



@dataclass
class Collected:
    """What the checks add up while they run: their findings and the data fields they fill."""

    findings: list[Finding] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)



def in_steady_steps(context: AnalysisContext, collective: CausedCollective) -> bool:
    steps = context.steady_range
    return steps is None or steps[0] <= collective.step <= steps[1]



def per_step(context: AnalysisContext, steady_ns: float) -> Cost:
    return context.loop_cost(steady_ns, steady_ns)


def location(origin: SourceLocation | None) -> LocationFields:
    return {"file": origin.file, "line": origin.line} if origin is not None else {}


def evidence(text: str, origin: SourceLocation | None, module: str | None = None) -> Evidence:
    return Evidence(text, file=origin.file if origin else None, line=origin.line if origin else None, module=module,
                    table="collective_causes")
