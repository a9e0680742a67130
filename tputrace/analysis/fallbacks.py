"""CPU fallbacks: ops with no lowering that ran on the host, per op and line.

A fallback's recorded duration includes copying its inputs to the host (a sync) and its outputs
back, so it is the whole cost of the op leaving the chip.
"""

from __future__ import annotations

from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext, Cost
from tputrace.analysis.findings import AnalysisResult, Finding
from tputrace.wording import format_ns, plural

NAME = "fallbacks"

# A rewrite that has a lowering, per op. tputrace's tpu device runs nonzero, unique, bincount,
# repeat_interleave and `x[mask]` on the chip (one data-dependent sync each): they fall back only for
# arguments torch refuses, and in traces of earlier versions, which these entries still advise.
DATA_DEPENDENT_HINTS: dict[str, str] = {
    "aten.histogram": "count into a fixed range with `torch.histc(x, bins, min, max)`, or into a fixed-size tensor: "
                      "`torch.zeros(n).scatter_add_(0, x, torch.ones_like(x, dtype=torch.float))`",
    "aten.nonzero": "use a mask instead of indices (e.g. `x * mask` or `torch.where(mask, x, 0)`)",
    "aten.masked_select": "keep the shape fixed: `torch.where(mask, x, 0)` and sum with the mask as weights",
    "aten._unique2": "compute unique values once outside the loop, or use a fixed-size one-hot / bincount with a known size",
    "aten.unique_dim": "compute unique values once outside the loop",
    "aten.unique_consecutive": "compute unique values once outside the loop",
    "aten.index.Tensor": "boolean-mask indexing has a data-dependent shape; use `torch.where` with a fixed shape",
    "aten.bincount": "count into a fixed-size tensor: `torch.zeros(n).scatter_add_(0, x, torch.ones_like(x, dtype=torch.float))`",
}


@dataclass(frozen=True)
class FallbackOp:
    """The CPU fallbacks of one op at one line in the loop (`count_per_step`: steady steps; None without steps)."""

    op: str
    where: str
    count: int
    total_ns: int
    inputs: str | None
    steps: int
    count_per_step: float | None


@dataclass(frozen=True)
class FallbacksData:
    ops: tuple[FallbackOp, ...] = ()  # the costliest
    total_ns: int = 0
    total_calls: int = 0


def analyze(context: AnalysisContext) -> AnalysisResult[FallbacksData]:
    trace = context.trace
    findings: list[Finding] = []
    where, params = context.loop_line_where()
    steady_where, steady_params = context.steady_where()
    rows = trace.sql(
        "SELECT op_sid, frame_id, COUNT(*), COALESCE(SUM(dur_ns), 0), MIN(inputs_sid), COUNT(DISTINCT step) "
        f"FROM fallbacks WHERE {where} GROUP BY op_sid, frame_id HAVING {context.loop_line_having()} ORDER BY 4 DESC",
        params,
    )
    steady = {
        (op_sid, frame_id): (count, total_ns)
        for op_sid, frame_id, count, total_ns in trace.sql(
            f"SELECT op_sid, frame_id, COUNT(*), COALESCE(SUM(dur_ns), 0) FROM fallbacks WHERE {steady_where} "
            "GROUP BY op_sid, frame_id",
            steady_params,
        )
    }
    items: list[FallbackOp] = []
    steady_count = max(context.steady_count, 1)
    for op_sid, frame_id, count, total_ns, inputs_sid, steps_with in rows:
        op = trace.string(op_sid) or "?"
        steady_calls, steady_ns = steady.get((op_sid, frame_id), (0, 0))
        per_step = steady_calls / steady_count if context.steps else None
        items.append(FallbackOp(op, context.where(frame_id), count, total_ns, trace.string(inputs_sid), steps_with, per_step))
        share = context.share_of_steps(steady_ns)
        severity = context.severity(share)
        if severity == "info" and per_step and share >= 0.01:
            severity = "warning"
        location = context.where(frame_id)
        hint = _hint(op)
        cost = context.loop_cost(steady_ns, total_ns)
        findings.append(Finding(
            analyzer=NAME,
            severity=severity,
            title=f"CPU fallback: {op} runs on the host at {location} ({_rate(context, count, per_step, cost)})",
            explanation=(
                f"{op} has no lowering on the tpu device, so each call at {location} copies its inputs to the host "
                f"(waiting for the chip), runs on the CPU and copies the result back: {plural(count, 'call')} in "
                f"{plural(steps_with, 'step')}, {format_ns(total_ns / count)} each including transfers ({context.share_text(share)}). "
                f"It also ends the pending fused program, so the step is cut in two."
            ),
            suggestion=(
                f"Replace {op.rsplit('.', 1)[0]} in the loop: {hint}." if hint else
                f"Replace {op.rsplit('.', 1)[0]} with ops that have a lowering, or compute it once outside the loop."
            ),
            **cost,
            evidence=(
                context.evidence_at(f"{plural(count, 'call')} of {op}({trace.string(inputs_sid) or ''})", frame_id, table="fallbacks"),
            ),
            **context.location_fields(frame_id),
        ))
    data = FallbacksData(tuple(items[:50]), sum(item.total_ns for item in items), sum(item.count for item in items))
    return AnalysisResult(NAME, data, tuple(findings))


def _rate(context: AnalysisContext, count: int, per_step: float | None, cost: Cost) -> str:
    """`2 calls per step, 4.1 ms per step` in a run with steps, else `3 calls, 6.0 ms`."""
    if per_step is not None and cost["cost_per_step_ns"] is not None:
        return f"{per_step:.3g} {'call' if per_step == 1 else 'calls'} per step, {format_ns(cost['cost_per_step_ns'])} per step"
    return f"{plural(count, 'call')}, {format_ns(cost['cost_total_ns'])}"


def _hint(op: str) -> str | None:
    for prefix, hint in DATA_DEPENDENT_HINTS.items():
        if op == prefix or op.startswith(prefix + "."):
            return hint
    return None
