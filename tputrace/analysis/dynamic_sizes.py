"""A torch.compile'd function traced again when an input's size changed, and the programs compiled per size after it.

When a call of a compiled function brings a size its graph was specialised on (`tensor 'x' size mismatch at index 0.
expected 32, actual 24`), Dynamo traces the function again with that dim dynamic (a `dynamo_frame` compile whose
reason is `guard_failure`). The tpu backend still compiles one XLA program per concrete size of the dynamic graph,
so the sizes the first graph had compiled compile again, and the eager programs around the call that take the batch
(making it, the loss) compile once per size too. A loop that alternates a few sizes pays all of this in its first
steps and none of it later, so no storm finds it. One finding per guarded function and call site explains these
recompiles, at the line that calls the compiled function.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import MEASURED_ON_HOST, Finding
from tputrace.analysis.growing_sizes import growing_suggestion
from tputrace.analysis.storm_findings import growth_step
from tputrace.analysis.storms import NAME
from tputrace.wording import format_ns, plural

_SIZE_GUARD = re.compile(r"tensor '(?P<name>[^']+)' size mismatch at index (?P<dim>\d+)\. expected (?P<expected>\d+), "
                         r"actual (?P<actual>\d+)")
_CHANGE = re.compile(r"(?:dim \d+|int): (?P<before>\d+) -> (?:int )?(?P<after>\d+)")
_INT_CHANGE = re.compile(r"int (?P<before>\d+) -> int (?P<after>\d+)")


@dataclass(frozen=True)
class DynamicSizeRecompiles:
    """One compiled function's recompiles after a size guard failed: the guarded tensor and dim, the sizes it took,
    the recompiles explained (the guard failure, the dynamic graph's programs, eager programs taking the batch), and
    those that compiled a size the first graph had already compiled."""

    function: str
    where: str  # the line calling the compiled function
    tensor: str
    dim: int
    sizes: tuple[int, ...]
    recompiles: int
    recompile_ns: int
    steps: tuple[int, ...]
    again_ns: int  # the dynamic graph's programs compiled for a size the first graph had compiled


@dataclass(frozen=True)
class _Compile:
    compile_id: int
    kind: str
    name: str
    step: int
    start_ns: int
    dur_ns: int
    diff: str
    detail: dict[str, object]
    frame_id: int | None


def findings(context: AnalysisContext, leave_out: set[int]) -> list[tuple[Finding, DynamicSizeRecompiles, set[int]]]:
    """One finding per compiled function whose size guard failed, with the compile ids it explains (`leave_out`:
    compile ids another finding explains)."""
    compiles = _compiles(context)
    out = []
    for guard in compiles:
        size = _SIZE_GUARD.search(guard.diff)
        if guard.kind != "dynamo_frame" or guard.detail.get("compile_id") is None or size is None:
            continue
        graph = [row for row in compiles if row.kind in ("xla", "aot") and row.detail.get("compile_id") == guard.detail["compile_id"]]
        expected, actual = int(size["expected"]), int(size["actual"])
        sizes = {expected, actual}
        for row in graph:
            if row.kind == "xla" and row.detail.get("role") == "forward":
                sizes.update(int(value) for change in _INT_CHANGE.finditer(row.diff) for value in change.groups())
        # a prompt, then one token a call: the dynamic graph's later sizes are others' (a cache, a position)
        decoding = size["dim"] != "0" and expected > 1 and actual == 1
        explained = [guard] + [row for row in graph if row.kind == "xla" and row.diff
                               and (not decoding or _only_sizes(row.diff, {expected, actual}))]
        explained += [row for row in compiles if row.kind not in ("xla", "aot", "dynamo_frame") and row.diff
                      and row.step >= guard.step and _only_sizes(row.diff, sizes)]
        explained = [row for row in explained if row.compile_id not in leave_out]
        if not explained:
            continue
        again_ns = sum(row.dur_ns for row in graph if row.kind == "xla" and any(
            int(change["after"]) == expected for change in _INT_CHANGE.finditer(row.diff)))
        call = next((row.frame_id for row in graph if row.kind == "aot" and row.frame_id is not None), guard.frame_id)
        # The sizes of the recompiles this finding explains: a storm may explain the dynamic graph's later sizes.
        explained_sizes = {expected, actual} | {int(value) for row in explained if row is not guard
                                                for change in _CHANGE.finditer(row.diff) for value in change.groups()}
        record = DynamicSizeRecompiles(
            function=guard.name, where=context.where(call), tensor=size["name"], dim=int(size["dim"]),
            sizes=tuple(sorted(explained_sizes & sizes)), recompiles=len(explained),
            recompile_ns=_outermost_ns(explained), steps=tuple(sorted({row.step for row in explained})),
            again_ns=again_ns,
        )
        growing = _growing(expected, actual, graph)
        finding = (_growing_finding(context, call, record, expected, actual, explained, growing) if growing
                   else _finding(context, call, record, expected, actual, explained))
        out.append((finding, record,
                    {row.compile_id for row in explained}))
        leave_out = leave_out | {row.compile_id for row in explained}
    return out


def _compiles(context: AnalysisContext) -> list[_Compile]:
    trace = context.trace
    rows = trace.sql(
        "SELECT c.id, c.kind, n.text, c.step, COALESCE(c.start_ns, 0), COALESCE(c.dur_ns, 0), d.text, c.detail, c.frame_id FROM compiles c "
        "LEFT JOIN strings n ON n.id = c.name_sid LEFT JOIN strings d ON d.id = c.diff_sid "
        "WHERE c.rank = ? AND c.signature_sid IS NOT NULL AND c.reason IN ('first', 'recompile', 'guard_failure') "
        "ORDER BY c.start_ns",
        (context.rank,),
    )
    out = []
    for compile_id, kind, name, step, start_ns, dur_ns, diff, detail, frame_id in rows:
        try:
            parsed = json.loads(detail) if detail else {}
        except ValueError:
            parsed = {}
        out.append(_Compile(compile_id, kind or "", name or "?", -1 if step is None else step, start_ns, dur_ns, diff or "",
                            parsed if isinstance(parsed, dict) else {}, frame_id))
    return out


def _outermost_ns(rows: list[_Compile]) -> int:
    """The compile time of `rows` without those inside another's interval (an eager batch flushed while Dynamo traced
    the call is in the guard failure's time)."""
    return sum(row.dur_ns for row in rows if not any(
        other is not row and other.start_ns <= row.start_ns and row.start_ns + row.dur_ns <= other.start_ns + other.dur_ns
        for other in rows))


def _only_sizes(diff: str, sizes: set[int]) -> bool:
    """The diff changes dims only, each between two of the guarded sizes."""
    changes = list(_CHANGE.finditer(diff))
    return bool(changes) and all(int(change["before"]) in sizes and int(change["after"]) in sizes for change in changes)


def _one_size(record: DynamicSizeRecompiles) -> str:
    """How to give the guarded dim one size: a batch dim keeps full batches, another (a sequence's length) pads."""
    if record.dim == 0:
        return (f"`drop_last=True` in the DataLoader, or pad the smaller batches to {max(record.sizes)} and mask their "
                "padding out of the loss")
    return (f"pad dim {record.dim} of `{record.tensor}` to one length (the longest, or a fixed maximum) where the input "
            "is made, and mask the padding (an attention mask, `ignore_index` in the loss)")


def _growing(expected: int, actual: int, graph: list[_Compile]) -> tuple[int, int] | None:
    """(the growth, the largest size) where the guarded size grew and the dynamic graph's programs then compiled for
    sizes growing by the same amount, several a step (a KV cache the function extends at each call, as the storms
    read a growing tensor); None otherwise, as for a length the loop sets once a step."""
    rows = [row for row in graph if row.kind == "xla" and row.diff and row.detail.get("role") in ("forward", "inference")]
    sizes = [expected, actual] + [int(change["after"]) for row in rows for change in list(_CHANGE.finditer(row.diff))[:1]]
    growth = growth_step(sizes, len({row.step for row in rows}))
    return None if growth is None or growth != actual - expected else (growth, max(sizes))


def _steps_text(steps: tuple[int, ...]) -> str:
    if len(steps) == 1:
        return f"step {steps[0]}"
    return f"steps {steps[0]}-{steps[-1]}"


def _finding(context: AnalysisContext, call: int | None, record: DynamicSizeRecompiles, expected: int, actual: int,
             explained: list[_Compile]) -> Finding:
    share = context.share_of_wall(record.recompile_ns)
    guard = explained[0]
    sizes = ", ".join(str(size) for size in record.sizes)
    again = (f" {format_ns(record.again_ns)} of it compiled the dynamic graph for {expected}, a size the first graph "
             f"had already compiled: the dynamic graph replaces the static one." if record.again_ns else "")
    if record.dim > 0 and expected > 1 and actual == 1:  # a prompt, then one token a call
        return _decoding_finding(context, call, record, expected, explained)
    evidence = [context.evidence_at(f"step {row.step}: {row.name} ({row.kind}) compiled again, {format_ns(row.dur_ns)}: "
                                    f"{row.diff[:160]}", row.frame_id, table="compiles") for row in explained[:6]]
    return Finding(
        analyzer=NAME,
        severity=context.severity(share),
        title=(f"torch.compile traced {record.function} again when {record.tensor} dim {record.dim} changed "
               f"({expected} -> {actual}) at {record.where}: {plural(record.recompiles, 'recompile')} in "
               f"{_steps_text(record.steps)}"),
        explanation=(
            f"{record.function}, called at {record.where}, was compiled for {record.tensor} with dim {record.dim} = "
            f"{expected}; a call with {actual} failed Dynamo's guard, and Dynamo traced the function again with that "
            f"dim dynamic ({format_ns(guard.dur_ns)}). The tpu backend still compiles one XLA program per size of a "
            f"dynamic graph (XLA's shapes are static), and the eager programs that take the batch compile per size "
            f"too: {plural(record.recompiles, 'recompile')} for the sizes {sizes}, {format_ns(record.recompile_ns)} "
            f"({share:.0%} of the run).{again} A loop cycling through these sizes pays this in its first steps only; "
            f"each further size costs its compiles again."
        ),
        suggestion=(
            f"Give the compiled function one size: {_one_size(record)}. Where a few sizes must stay, pad to fixed "
            f"buckets and either compile with `torch.compile(..., dynamic=False)` (one static graph per bucket, each "
            f"traced and compiled once and reused) or call `torch._dynamo.mark_dynamic(x, {record.dim})` on the input "
            f"(Dynamo's `{record.tensor}`) before the first call, so Dynamo traces one dynamic graph from the start instead of tracing again at "
            f"the first new size; XLA still compiles each bucket once."
        ),
        cost_total_ns=float(record.recompile_ns),
        cost_per_step_ns=None,
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(evidence),
        **context.location_fields(call),
    )


def _decoding_finding(context: AnalysisContext, call: int | None, record: DynamicSizeRecompiles, prompt: int,
                      explained: list[_Compile]) -> Finding:
    """The guard that failed when a generation loop went from its prompt to one token a call: paid once, and padding
    the token to the prompt's length would make every decoding step compute the prompt's positions."""
    guard = explained[0]
    evidence = [context.evidence_at(f"step {row.step}: {row.name} ({row.kind}) compiled again, {format_ns(row.dur_ns)}: "
                                    f"{row.diff[:160]}", row.frame_id, table="compiles") for row in explained[:6]]
    return Finding(
        analyzer=NAME,
        severity="info",
        title=(f"torch.compile traced {record.function} again when {record.tensor} went from {prompt} to 1 along dim "
               f"{record.dim} at {record.where}: a prompt, then one token a call, paid once"),
        explanation=(
            f"{record.function} was compiled for {record.tensor} with dim {record.dim} = {prompt}, and the call at "
            f"{record.where} passed 1: a prompt run whole (the prefill), then one token a call, as autoregressive "
            f"decoding does. Dynamo traced the function again with that dim dynamic ({format_ns(guard.dur_ns)}"
            + (f"; {record.recompiles} recompiles, {format_ns(record.recompile_ns)} in all" if record.recompiles > 1 else "")
            + "); the prompt and the single token are two shapes by design, each compiled once."
        ),
        suggestion=(
            f"Keep the two shapes: padding {record.tensor} to one length would make every decoding step compute "
            f"{prompt} positions for its one token. Recompiles at every token come from what grows with the sequence "
            "(a KV cache extended at each call, a position passed as a Python int), not from this guard: give those "
            "one shape (a cache allocated at its largest size, a position kept as a tensor on the chip)."
        ),
        cost_total_ns=float(record.recompile_ns),
        cost_per_step_ns=None,
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(evidence),
        **context.location_fields(call),
    )


def _growing_finding(context: AnalysisContext, call: int | None, record: DynamicSizeRecompiles, expected: int,
                     actual: int, explained: list[_Compile], growing: tuple[int, int]) -> Finding:
    """The guard that failed at the first call of a tensor growing at each call (a KV cache the function extends and
    returns): the start of that growth, whose fix is one allocation at the largest size, not padding at its making."""
    growth, largest = growing
    share = context.share_of_wall(record.recompile_ns)
    evidence = [context.evidence_at(f"step {row.step}: {row.name} ({row.kind}) compiled again, {format_ns(row.dur_ns)}: "
                                    f"{row.diff[:160]}", row.frame_id, table="compiles") for row in explained[:6]]
    dim_name = f"dim {record.dim} of `{record.tensor}`"
    return Finding(
        analyzer=NAME,
        severity=context.severity(share),
        title=(f"torch.compile traced {record.function} again when {record.tensor} dim {record.dim} grew "
               f"({expected} -> {actual}) at {record.where}: a tensor growing by {growth} at each call"),
        explanation=(
            f"{record.function}, called at {record.where}, was compiled for {record.tensor} with dim {record.dim} = "
            f"{expected}; a call with {actual} failed Dynamo's guard, and Dynamo traced the function again with that "
            f"dim dynamic ({format_ns(record.recompile_ns)}, {share:.0%} of the run). The dynamic graph's XLA programs "
            f"then compiled for sizes growing by {growth} each time, up to {largest}: the tensor grows at every call, "
            "and each new size compiles again (XLA's shapes are static)."
        ),
        suggestion=growing_suggestion(dim_name, growth, largest, compiled=True),
        cost_total_ns=float(record.recompile_ns),
        cost_per_step_ns=None,
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(evidence),
        **context.location_fields(call),
    )
