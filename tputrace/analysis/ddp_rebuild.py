"""Recompiles from DDP rebuilding its gradient buckets once, after the first backward.

DDP first buckets the gradients in the reverse order of the parameters; after the first backward it rebuilds the
buckets in the order the gradients became ready (its forward syncs and broadcasts the new order), and the next
backward writes the gradients into the new buckets at other offsets. The trace shows the rebuild as a `ddp_bucket`
cause of the same bucket index with another parameter list. The programs that ran around it compile again (the step
flushed apart by the rebuild's sync, bucket views at new offsets), once: a cost DDP has in every run, which no
change to the script removes. One finding, at the `DDP(...)` line, accounts for these recompiles; it costs nothing
(a cost is what a change would save), so it ranks below the findings a change can act on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import MEASURED_ON_HOST, Finding
from tputrace.analysis.storms import NAME
from tputrace.wording import format_ns, plural

MAX_LISTED = 4
_SHAPE_CHANGE = re.compile(r"\barg \d+ dim \d+: \d+ -> \d+")  # an input's shape changed: a storm's, not the rebuild's


@dataclass(frozen=True)
class DdpRebuild:
    """The recompiles in the steps from DDP's first rebuilt-bucket step back to the first steady step."""

    where: str  # the DDP(...) line
    buckets: int  # bucket indices whose parameters the rebuild reordered
    recompiles: int
    recompile_ns: int
    steps: tuple[int, ...]


def findings(context: AnalysisContext, leave_out: set[int]) -> list[tuple[Finding, DdpRebuild, set[int]]]:
    """The finding for DDP's bucket rebuild, with the compile ids it explains (`leave_out`: explained elsewhere)."""
    trace, rank = context.trace, context.rank
    if not trace.has_table("collective_causes"):
        return []
    first_list: dict[int, int | None] = {}
    rebuilt: set[int] = set()  # cause ids of buckets whose parameters differ from the index's first
    for cause_id, index, tensors in trace.sql(
        "SELECT id, bucket_index, tensor_sid FROM collective_causes WHERE rank = ? AND kind = 'ddp_bucket' ORDER BY id",
        (rank,),
    ):
        if index not in first_list:
            first_list[index] = tensors
        elif tensors != first_list[index]:
            rebuilt.add(cause_id)
    if not rebuilt:
        return []
    placeholders = ", ".join("?" for _ in rebuilt)
    (last_step,), = trace.sql(f"SELECT MIN(step) FROM collectives WHERE rank = ? AND cause_id IN ({placeholders})",
                              (rank, *sorted(rebuilt)))
    if last_step is None or last_step < 1:
        return []
    rows = [
        (compile_id, trace.string(name_sid) or "?", dur_ns or 0, step, trace.string(diff_sid) or "", frame_id)
        for compile_id, name_sid, dur_ns, step, diff_sid, frame_id in trace.sql(
            "SELECT id, name_sid, dur_ns, step, diff_sid, frame_id FROM compiles WHERE rank = ? AND reason = 'recompile' "
            "AND step BETWEEN 1 AND ? ORDER BY start_ns", (rank, last_step))
        if compile_id not in leave_out
    ]
    rows = [row for row in rows if not _SHAPE_CHANGE.search(row[4])]
    if not rows:
        return []
    (made_at,), = trace.sql("SELECT MIN(origin_frame_id) FROM collective_causes WHERE rank = ? AND kind = 'ddp_init'",
                            (rank,))
    record = DdpRebuild(context.where(made_at), len(rebuilt), len(rows), sum(row[2] for row in rows),
                        tuple(sorted({row[3] for row in rows})))
    evidence = tuple(context.evidence_at(f"step {step}: {name} compiled again, {format_ns(dur_ns)}: {diff[:160]}",
                                         frame_id, table="compiles")
                     for _, name, dur_ns, step, diff, frame_id in rows[:MAX_LISTED])
    steps = " and ".join(str(step) for step in record.steps) if len(record.steps) <= 2 else f"{record.steps[0]}-{record.steps[-1]}"
    finding = Finding(
        analyzer=NAME,
        severity="info",
        title=(f"DDP rebuilt its gradient buckets after the first backward: {plural(record.recompiles, 'recompile')}, "
               f"{format_ns(record.recompile_ns)}, paid once in step{'s' if len(record.steps) > 1 else ''} {steps}"),
        explanation=(
            f"After the first backward, DDP (made at {record.where}) rebuilds its buckets in the order the gradients "
            f"became ready: its next forward syncs to agree on the order, and the next backward writes the gradients "
            f"into {plural(record.buckets, 'bucket')} at new offsets. The programs around it compiled again, "
            f"{plural(record.recompiles, 'recompile')} and {format_ns(record.recompile_ns)} in all, once: the later "
            f"steps reuse them. Every DDP run pays this, and it does not grow with the run's length: no change to the script "
            f"removes it, so the finding costs nothing."
        ),
        suggestion=("Nothing in the script causes it. A compile cache (`tputrace run --compile-cache DIR`) loads these "
                    "programs in a later run instead of compiling them."),
        cost_total_ns=0.0,
        cost_per_step_ns=None,
        cost_basis=MEASURED_ON_HOST,
        evidence=evidence,
        **context.location_fields(made_at),
    )
    return [(finding, record, {row[0] for row in rows})]
