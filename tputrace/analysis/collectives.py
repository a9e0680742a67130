"""Collectives (when the trace has them): how much of a step they take, the bus bandwidth reached
against the target's ICI, many small messages, stragglers (`collective_stragglers`), messages not
divisible by the group, and ranks that issue a group's collectives out of step (`collective_order`).

Bus bandwidth is the recorded `bus_bandwidth` (bytes/s) when present, else computed with the usual
ring factor for the kind. Waiting (`wait_ns`) is time a rank spent for the last rank to arrive: the
rank that waits least is the straggler; on virtual chips sharing one host that cannot be told from the
host's scheduling unless the late rank spends the time outside anything recorded, and the finding says
so. Shares count calls in flight together once. Collectives whose cause is recorded are judged by
`tputrace.analysis.sharding`, at the line that decides them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tputrace.dtypes import DTYPE_BYTES
from tputrace.analysis.collective_fixes import share_fix, small_fix
from tputrace.analysis.collective_joins import joined_early
from tputrace.analysis.collective_order import OutOfStep, out_of_step
from tputrace.analysis.collective_shares import device_step_time_ns, step_share
from tputrace.analysis.collective_waits import early_read_findings, unwaited_findings
from tputrace.analysis.collective_stragglers import RankWait, Straggler, has_causes, stragglers
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding
from tputrace.analysis.imported import context_import_facts
from tputrace.derived.imported_sources import imported_source
from tputrace.store.aggregates import merged_ns
from tputrace.wording import format_bytes, format_ns, plural

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

NAME = "collectives"
SMALL_MESSAGE_BYTES = 1 << 20
MANY_SMALL_PER_STEP = 10
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
    bytes_known: bool = True  # False where the capture has no bytes for them (an import: XLA:CPU, no record_shapes)


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
    straggler: Straggler | None = None
    out_of_step: OutOfStep | None = None  # the first collective the ranks of a group issued out of step


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
    order, order_finding = out_of_step(context)
    # From a call the ranks issued out of step on, this rank's calls paired with the wrong ones, failed or hung: their
    # time is the out-of-step finding's, not a cost of communicating, and the fixes for it here do not apply.
    paired_until = order.since_ns(rank) if order is not None else None
    cut = (" AND start_ns < ?", (paired_until,)) if paired_until is not None else ("", ())
    where, params = context.loop_where()
    where, params = where + cut[0], tuple(params) + cut[1]
    # An imported rank's capture names the run's size (`distributedInfo.world_size`) where the trace holds fewer ranks.
    world = max(len(trace.distributed_ranks), _imported_world_size(context), 1)
    rows = _kind_rows(trace, where, params, world)
    steady_where, steady_params = context.steady_where()
    steady_where, steady_params = steady_where + cut[0], tuple(steady_params) + cut[1]
    # Calls in flight together (DDP's buckets, a prefetch) and a call's wait for the last rank are counted
    # once: the share is the union of the calls' intervals, which never exceeds the steps' time.
    total_ns = merged_ns(_intervals(trace, where, params))
    # With asynchronous dispatch a step's device work (its collectives among it) runs after the host's step has ended:
    # the share is of what the device did in the step, not of the host's shorter step.
    device_steps_ns = device_step_time_ns(context, steady_where, steady_params)
    share = min(step_share(context, merged_ns(_intervals(trace, steady_where, steady_params)), device_steps_ns), 1.0)
    caused = has_causes(trace)
    finding_share = share
    if caused:
        # the sharding analyzer names the cause and the line of the caused calls; this finding counts the rest
        total_ns = merged_ns(_intervals(trace, f"{where} AND cause_id IS NULL", params))
        finding_share = min(step_share(context, merged_ns(_intervals(
            trace, f"{steady_where} AND cause_id IS NULL", steady_params)), device_steps_ns), 1.0)
    # of the calls the finding counts (with causes recorded, a DDP bucket's line is the sharding finding's), in the steady
    # steps as its share and fix are: a set-up call that waited for the other ranks to start is in the first step only
    uncaused = " AND cause_id IS NULL" if caused else ""
    top_frame = next((rows for rows in (
        trace.sql(f"SELECT frame_id FROM collectives WHERE {clause}{uncaused} GROUP BY frame_id ORDER BY SUM(dur_ns) DESC LIMIT 1", values)
        for clause, values in ((steady_where, steady_params), (where, params))) if rows), [])
    frame_id = top_frame[0][0] if top_frame else None
    ici = context.target.ici_bandwidth
    facts = context_import_facts(context)
    foreign_device = facts.device if facts is not None and facts.device != "tpu" else None
    # An XProf capture's collectives are each chip's ops: one rank's rows hold all of its chips' calls.
    chips = (trace.run.chips or 1) if facts is not None and facts.format == "xplane" else 1
    # the calls the findings count: with causes recorded, those without one (a DDP bucket's are the sharding findings')
    counted = _kind_rows(trace, f"{where} AND cause_id IS NULL", params, world) if caused else rows
    if chips == 1:  # each kind's time with a call in flight, as the lines' (asynchronous calls overlap)
        counted = [replace(row, dur_ns=merged_ns(_intervals(trace, f"{where}{uncaused} AND kind = ?", (*params, row.kind))))
                   for row in counted]
    kind_evidence = _kind_evidence(counted)
    line_evidence = _line_evidence(context, steady_where, steady_params, caused, chips)
    step_basis = "the device's time in each step" if device_steps_ns else "each step"
    if finding_share >= 0.05 and total_ns:
        bandwidths = [row.bus_bandwidth for row in counted if row.bus_bandwidth]
        median_bandwidth = statistics.median(bandwidths) if bandwidths else 0.0
        findings.append(Finding(
            analyzer=NAME,
            severity=context.severity(finding_share, warning=0.15, critical=0.4),
            title=(f"Collectives{' without a recorded cause' if caused else ''} take {finding_share:.0%} of "
                   f"{step_basis if context.steps else 'the run'} on rank {rank}"),
            explanation=(
                f"Rank {rank} spent {format_ns(total_ns)} in collectives"
                + (f" (the share is of the device's time in the steady steps, {format_ns(device_steps_ns / context.steady_count)} "
                   f"a step from each step's first device op to its last, which ran on after the host's steps of "
                   f"{format_ns(context.steady_ns / context.steady_count)} had ended: the host does not wait for each step)"
                   if device_steps_ns and context.steady_count else "")
                + (" that no recorded cause explains (see the sharding findings for the rest)" if caused else "")
                + (f" (while any of its {chips} chips was in one; the calls and times by line and kind below are its "
                   f"{chips} chips' together)" if chips > 1 else "")
                + ". " + _bandwidth_text(median_bandwidth, bandwidths, foreign_device, context.target.label, ici)
            ),
            suggestion=share_fix(context, f"{steady_where}{' AND cause_id IS NULL' if caused else ''}", steady_params),
            cost_total_ns=float(total_ns),
            cost_per_step_ns=context.per_step(total_ns),
            evidence=line_evidence + kind_evidence,
            **context.location_fields(frame_id),
        ))
    small = sum(row.small_messages for row in rows)
    if caused:  # DDP buckets and FSDP2 groups are judged, at their constructor line, by the sharding analyzer
        (small,) = trace.sql(f"SELECT COUNT(*) FROM collectives WHERE {where} AND bytes < ? AND cause_id IS NULL",
                             tuple(params) + (SMALL_MESSAGE_BYTES,))[0]
    # A run without steps (a loop with no optimizer step: an optimizer by hand, inference) is judged per iteration too, its
    # calls of one line and size taken as one an iteration: a flattened buffer reduced each iteration is no storm.
    small_per_step = float(small if context.steps else trace.sql(
        f"SELECT COUNT(*) FROM (SELECT DISTINCT kind, frame_id, bytes FROM collectives WHERE {where} AND bytes < ?{uncaused})",
        tuple(params) + (SMALL_MESSAGE_BYTES,))[0][0])
    if context.steps and context.steady_count:
        # per steady step, as the lines' calls are: a loop's calls after its optimizer step fall in the next step, so the
        # loop's steps hold one iteration's fewer of them than there are steps
        (steady_small,) = trace.sql(f"SELECT COUNT(*) FROM collectives WHERE {steady_where} AND bytes < ?"
                                    + (" AND cause_id IS NULL" if caused else ""), tuple(steady_params) + (SMALL_MESSAGE_BYTES,))[0]
        small_per_step = steady_small / context.steady_count
    if small_per_step >= MANY_SMALL_PER_STEP:
        small_where = f"{where} AND bytes < ?" + (" AND cause_id IS NULL" if caused else "")
        small_ns = merged_ns(_intervals(trace, small_where, tuple(params) + (SMALL_MESSAGE_BYTES,)))
        # at the line that sends the most of them, as the fix names it
        most = trace.sql(f"SELECT frame_id FROM collectives WHERE {small_where} GROUP BY frame_id ORDER BY COUNT(*) DESC, "
                         "SUM(dur_ns) DESC LIMIT 1", tuple(params) + (SMALL_MESSAGE_BYTES,))
        findings.append(Finding(
            analyzer=NAME,
            severity="warning" if context.share_of_wall(small_ns) >= 0.05 else "info",
            title=(f"Many small collectives: {small_per_step:.0f} messages under {format_bytes(SMALL_MESSAGE_BYTES)} per step" if context.steps
                   else f"Many small collectives: {small} messages under {format_bytes(SMALL_MESSAGE_BYTES)} in the run"),
            explanation=(
                f"{small} collectives moved less than {format_bytes(SMALL_MESSAGE_BYTES)} each, taking "
                f"{format_ns(small_ns)}; small messages are dominated by latency, not bandwidth."
            ),
            suggestion=small_fix(context, small_where, tuple(params) + (SMALL_MESSAGE_BYTES,)),
            cost_total_ns=float(small_ns),
            cost_per_step_ns=context.per_step(small_ns),
            evidence=line_evidence + kind_evidence,
            **context.location_fields(most[0][0] if most else None),
        ))
    wait_by_rank, late, straggler = stragglers(context)
    not_divisible, uneven = _divisibility(context, where, params)
    findings.extend(finding for finding in (order_finding, straggler, uneven, joined_early(context)) if finding is not None)
    findings.extend(unwaited_findings(context) + early_read_findings(context))
    data = CollectivesData(count, tuple(rows), share, small_per_step, wait_by_rank, not_divisible, late, order)
    return AnalysisResult(NAME, data, tuple(findings))


def _kind_rows(trace: Trace, where: str, params: Sequence[int], world: int) -> list[CollectiveKind]:
    """The collectives matching `where`, by kind, most time first."""
    rows = []
    for kind, calls, nbytes, dur_ns, wait_ns, recorded_bandwidth, small in trace.sql(
            "SELECT kind, COUNT(*), SUM(bytes), COALESCE(SUM(dur_ns), 0), COALESCE(SUM(wait_ns), 0), "
            f"AVG(bus_bandwidth), COALESCE(SUM(bytes < ?), 0) FROM collectives WHERE {where} GROUP BY kind ORDER BY 4 DESC",
            (SMALL_MESSAGE_BYTES,) + tuple(params)):
        bandwidth = recorded_bandwidth
        if not bandwidth and dur_ns and nbytes is not None:  # an imported capture may not know the bytes
            # unknown, not 0 B/s, where the group's size is (one rank's capture that names no world size)
            bandwidth = nbytes * bus_factor(kind, world) / (dur_ns / 1e9) if world > 1 else None
        rows.append(CollectiveKind(kind, calls, nbytes or 0, dur_ns, wait_ns, bandwidth, small, nbytes is not None))
    return rows


def _kind_evidence(rows: Sequence[CollectiveKind]) -> tuple[Evidence, ...]:
    return tuple(
        Evidence(f"{row.kind}: {plural(row.count, 'call')}, {format_ns(row.dur_ns)}, "
                 + (f"{format_bytes(row.bytes)}, bus "
                    + (f"{format_bytes(row.bus_bandwidth)}/s" if row.bus_bandwidth is not None else "unknown")
                    if row.bytes_known else "bytes unknown"), table="collectives")
        for row in rows
    )


def _line_evidence(context: AnalysisContext, where: str, params: Sequence[int], caused: bool, chips: int,
                   limit: int = 4) -> tuple[Evidence, ...]:
    """The steady steps' collectives by kind and line (those without a recorded cause when the trace records causes),
    most time first: calls and bytes per step, so that a call made once per tensor (a loop of broadcasts) shows. A line's
    time is the time one of its calls was in flight: asynchronous calls (`async_op=True`) overlap, and each one's
    duration holds its wait behind those issued before it (an XProf capture's chips' calls are summed)."""
    steps = max(context.steady_count, 1) if context.steps else 1
    where = where + (" AND cause_id IS NULL" if caused else "")
    rows = context.trace.sql(f"SELECT kind, frame_id, COUNT(*), SUM(bytes), COALESCE(SUM(dur_ns), 0) FROM collectives WHERE {where} "
                             "GROUP BY kind, frame_id ORDER BY 5 DESC LIMIT ?", tuple(params) + (limit,))
    if chips == 1:
        rows = [(kind, frame_id, calls, nbytes, merged_ns(_intervals(context.trace, f"{where} AND kind = ? AND frame_id IS ?",
                                                                         (*params, kind, frame_id))))
                for kind, frame_id, calls, nbytes, _ in rows]
    per = " a step" if context.steps else ""
    return tuple(
        context.evidence_at(f"{kind}, {calls / steps:.3g} call{'' if calls == steps else 's'}{per}: "
                            f"{'bytes unknown' if nbytes is None else format_bytes(nbytes / steps) + per}, {format_ns(dur_ns / steps)}{per}",
                            frame_id, table="collectives")
        for kind, frame_id, calls, nbytes, dur_ns in rows
    )


def _bandwidth_text(median: float, bandwidths: list[float], device: str | None, target: str, ici: float) -> str:
    """What the collectives' bus bandwidth says: beside the target's ICI for a TPU run; for a capture made on
    another device (a CPU's gloo, a GPU's NCCL), that it is that device's link, measured there."""
    if device is None:
        return (f"Their bus bandwidth (median {format_bytes(median)}/s) compares with {target}'s ICI of "
                f"{format_bytes(ici)}/s per chip (bidirectional).")
    if not bandwidths:
        return f"Their times were measured on the capture's {device}; it has no bytes and group sizes to give their bandwidth."
    return (f"Their times and bus bandwidth (median {format_bytes(median)}/s) were measured on the capture's {device} "
            "and its interconnect, not a TPU's ICI: they say how this run spent its time, not what a TPU's would.")


