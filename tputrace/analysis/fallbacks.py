"""CPU fallbacks: ops with no lowering that ran on the host, per op and line.

A fallback's recorded duration includes copying its inputs to the host (a sync) and its outputs
back, so it is the whole cost of the op leaving the chip. A backward op that falls back with its
forward (`aten._ctc_loss_backward` after `aten._ctc_loss`) is part of the forward's finding, at the
forward's line: replacing the forward removes both. A sparse gradient the device held dense
(`nn.Embedding(sparse=True)`) is an info finding of its own (`sparse_gradients`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext, Cost, per_call_text
from tputrace.analysis.findings import AnalysisResult, Finding
from tputrace.analysis.sparse_gradients import sparse_gradient_findings
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


@dataclass
class _Line:
    """One op's fallbacks at one line: in the loop, and in its steady steps."""

    op: str
    frame_id: int | None
    count: int
    total_ns: int
    inputs: str | None
    steps_with: int
    steady_calls: int
    steady_ns: int


def analyze(context: AnalysisContext) -> AnalysisResult[FallbacksData]:
    trace = context.trace
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
    lines = [
        _Line(trace.string(op_sid) or "?", frame_id, count, total_ns, trace.string(inputs_sid), steps_with,
              *steady.get((op_sid, frame_id), (0, 0)))
        for op_sid, frame_id, count, total_ns, inputs_sid, steps_with in rows
    ]
    steady_count = max(context.steady_count, 1)
    items = [
        FallbackOp(line.op, context.where(line.frame_id), line.count, line.total_ns, line.inputs, line.steps_with,
                   line.steady_calls / steady_count if context.steps else None)
        for line in lines
    ]
    backwards = _backwards_of_forwards(lines)
    findings = [
        _finding(context, line, [backward for backward in lines if backwards.get(id(backward)) is line])
        for line in lines if id(line) not in backwards
    ]
    findings.sort(key=lambda finding: -finding.cost_total_ns)
    findings += sparse_gradient_findings(context, NAME)
    data = FallbacksData(tuple(items[:50]), sum(item.total_ns for item in items), sum(item.count for item in items))
    return AnalysisResult(NAME, data, tuple(findings))


def _backwards_of_forwards(lines: list[_Line]) -> dict[int, _Line]:
    """Each backward fallback (`aten._ctc_loss_backward`) whose forward (`aten._ctc_loss`) also fell back,
    keyed by its `id`, to the forward's costliest line: one change, at the forward's line, removes both."""
    forwards: dict[str, _Line] = {}
    for line in lines:  # costliest first
        forwards.setdefault(_packet(line.op), line)
    joined: dict[int, _Line] = {}
    for line in lines:
        packet = _packet(line.op)
        forward = forwards.get(packet.removesuffix("_backward")) if packet.endswith("_backward") else None
        if forward is not None:
            joined[id(line)] = forward
    return joined


def _packet(op: str) -> str:
    """An op's name without its namespace and overload: `_ctc_loss` for `aten._ctc_loss.default`."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else op


def _finding(context: AnalysisContext, line: _Line, backwards: list[_Line]) -> Finding:
    op, frame_id = line.op, line.frame_id
    count, total_ns = line.count, line.total_ns
    steady_count = max(context.steady_count, 1)
    per_step = line.steady_calls / steady_count if context.steps else None
    steady_ns = line.steady_ns + sum(backward.steady_ns for backward in backwards)
    share = context.share_of_steps_less_compiles(steady_ns)
    severity = context.severity(share)
    if severity == "info" and per_step and share >= 0.01:
        severity = "warning"
    location = context.where(frame_id)
    hint = _hint(op)
    cost = context.loop_cost(steady_ns, total_ns + sum(backward.total_ns for backward in backwards))
    each = per_call_text(context, total_ns, count, line.steady_ns, line.steady_calls, "each including transfers")
    explanation = (
        f"{op} has no lowering on the tpu device, so each call at {location} copies its inputs to the host "
        f"(waiting for the chip), runs on the CPU and copies the result back: {plural(count, 'call')} in "
        f"{plural(line.steps_with, 'step')}, {each} ({context.share_text(share)}). "
        f"It also ends the pending fused program, so the step is cut in two."
    )
    evidence = [context.evidence_at(f"{plural(count, 'call')} of {op}({line.inputs or ''})", frame_id, table="fallbacks")]
    for backward in backwards:
        explanation += (
            f" Its backward, {backward.op}, falls back too, at {context.where(backward.frame_id)} "
            f"({plural(backward.count, 'call')}, {format_ns(backward.total_ns)}); the cost counts both."
        )
        evidence.append(context.evidence_at(f"{plural(backward.count, 'call')} of {backward.op}({backward.inputs or ''})",
                                            backward.frame_id, table="fallbacks"))
    name = op.rsplit(".", 1)[0]
    also = f" (and so its backward, {backwards[0].op.rsplit('.', 1)[0]})" if backwards else ""
    return Finding(
        analyzer=NAME,
        severity=severity,
        title=f"CPU fallback: {op} runs on the host at {location} ({_rate(context, count, per_step, cost)})",
        explanation=explanation,
        suggestion=(
            f"Replace {name}{also} in the loop: {hint}." if hint else
            f"Replace {name}{also} with ops that have a lowering, or compute it once outside the loop."
        ),
        **cost,
        evidence=tuple(evidence),
        **context.location_fields(frame_id),
    )


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
