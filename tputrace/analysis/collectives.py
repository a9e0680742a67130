"""Collectives (when the trace has them): how much of a step they take, the bus bandwidth reached
against the target's ICI, many small messages, stragglers, and messages not divisible by the group.

Bus bandwidth is the recorded `bus_bandwidth` (bytes/s) when present, else computed with the usual
ring factor for the kind. Waiting (`wait_ns`) is time a rank spent for the last rank to arrive: the
rank that waits least is the straggler; on virtual chips sharing one host that cannot be told from the
host's scheduling, and the finding says so. Shares count calls in flight together once. Collectives
whose cause is recorded are judged by `tputrace.analysis.sharding`, at the line that decides them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tputrace.analysis.chips import DTYPE_BYTES
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding, Severity
from tputrace.wording import format_bytes, format_ns, plural

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

NAME = "collectives"
SMALL_MESSAGE_BYTES = 1 << 20
MANY_SMALL_PER_STEP = 10
STRAGGLER_WAIT_SHARE = 0.2
LOW_BANDWIDTH_SHARE = 0.25


@dataclass(frozen=True)
class CollectiveKind:
    """The collectives of one kind in the loop: calls, bytes, time, waiting, bus bandwidth (bytes/s)."""

    kind: str
    count: int
    bytes: int
    dur_ns: int
    wait_ns: int
    bus_bandwidth: float | None
    small_messages: int


@dataclass(frozen=True)
class RankWait:
    """A rank's time in collectives and the part of it spent waiting for the last rank."""

    rank: int
    wait_ns: int
    dur_ns: int


@dataclass(frozen=True)
class UnevenCollective:
    """A collective shape whose element count its group size does not divide."""

    kind: str
    elements: int
    group: int
    where: str
    count: int


@dataclass(frozen=True)
class CollectivesData:
    """The trace's collectives (`count`, every rank); the rest is the analysed rank's loop, empty without
    collectives."""

    count: int
    kinds: tuple[CollectiveKind, ...] = ()
    collective_share_of_step: float = 0.0
    small_messages_per_step: float = 0.0
    wait_by_rank: tuple[RankWait, ...] = ()
    not_divisible: tuple[UnevenCollective, ...] = ()


def bus_factor(kind: str, ranks: int) -> float:
    """Bytes each rank moves on the bus per byte of message, for ring algorithms."""
    if ranks <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0