def _intervals(trace: Trace, where: str, params: Sequence[object]) -> list[tuple[int, int]]:
    return [(start, start + (dur or 0)) for start, dur in trace.sql(f"SELECT start_ns, dur_ns FROM collectives WHERE {where} ORDER BY start_ns", params)]




def _divisibility(context: AnalysisContext, where: str,
                  params: Sequence[int]) -> tuple[tuple[UnevenCollective, ...], Finding | None]:
    """Messages whose element count is not a multiple of the group size need padding to shard; an all-gather of pieces
    the ranks chose of different sizes (`algorithm` `...:uneven`) is left out."""
    trace = context.trace
    rows = trace.sql(
        f"SELECT kind, bytes, dtype, ranks_sid, frame_id, COUNT(*) FROM collectives WHERE {where} "
        "AND kind IN ('all_gather', 'reduce_scatter', 'all_to_all') AND COALESCE(algorithm, '') NOT LIKE '%:uneven' "
        "GROUP BY kind, bytes, dtype, ranks_sid, frame_id",
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


def _imported_world_size(context: AnalysisContext) -> int:
    """The world size an imported rank's capture names (0 where none)."""
    if context_import_facts(context) is None:
        return 0
    size = (imported_source(context.trace, context.rank) or {}).get("distributed_world_size")
    return size if isinstance(size, int) else 0
