"""Guard recompiles: a torch.compile'd function that Dynamo compiled again and again, by the guards that failed.

Where compiles carry no input signature (a `TORCH_TRACE` import), the `recompiles` analyzer cannot tell which dim
changed; Dynamo's own recompile reasons can. Each `dynamo_frame` recompile's diff is the guard that failed
(`0/3: tensor 'x' size mismatch at index 0. expected 8, actual 12`, `0/5: n == 2 (...)`); a function recompiled at
least `MIN_RECOMPILES` times is one finding, which counts the recompiles by what changed (a tensor's dim, a Python
value the graph was specialised on) and suggests the change for each.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from tputrace.analysis import int_inputs, value_guards
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import MEASURED_ON_HOST, AnalysisResult, Evidence, Finding
from tputrace.wording import format_ns, plural

NAME = "guard_recompiles"
MIN_RECOMPILES = 3
_SIZE_GUARD = re.compile(r"tensor '(?P<name>[^']+)' (?:size|stride) mismatch at index (?P<dim>\d+)")
_VALUE_GUARD = re.compile(r"^(?:\d+/\d+: )?(?P<name>[A-Za-z_][\w.\[\]'\"]*) == ")
_LIMIT = "recompile limit"


@dataclass(frozen=True)
class GuardRecompiles:
    """One compiled function's recompiles: where, how many, their compile time, and what changed (with counts)."""

    where: str
    function: str
    recompiles: int
    compile_ns: int
    changes: tuple[tuple[str, int], ...]
    hit_limit: bool = False  # a compile failed on Dynamo's recompile limit (a TORCH_TRACE log's `fail_reason`)


@dataclass(frozen=True)
class GuardRecompilesData:
    functions: tuple[GuardRecompiles, ...] = ()


def analyze(context: AnalysisContext) -> AnalysisResult[GuardRecompilesData]:
    trace = context.trace
    rows = trace.sql(
        "SELECT c.frame_id, n.text, d.text, c.dur_ns, json_extract(c.detail, '$.limit') FROM compiles c "
        "LEFT JOIN strings n ON n.id = c.name_sid "
        "LEFT JOIN strings d ON d.id = c.diff_sid WHERE c.rank = ? AND c.kind = 'dynamo_frame' AND c.reason = 'recompile' "
        "AND c.signature_sid IS NULL ORDER BY c.start_ns",
        (context.rank,),
    )
    by_function: dict[tuple[int | None, str], list[tuple[str, int]]] = {}
    limited: set[tuple[int | None, str]] = set()  # functions with a compile that failed on Dynamo's limit
    for frame_id, name, diff, dur_ns, limit in rows:
        by_function.setdefault((frame_id, name or "?"), []).append((diff or "", dur_ns or 0))
        if limit:
            limited.add((frame_id, name or "?"))
    functions: list[GuardRecompiles] = []
    findings: list[Finding] = []
    for (frame_id, name), recompiles in by_function.items():
        changes = Counter(_change(diff) for diff, _ in recompiles)
        compile_ns = sum(dur_ns for _, dur_ns in recompiles)
        record = GuardRecompiles(context.where(frame_id), name, len(recompiles), compile_ns, tuple(changes.most_common()),
                                 (frame_id, name) in limited)
        functions.append(record)
        if len(recompiles) >= MIN_RECOMPILES:
            findings.append(_finding(context, frame_id, record))
    findings.extend(value_guards.findings(context))  # a recorded run's: its compiles carry signatures
    findings.extend(int_inputs.findings(context))
    return AnalysisResult(NAME, GuardRecompilesData(tuple(functions)), tuple(findings))


def explains_limit(context: AnalysisContext, frame_id: int | None) -> bool:
    """Whether this analyzer's finding on a function's recompiles (of an import, where they carry no signatures) tells
    that the function defined at `frame_id` hit the recompile limit."""
    (count,) = context.trace.sql(
        "SELECT COUNT(*) FROM compiles WHERE rank = ? AND kind = 'dynamo_frame' AND reason = 'recompile' "
        "AND signature_sid IS NULL AND frame_id IS ?", (context.rank, frame_id))[0]
    return int(count) >= MIN_RECOMPILES


def _change(diff: str) -> str:
    """What a failed guard says changed: `the size of x, dim 0`, `the value of n`, or the guard itself."""
    size = _SIZE_GUARD.search(diff)
    if size is not None:
        return f"the size of {size['name']}, dim {size['dim']}"
    if _LIMIT in diff:
        return "the recompile limit (the function then runs without compiling)"
    value = _VALUE_GUARD.search(diff)
    if value is not None:
        return f"the value of {value['name']}"
    return diff.split(" (", 1)[0][:120] or "an unrecorded guard"


def _finding(context: AnalysisContext, frame_id: int | None, record: GuardRecompiles) -> Finding:
    share = context.share_of_wall(record.compile_ns)
    changed = "; ".join(f"{change} ({plural(count, 'recompile')})" for change, count in record.changes[:4])
    advice = []
    if any(change.startswith("the size of") for change, _ in record.changes):
        advice.append("for a changing size, pad it to a few fixed sizes, or mark the dim dynamic "
                      "(`torch._dynamo.mark_dynamic(tensor, dim)` or `torch.compile(..., dynamic=True)`)")
    if any(change.startswith("the value of") for change, _ in record.changes):
        advice.append("for a Python value the graph was specialised on, pass it as a tensor, or keep it constant")
    if record.hit_limit or any(change.startswith("the recompile limit") for change, _ in record.changes):
        advice.append("the function hit Dynamo's recompile limit and then ran uncompiled, so its later calls are slow too")
    suggestion = ("Make the compiled function's inputs stable: " + "; ".join(advice) + "."
                  if advice else "Make the guarded inputs stable between calls (the guards are listed).")
    return Finding(
        analyzer=NAME,
        severity=context.severity(share),
        title=f"torch.compile recompiled {record.function} {plural(record.recompiles, 'time')} at {record.where}: {changed}",
        explanation=(f"Dynamo compiled {record.function} again {plural(record.recompiles, 'time')}, each when a guard "
                     f"of the earlier graphs failed, {format_ns(record.compile_ns)} of compiling in all "
                     f"({share:.0%} of the run). What changed: {changed}."),
        suggestion=suggestion,
        cost_total_ns=float(record.compile_ns),
        cost_per_step_ns=None,
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(Evidence(f"{change}: {plural(count, 'recompile')}", table="compiles") for change, count in record.changes[:6]),
        **context.location_fields(frame_id),
    )