def analyze(context: AnalysisContext) -> AnalysisResult[CollectivesData]:
    trace = context.trace
    (count,) = trace.sql("SELECT COUNT(*) FROM collectives")[0]
    if not count:
        return AnalysisResult(NAME, CollectivesData(count))
    findings: list[Finding] = []
    rank = context.rank
    where, params = context.loop_where()
    kinds = trace.sql(
        "SELECT kind, COUNT(*), COALESCE(SUM(bytes), 0), COALESCE(SUM(dur_ns), 0), COALESCE(SUM(wait_ns), 0), "
        f"AVG(bus_bandwidth), SUM(bytes < ?) FROM collectives WHERE {where} GROUP BY kind ORDER BY 4 DESC",
        (SMALL_MESSAGE_BYTES,) + tuple(params),
    )
    world = max(len(trace.distributed_ranks), 1)
    rows = []
    for kind, calls, nbytes, dur_ns, wait_ns, recorded_bandwidth, small in kinds:
        bandwidth = recorded_bandwidth
        if not bandwidth and dur_ns:
            bandwidth = nbytes * bus_factor(kind, world) / (dur_ns / 1e9)
        rows.append(CollectiveKind(kind, calls, nbytes, dur_ns, wait_ns, bandwidth, small))
    total_ns = sum(row.dur_ns for row in rows)
    steady_where, steady_params = context.steady_where()
    (steady_ns,) = trace.sql(f"SELECT COALESCE(SUM(dur_ns), 0) FROM collectives WHERE {steady_where}", steady_params)[0]
    share = context.share_of_steps(steady_ns)
    top_frame = trace.sql(
        f"SELECT frame_id FROM collectives WHERE {where} GROUP BY frame_id ORDER BY SUM(dur_ns) DESC LIMIT 1", params
    )
    frame_id = top_frame[0][0] if top_frame else None
    ici = context.target.ici_bandwidth
    kind_evidence = tuple(
        Evidence(f"{row.kind}: {plural(row.count, 'call')}, {format_bytes(row.bytes)}, {format_ns(row.dur_ns)}, "
                 f"bus {format_bytes(row.bus_bandwidth or 0)}/s", table="collectives")
        for row in rows
    )
    if share >= 0.05:
        bandwidths = [row.bus_bandwidth for row in rows if row.bus_bandwidth]
        median_bandwidth = statistics.median(bandwidths) if bandwidths else 0.0
        findings.append(Finding(
            analyzer=NAME,
            severity=context.severity(share, warning=0.15, critical=0.4),
            title=f"Collectives{' without a recorded cause' if caused else ''} take {share:.0%} of each step on rank {rank}",
            explanation=(
                f"Rank {rank} spent {format_ns(total_ns)} in collectives" + (" that no recorded cause explains (see the sharding findings for the rest)" if caused else "")
                + ". Their bus bandwidth "
                f"(median {format_bytes(median_bandwidth)}/s) compares with {context.target.label}'s ICI of "
                f"{format_bytes(ici)}/s per chip (bidirectional)."
            ),
            suggestion=(
                "Overlap communication with compute (DDP buckets overlap the backward pass; FSDP prefetches), "
                "communicate in bfloat16, or reduce how often gradients are synchronised (gradient accumulation "
                "with `no_sync`)."
            ),
            cost_total_ns=float(total_ns),
            cost_per_step_ns=context.per_step(total_ns),
            evidence=kind_evidence,
            **context.location_fields(frame_id),
        ))
    small = sum(row.small_messages for row in rows)
    small_per_step = small / max(context.step_count, 1)
    if small_per_step >= MANY_SMALL_PER_STEP:
        (small_ns,) = trace.sql(
            f"SELECT COALESCE(SUM(dur_ns), 0) FROM collectives WHERE {where} AND bytes < ?",
            tuple(params) + (SMALL_MESSAGE_BYTES,),
        )[0]
        findings.append(Finding(
            analyzer=NAME,
            severity="warning" if context.share_of_wall(small_ns) >= 0.05 else "info",
            title=f"Many small collectives: {small_per_step:.0f} messages under {format_bytes(SMALL_MESSAGE_BYTES)} per step",
            explanation=(
                f"{small} collectives moved less than {format_bytes(SMALL_MESSAGE_BYTES)} each, taking "
                f"{format_ns(small_ns)}; small messages are dominated by latency, not bandwidth."
            ),
            suggestion="Bucket them: a larger DDP `bucket_cap_mb`, or flatten small tensors into one before reducing.",
            cost_total_ns=float(small_ns),
            cost_per_step_ns=context.per_step(small_ns),
            evidence=kind_evidence,
        ))
    wait_by_rank, straggler = _stragglers(context)
    not_divisible, uneven = _divisibility(context, where, params)
    findings.extend(finding for finding in (straggler, uneven) if finding is not None)
    data = CollectivesData(count, tuple(rows), share, small_per_step, wait_by_rank, not_divisible)
    return AnalysisResult(NAME, data, tuple(findings))


