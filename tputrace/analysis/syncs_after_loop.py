"""Host syncs in a loop that runs after the training loop's last step: a decoding loop sampling text from the trained
model (`idx = torch.multinomial(p, 1).item()` per token), an evaluation over a test set. Those lines ran only in the
trailing `end` step, so the loop's per-step view leaves them out; a line that read there several times, each after new
work, waited for the chip once per iteration of its own loop, and is told so with its total stall. Reading a list of
values kept during training (`[loss.item() for loss in losses]`) waits once and is no such loop."""

from __future__ import annotations

import bisect

from tputrace.analysis.collective_joins import join_lines
from tputrace.analysis.context import MIN_LISTED_COST_NS, AnalysisContext
from tputrace.analysis.findings import MEASURED_ON_HOST, Evidence, Finding
from tputrace.wording import format_ns, plural

# Reads of one line after the loop that make a loop of their own, not a result read once or twice at the end.
MIN_READS_AFTER_LOOP = 4


def after_loop_reads(context: AnalysisContext, own: str, stall: str, library: str,
                     in_loop: set[tuple[int | None, str, int | None]]) -> list[tuple[int | None, str, int | None, int, int, int]]:
    """(frame id, kind, library frame id, reads, stall less compiles, pending ops) of each line that read at least
    `MIN_READS_AFTER_LOOP` times after the loop's last step and never in the loop, costliest first."""
    end = context.end_step
    if end is None:
        return []
    rows = context.trace.sql(
        f"SELECT s.frame_id, s.kind, {library}, COUNT(*), COALESCE(SUM({stall}), 0), COALESCE(SUM(s.pending_ops), 0) "
        f"FROM syncs s WHERE s.rank = ? AND s.step = ? AND {own} GROUP BY s.frame_id, s.kind, {library} "
        "HAVING COUNT(*) >= ? ORDER BY 5 DESC",
        (context.rank, end, MIN_READS_AFTER_LOOP),
    )
    shadowing = join_lines(context)  # a rank out of inputs waiting in DDP's `model.join()`: the uneven inputs' finding
    lines = [(frame_id, kind, library_frame_id, count, stall_ns, pending)
             for frame_id, kind, library_frame_id, count, stall_ns, pending in rows
             if (frame_id, kind, library_frame_id) not in in_loop and stall_ns >= MIN_LISTED_COST_NS and frame_id not in shadowing]
    if not lines:
        return []
    sync_starts = [start for (start,) in context.trace.sql(
        "SELECT start_ns FROM syncs WHERE rank = ? AND step = ? ORDER BY start_ns", (context.rank, end))]
    op_starts = [start for (start,) in context.trace.sql(
        "SELECT start_ns FROM ops WHERE rank = ? AND step = ? ORDER BY start_ns", (context.rank, end))]
    return [line for line in lines
            if _reads_after_new_work(context, line[0], line[1], end, sync_starts, op_starts) >= MIN_READS_AFTER_LOOP - 1]


def _reads_after_new_work(context: AnalysisContext, frame_id: int | None, kind: str, end: int,
                          sync_starts: list[int], op_starts: list[int]) -> int:
    """How many of the line's reads after the loop came after ops dispatched since the rank's previous sync: a
    decoding loop's reads each wait for new work, while reading a list of values kept during training
    (`[loss.item() for loss in losses]`) waits once, for the training's last programs."""
    reads = context.trace.sql(
        "SELECT start_ns FROM syncs WHERE rank = ? AND step = ? AND frame_id IS ? AND kind = ?",
        (context.rank, end, frame_id, kind))
    counted = 0
    for (start,) in reads:
        earlier = bisect.bisect_left(sync_starts, start)
        since = sync_starts[earlier - 1] if earlier else -1
        if bisect.bisect_left(op_starts, start) > bisect.bisect_right(op_starts, since):
            counted += 1
    return counted


def after_loop_finding(context: AnalysisContext, analyzer: str, frame_id: int | None, kind: str, count: int,
                       stall_ns: int, pending_ops: int, suggestion: str) -> Finding:
    """The finding for `count` reads of `kind` at `frame_id`'s line after the loop's last step."""
    where = context.where(frame_id)
    share = context.share_of_wall(stall_ns)
    pending = pending_ops / count
    waits_for = (f"forces the {plural(round(pending), 'op')} still pending on average to run" if pending >= 1
                 else "is for programs already queued on the chip")
    return Finding(
        analyzer=analyzer,
        severity=context.severity(share),
        title=f"Host sync {plural(count, 'time')} after the training loop at {where} ({kind}): "
              f"{format_ns(stall_ns)} stalled",
        explanation=(
            f"After the loop's last step, at {where}, the host waited for the chip ({kind} sync) "
            f"{plural(count, 'time')}, {format_ns(stall_ns)} in all ({share:.0%} of the run): the line runs in a loop of "
            f"its own after training (a decoding or evaluation loop) and reads at each of its iterations. Each wait "
            f"{waits_for}, and the host queues no more work meanwhile."
        ),
        suggestion=suggestion,
        cost_total_ns=float(stall_ns),
        cost_per_step_ns=None,
        cost_basis=MEASURED_ON_HOST,
        evidence=(
            context.evidence_at(f"{plural(count, kind + ' sync')} after the last step, "
                                f"{format_ns(stall_ns / count)} stall each", frame_id, table="syncs"),
            Evidence(f"{plural(pending_ops, 'pending op')} forced to run by these syncs", table="syncs"),
        ),
        **context.location_fields(frame_id),
    )
