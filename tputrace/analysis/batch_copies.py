"""One batch copied to the chip field by field: `x = x.to(dev)`, `y = y.to(dev)`, `m = m.to(dev)` on consecutive
lines of one function, each copying the same number of times every step. The transfers analyzer's findings for such
lines become one finding per batch, naming its lines, in place of one per line."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Finding
from tputrace.wording import format_bytes, format_ns, plural

# Lines of one batch's copies lie at most this many lines apart (a blank line or a comment between them).
MAX_LINE_GAP = 2

BATCH_SUGGESTION = (
    "The lines copy one batch's tensors to the chip one by one, each a transfer of its own every step: copy them while "
    "the previous step runs (a `DataLoader(..., pin_memory=True)` and `.to(device, non_blocking=True)` for each, or a "
    "loader that prefetches to the chip), or fewer, larger copies (concatenate the fields on the host, copy once and "
    "split on the chip); if the host makes them with torch ops (random draws, masks), make them on the chip with "
    "`device=...`, so nothing is copied."
)


@dataclass(frozen=True)
class LineCopies:
    """A transfers finding for one line copying every step with the general advice: a candidate field of a batch."""

    frame_id: int
    copies_per_step: float
    bytes_per_step: float
    steady_ns: float
    finding: Finding


def merge_batches(context: AnalysisContext, candidates: list[LineCopies]) -> dict[int, Finding | None]:
    """For each candidate line that belongs to a batch of two or more such lines: the batch's finding for its first
    line, None for the others (dropped)."""
    keyed = []
    for candidate in candidates:
        location = context.location(candidate.frame_id)
        if location is not None:
            keyed.append(((location.file, location.function), location.line, candidate))
    keyed.sort(key=lambda item: (item[0], item[1]))
    groups: list[list[tuple[int, LineCopies]]] = []
    previous: tuple[tuple[str, str], int, float] | None = None
    for function, line, candidate in keyed:
        if (previous is not None and previous[0] == function and line - previous[1] <= MAX_LINE_GAP
                and previous[2] == candidate.copies_per_step):
            groups[-1].append((line, candidate))
        else:
            groups.append([(line, candidate)])
        previous = (function, line, candidate.copies_per_step)
    merged: dict[int, Finding | None] = {}
    for group in groups:
        if len(group) < 2:
            continue
        members = [candidate for _, candidate in group]
        merged[members[0].frame_id] = _batch_finding(context, members)
        merged.update({candidate.frame_id: None for candidate in members[1:]})
    return merged


def _batch_finding(context: AnalysisContext, members: list[LineCopies]) -> Finding:
    first = members[0].finding
    wheres = [context.where(candidate.frame_id) for candidate in members]
    lines = ", ".join([wheres[0], *(where.rsplit(":", 1)[1] for where in wheres[1:])])
    per_step_bytes = sum(candidate.bytes_per_step for candidate in members)
    copies = sum(candidate.copies_per_step for candidate in members)
    steady_ns = sum(candidate.steady_ns for candidate in members)
    share = context.share_of_steps_less_compiles(steady_ns)
    total_ns = sum(candidate.finding.cost_total_ns for candidate in members)
    per_step = [candidate.finding.cost_per_step_ns for candidate in members]
    return replace(
        first,
        severity=context.severity(share),
        title=(f"Host-to-chip copies of one batch in the loop at {lines} ({len(members)} lines): "
               f"{format_bytes(per_step_bytes)} per step, {plural(round(copies), 'copy', 'copies')} per step"),
        explanation=(f"The lines {lines} each copy a tensor from the host to the chip every step, "
                     f"{plural(len(members), 'copy', 'copies')} of one batch's fields, one after another, "
                     f"{format_bytes(per_step_bytes)} and {format_ns(steady_ns / max(context.steady_count, 1))} per "
                     f"step in all ({context.share_text(share)})."),
        suggestion=BATCH_SUGGESTION,
        cost_total_ns=total_ns,
        cost_per_step_ns=None if any(value is None for value in per_step) else sum(v or 0.0 for v in per_step),
        evidence=tuple(evidence for candidate in members for evidence in candidate.finding.evidence),
    )
