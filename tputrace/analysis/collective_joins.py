"""Ranks that ran out of inputs inside `Join` (DDP's `with model.join():`): the run ends, because each such rank shadows
the others' collectives from the `with` line (`join` causes) until every rank has joined, but it spends those
iterations waiting on the others instead of training. One finding names the ranks, how many fewer steps they ran, and
the time their shadow calls took; its fix is inputs of one length on every rank."""

from __future__ import annotations

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Evidence, Finding
from tputrace.wording import format_ns, plural

NAME = "collectives"


def join_lines(context: AnalysisContext) -> set[int]:
    """The frames of this rank's `with ... join():` lines, whose shadow loop reads a count of the ranks still running at
    each of its iterations (a wait per iteration that belongs to the uneven inputs, not to a loop of the script's)."""
    if not context.trace.has_table("collective_causes"):
        return set()
    return {frame_id for (frame_id,) in context.trace.sql(
        "SELECT DISTINCT c.frame_id FROM collectives c JOIN collective_causes k ON k.id = c.cause_id "
        "WHERE k.kind = 'join' AND c.rank = ? AND c.frame_id IS NOT NULL", (context.rank,))}


def joined_early(context: AnalysisContext) -> Finding | None:
    """An info finding for the ranks that shadowed others' collectives inside `Join`, at the `with` line."""
    trace = context.trace
    if not trace.has_table("collective_causes"):
        return None
    shadowing = trace.sql(
        "SELECT c.rank, COUNT(*), COALESCE(SUM(c.dur_ns), 0), MIN(k.origin_frame_id) FROM collectives c "
        "JOIN collective_causes k ON k.id = c.cause_id WHERE k.kind = 'join' GROUP BY c.rank ORDER BY c.rank")
    if not shadowing:
        return None
    steps = dict(trace.sql("SELECT rank, COUNT(*) FROM steps WHERE source != 'end' GROUP BY rank"))
    most = max(steps.values(), default=0)
    early = [(rank, calls, dur_ns, frame_id) for rank, calls, dur_ns, frame_id in shadowing if steps.get(rank, 0) < most]
    if not early:
        return None
    frame_id = early[0][3]
    where = context.where(frame_id)
    ranks = ", ".join(str(rank) for rank, *_ in early)
    shadow_ns = max(dur_ns for _, _, dur_ns, _ in early)
    return Finding(
        analyzer=NAME,
        severity="info",
        title=(f"Uneven inputs under Join: rank{'s' if len(early) > 1 else ''} {ranks} ran out of batches before the others and "
               f"shadowed their collectives at {where}"),
        explanation=(
            f"The ranks ran different numbers of steps ({', '.join(f'rank {rank} {count}' for rank, count in sorted(steps.items()))}). "
            f"`Join` kept the run from hanging: once a rank's loop ended, the context's exit at {where} issued the collectives the "
            f"other ranks still issued from the loop ({format_ns(shadow_ns)} of shadow calls on the rank that waited longest): that "
            "rank idled through the others' extra steps, and added zeros to their gradients."
        ),
        suggestion=(
            "Give every rank the same number of batches: a DistributedSampler (drop_last=True, or padding as it does by default) "
            "or each rank's data cut to the smallest rank's count, agreed with one all_reduce(MIN) before the loop. Join then has "
            "nothing to shadow, and can stay as a guard."
        ),
        cost_total_ns=0.0,
        evidence=tuple(Evidence(f"rank {rank}: {plural(steps.get(rank, 0), 'step')}, then {plural(calls, 'shadow call')}, "
                                f"{format_ns(dur_ns)}", table="collectives") for rank, calls, dur_ns, _ in early),
        **context.location_fields(frame_id),
    )
