"""What collectives' time is a share of: the steady steps as the host timed them, or, where a loop does not wait for
each step and its device work runs past the host's step, the device's time in each step."""

from __future__ import annotations

from collections.abc import Sequence

from tputrace.analysis.context import AnalysisContext


def device_step_time_ns(context: AnalysisContext, steady_where: str, params: Sequence[int]) -> int | None:
    """The steady steps' time counting each step's device work (the ops and collectives tied to it) from its first to
    its last, where that runs past the host's step: the longer of the two per step. None where no step's device work
    outlasts it (a loop that waits for each step: the host's steps are the measure)."""
    if not context.steps:
        return None
    spans = dict(context.trace.sql(
        "SELECT step, MAX(end_ns) - MIN(start_ns) FROM ("
        f"SELECT step, start_ns, start_ns + dur_ns AS end_ns FROM ops WHERE {steady_where} UNION ALL "
        f"SELECT step, start_ns, start_ns + dur_ns AS end_ns FROM collectives WHERE {steady_where}) GROUP BY step",
        tuple(params) + tuple(params)))
    steps = context.steady_steps
    total = sum(max(step.dur_ns or 0, int(spans.get(step.step) or 0)) for step in steps)
    return total if total > sum(step.dur_ns or 0 for step in steps) else None


def step_share(context: AnalysisContext, steady_cost_ns: float, device_steps_ns: int | None) -> float:
    """`steady_cost_ns` as a share of the steady steps: of `device_steps_ns` where the device's work outlasts the
    host's steps, else of the host's steps."""
    return steady_cost_ns / device_steps_ns if device_steps_ns else context.share_of_steps(steady_cost_ns)
