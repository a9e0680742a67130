"""The one builder of the findings that name a late rank (`collective_stragglers`, `rank_extra_ops`): what each of them
opens with (how long the other ranks waited for it), how severe it is, and what it costs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.analysis.findings import Evidence, Finding

if TYPE_CHECKING:
    from tputrace.analysis.context import AnalysisContext


@dataclass(frozen=True)
class LateRank:
    """A rank the others waited for: their mean wait (`waited_ns`), its share of their collective time, the share of
    the steps the rank was last in, and each rank's waiting as evidence."""

    analyzer: str
    rank: int
    waited_ns: float
    share: float
    last_in: float
    waits: tuple[Evidence, ...]


def straggler_finding(context: AnalysisContext, late: LateRank, *, title: str, explanation: str, suggestion: str,
                      evidence: tuple[Evidence, ...] = (), last_in_most: bool = True, file: str | None = None,
                      line: int | None = None) -> Finding:
    """A finding about `late`: `explanation` goes on from "rank R" after the sentence of the others' wait; a warning
    where the wait is 5% of the wall time or more and (with `last_in_most`) the rank was last in half the steps or more;
    its cost is the others' mean wait. `evidence` comes before each rank's waiting."""
    warns = context.share_of_wall(late.waited_ns) >= 0.05 and (not last_in_most or late.last_in >= 0.5)
    return Finding(
        analyzer=late.analyzer,
        severity="warning" if warns else "info",
        title=title,
        explanation=(f"Ranks other than {late.rank} spent {late.share:.0%} of their collective time waiting for the last rank to "
                     f"arrive; rank {late.rank} {explanation}"),
        suggestion=suggestion,
        cost_total_ns=float(late.waited_ns),
        cost_per_step_ns=context.per_step(late.waited_ns),
        evidence=evidence + late.waits,
        file=file,
        line=line,
    )