def _stragglers(context: AnalysisContext) -> tuple[tuple[RankWait, ...], Finding | None]:
    """Every rank's waiting, and a finding when the other ranks wait long for one of them."""
    trace = context.trace
    per_rank = trace.sql(
        "SELECT rank, COALESCE(SUM(wait_ns), 0), COALESCE(SUM(dur_ns), 0) FROM collectives GROUP BY rank ORDER BY rank"
    )
    wait_by_rank = tuple(RankWait(rank, wait, dur) for rank, wait, dur in per_rank)
    if len(per_rank) < 2:
        return wait_by_rank, None
    waits = {rank: wait for rank, wait, _ in per_rank}
    durations = {rank: dur for rank, _, dur in per_rank}
    straggler = min(waits, key=lambda rank: waits[rank])
    others = [rank for rank in waits if rank != straggler]
    waited = statistics.mean(waits[rank] for rank in others)
    share = waited / statistics.mean(durations[rank] for rank in others) if others else 0.0
    if share < STRAGGLER_WAIT_SHARE:
        return wait_by_rank, None
    severity: Severity = "warning" if context.share_of_wall(waited) >= 0.05 else "info"
    return wait_by_rank, Finding(
        analyzer=NAME,
        severity=severity,
        title=f"Straggler: rank {straggler} arrives last; other ranks wait {format_ns(waited)} on average",
        explanation=(
            f"Ranks other than {straggler} spent {share:.0%} of their collective time waiting for the last rank to "
            f"arrive; rank {straggler} waited least, was last in {consistent:.0%} of the steps, and spent {format_ns(excess_idle)} more than "
            "the others outside anything the trace records (host work of its own)"
            + (", so it is the late one." if consistent >= 0.5 else ": the late rank changes from step to step, which points at noise more than at one rank's work.")
        )
        suggestion = (
            f"Look at what rank {straggler} does before its collectives (uneven data loading, extra logging or "
            "evaluation on that rank, uneven shards)."
        )
    result.findings.append(Finding(
        analyzer=NAME,
        severity=severity,
        title=title,
        explanation=explanation,
        suggestion=suggestion,
        cost_total_ns=cost,
        cost_per_step_ns=context.per_step(cost),
        evidence=tuple(Evidence(f"rank {rank} waited {format_ns(waits[rank])}", table="collectives") for rank in sorted(waits)),
    )


def _divisibility(context: AnalysisContext, where: str,
                  params: Sequence[int]) -> tuple[tuple[UnevenCollective, ...], Finding | None]:
    """Messages whose element count is not a multiple of the group size need padding to shard."""
    trace = context.trace
    rows = trace.sql(
        f"SELECT kind, bytes, dtype, ranks_sid, frame_id, COUNT(*) FROM collectives WHERE {where} "
        "AND kind IN ('all_gather', 'reduce_scatter', 'all_to_all') GROUP BY kind, bytes, dtype, ranks_sid, frame_id",
        params,
    )
    uneven = []
    for kind, nbytes, dtype, ranks_sid, frame_id, calls in rows:
        group = len([part for part in (trace.string(ranks_sid) or "").split(",") if part.strip()])
        size = DTYPE_BYTES.get(dtype or "f32", 4)
        elements = (nbytes or 0) // size
        if group > 1 and elements % group:
            uneven.append((kind, elements, group, frame_id, calls))
    not_divisible = tuple(
        UnevenCollective(kind, elements, group, context.where(frame_id), calls)
        for kind, elements, group, frame_id, calls in uneven
    )
    if not uneven:
        return not_divisible, None
    kind, elements, group, frame_id, calls = uneven[0]
    return not_divisible, Finding(
        analyzer=NAME,
        severity="info",
        title=f"{kind} of {elements} elements is not divisible by its group of {group} ranks",
        explanation=(
            f"{len(uneven)} collective shapes have an element count that the group size does not divide, so each "
            "is padded (or split unevenly) before it is sharded."
        ),
        suggestion=f"Make the sharded dim a multiple of {group} (pad the parameter or choose the mesh size to divide it).",
        cost_total_ns=0.0,
        evidence=tuple(
            context.evidence_at(f"{k}: {e} elements over {plural(g, 'rank')} ({plural(c, 'call')})", f, table="collectives")
            for k, e, g, f, c in uneven[:5]
        ),
        **context.location_fields(frame_id),
    )
