"""torch.compile's recompile limit: Dynamo stopped compiling a function, which then runs uncompiled.

After `torch._dynamo.config.recompile_limit` compiles of one function (8 by default), Dynamo compiles it no more:
every later call whose inputs fail the compiled graphs' guards runs the function's Python as it is, its ops
dispatched one by one, and nothing but a log warning says so. The recording keeps that warning (an annotation
with source `recompile_limit`, at the user's line calling the function). One finding per limit hit, costed at the
host time of the ops dispatched from that line after the hit (the uncompiled calls' own dispatch: an upper bound
of what compiling them would save).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputrace.analysis import guard_recompiles, value_guards
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import MEASURED_ON_HOST, AnalysisResult, Evidence, Finding
from tputrace.wording import format_ns

NAME = "recompile_limit"
_WARNING = re.compile(r"hit config\.(?P<limit>\w+) \((?P<value>\d+)\)(?:\n\s*function: '(?P<function>[^']*)' \((?P<file>.*):(?P<line>\d+)\))?"
                      r"(?:\n\s*last reason: (?P<reason>.*))?")


@dataclass(frozen=True)
class LimitHit:
    """One function that hit Dynamo's limit: where it was called, which limit, in which step, after what guard failure."""

    where: str
    limit: str
    value: int
    function: str
    step: int | None
    last_reason: str
    uncompiled_ns: int  # host time of the ops dispatched at the calling line after the hit


@dataclass(frozen=True)
class RecompileLimitData:
    hits: tuple[LimitHit, ...] = ()


def analyze(context: AnalysisContext) -> AnalysisResult[RecompileLimitData]:
    rows = context.trace.sql(
        "SELECT s.text, a.frame_id, a.start_ns, a.step FROM annotations a JOIN strings s ON s.id = a.name_sid "
        "WHERE a.rank = ? AND a.source = 'recompile_limit' ORDER BY a.start_ns", (context.rank,))
    hits: list[LimitHit] = []
    findings: list[Finding] = []
    for text, frame_id, start_ns, step in rows:
        match = _WARNING.search(text or "")
        if match is None or (match["file"] and value_guards.limit_hit_explained(context, f"{match['file']}:{match['line']}")):
            continue  # no limit named, or a value-guard storm's finding tells it
        if guard_recompiles.explains_limit(context, frame_id):
            continue  # an import's recompiles finding on the function tells it
        (uncompiled_ns,) = context.trace.sql(
            "SELECT COALESCE(SUM(dur_ns), 0) FROM ops WHERE rank = ? AND frame_id IS ? AND start_ns > ?",
            (context.rank, frame_id, start_ns))[0]
        hit = LimitHit(context.where(frame_id), match["limit"], int(match["value"]), match["function"] or "the function",
                       step, (match["reason"] or "").strip(), int(uncompiled_ns))
        hits.append(hit)
        findings.append(_finding(context, frame_id, hit))
    return AnalysisResult(NAME, RecompileLimitData(tuple(hits)), tuple(findings))


def _finding(context: AnalysisContext, frame_id: int | None, hit: LimitHit) -> Finding:
    in_step = f" in step {hit.step}" if hit.step is not None and context.steps else ""
    value = value_guards.guarded_value(hit.last_reason)
    shown = value[0] if value else hit.last_reason
    reason = f" (the last guard that failed: {shown})" if hit.last_reason else ""
    return Finding(
        analyzer=NAME,
        severity="warning",
        title=f"torch.compile stopped compiling the call at {hit.where}: Dynamo hit its {hit.limit} ({hit.value}){in_step}",
        explanation=(
            f"Dynamo compiled the function called at {hit.where} {hit.value} times{reason} and then reached "
            f"`torch._dynamo.config.{hit.limit}`: every later call whose inputs fail the compiled graphs' guards runs "
            f"uncompiled, its ops dispatched one by one, and each new input shape compiles those ops' programs again. "
            + (f"The ops dispatched from that line after the limit took {format_ns(hit.uncompiled_ns)} of host time."
               if _has_ops(context) else "The capture has no ops to time the uncompiled calls by.")
        ),
        suggestion=value[1] if value else (
            "Give the compiled function stable inputs: pad the changing dim to a few fixed sizes, or mark it dynamic "
            "before the first call (`torch._dynamo.mark_dynamic(x, dim)`), so that it compiles a few times at most; "
            f"raise `torch._dynamo.config.{hit.limit}` only where the shapes are few and known."
        ),
        cost_total_ns=float(hit.uncompiled_ns),
        cost_per_step_ns=context.per_step(hit.uncompiled_ns),
        cost_basis=MEASURED_ON_HOST,
        evidence=(Evidence(f"{hit.limit} = {hit.value}, hit by {hit.function}", table="annotations"),),
        **context.location_fields(frame_id),
    )


def _has_ops(context: AnalysisContext) -> bool:
    """Whether the rank recorded ops (a `TORCH_TRACE` log's import has none)."""
    return bool(context.trace.sql("SELECT 1 FROM ops WHERE rank = ? LIMIT 1", (context.rank,)))
