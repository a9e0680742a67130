"""Sharding: from each collective's recorded cause to the line that decides it and the change that
removes or shrinks it.

The tensor-parallel plan checks are in `sharding_plans` (activation gathers between column-parallel
layers, ops that redistribute an operand, round trips, partial sums reduced again, parameters outside
the plan); this module runs them and checks the rest:

- FSDP2 outer groups (with fully_shard calls inside) that hold a module as large as the inner groups
  but not wrapped on its own: its parameters are gathered with the outer group's, in one message
  that cannot overlap its own compute. Cost: that module's share
  of the group's all-gather and reduce-scatter time.
- FSDP2 groups of one layer each, in modules without a group of their own (`sharding_fsdp`).
- DDP buckets far below the default cap: many latency-bound all-reduces per step, at the `DDP(...)` line.
  Cost: the buckets' time in the median step (their union), times the share of the calls a larger cap
  saves, over the loop's steps.
- Parameters the optimizer updates that no data-parallel wrapper holds (`sharding_unsynced`).
- A run that ended in DTensor's sharding propagation error, read from the error (`sharding_failures`).
- Replicated parameters (DDP) that FSDP2 would split: bytes per rank saved, against the target's HBM.
- Uneven shards: a sharded dim not divisible by its mesh dim (padded all-gathers, uneven memory).
- Exposed communication per step: collective time during which no program ran on the chip, as distinct
  from time overlapped with compute.

Estimated times on the target use its ICI bandwidth: bytes x ring factor / ICI (`ici_estimate_ns`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from tputrace.analysis import sharding_ddp, sharding_failures, sharding_fsdp, sharding_outputs, sharding_plans, sharding_unsynced
from tputrace.analysis.collective_overlap import overlap_advice
from tputrace.analysis.collective_stragglers import shared_host
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding
from tputrace.analysis.library_set_up import one_off_collective
from tputrace.analysis.sharding_common import (
    NAME, Collected, TimeByCause, evidence, ici_estimate_ns, location, per_step, in_steady_steps,
)
from tputrace.store.aggregates import merged_intervals, merged_ns
from tputrace.store.records import CollectiveCauseRecord, ParameterPlacementRecord, SourceLocation
from tputrace.store.sharding import CausedCollective, ShardingRecords, read_sharding
from tputrace.wording import format_bytes, format_ns, plural

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
SMALL_BUCKETS_PER_STEP = 4
UNWRAPPED_SHARE = 0.25
UNWRAPPED_MIN_BYTES = 1 << 20
REPLICATED_HBM_SHARE = 0.25
MAX_BUCKETS_SHOWN = 6


@dataclass(frozen=True)
class MeshRow:
    id: int
    shape: str | None
    dim_names: str | None


@dataclass(frozen=True)
class CauseTime:
    """The collectives of one recorded cause in the steady steps: calls and summed duration."""

    kind: str | None
    module: str | None
    op: str | None
    phase: str | None
    count: int
    dur_ns: float


@dataclass(frozen=True)
class UnevenShard:
    parameter: str | None
    dim: int
    mesh: int


@dataclass(frozen=True)
class ShardingData:
    """The analysed rank's meshes, parameters (count and bytes held), time by cause, and communication per
    steady step: in all (calls in flight together once), exposed (no program running) and overlapped."""

    meshes: tuple[MeshRow, ...] = ()
    parameters: int = 0
    bytes_per_rank: int = 0
    by_cause: tuple[CauseTime, ...] = ()
    ddp_buckets_per_step: float = 0.0
    replicated_bytes: int = 0
    uneven_shards: tuple[UnevenShard, ...] = ()
    communication_per_step_ns: float = 0.0
    exposed_per_step_ns: float = 0.0
    overlapped_per_step_ns: float = 0.0
    compute_per_step_ns: float = 0.0



def analyze(context: AnalysisContext) -> AnalysisResult[ShardingData]:
    records = read_sharding(context.trace, context.rank)
    by_cause = _time_by_cause(context, records)
    out = Collected()
    out.data["meshes"] = tuple(MeshRow(mesh.id, mesh.shape, mesh.dim_names) for mesh in records.meshes.values())
    out.data["parameters"] = len(records.parameters)
    out.data["bytes_per_rank"] = sum(parameter.bytes_per_rank or 0 for parameter in records.parameters)
    out.data["by_cause"] = tuple(
        CauseTime(cause.kind, cause.module, cause.op, cause.phase, count, dur)
        for cause_id, (count, dur, _) in sorted(by_cause.items(), key=lambda item: -item[1][1])
        if (cause := records.causes.get(cause_id)) is not None
    )
    world = max(len(context.trace.distributed_ranks), 1)
    explained_ns = 0.0
    explained_ns += sharding_plans.activation_gathers(context, out, records, by_cause, world)
    explained_ns += sharding_outputs.output_gathers(context, out, records, by_cause, world)
    first_reductions = sharding_plans.first_reductions(records)
    explained_ns += sharding_plans.reduced_again(context, out, records, world, first_reductions)
    explained_ns += sharding_plans.op_redistributions(context, out, records, world, first_reductions)
    explained_ns += sharding_plans.round_trips(context, out, records, world)
    explained_ns += sharding_plans.explicit_gathers(context, out, records, world)
    sharding_plans.unplanned_parameters(context, out, records)
    explained_ns += _unwrapped_modules(context, out, records, by_cause)
    explained_ns += sharding_fsdp.leaf_groups(context, out, records)
    explained_ns += sharding_ddp.accumulation_without_no_sync(context, out, records, world)
    explained_ns += sharding_ddp.buffers_broadcast_each_forward(context, out, records)
    sharding_ddp.unused_parameters(context, out, records)
    sharding_unsynced.unsynced_parameters(context, out, records)
    sharding_failures.propagation_failures(context, out)
    explained_ns += _small_buckets(context, out, records, by_cause, world)
    _replicated_parameters(context, out, records, world)
    _uneven_shards(context, out, records)
    _exposed(context, out, records, explained_ns)
    return AnalysisResult(NAME, ShardingData(**out.data), tuple(out.findings))


def _time_by_cause(context: AnalysisContext, records: ShardingRecords) -> TimeByCause:
    """Per cause id: calls and summed duration in the steady steps, and bytes per call."""
    totals: dict[int, list[float]] = defaultdict(lambda: [0, 0.0, 0])
    for collective in records.collectives:
        if collective.cause_id is None or not in_steady_steps(context, collective):
            continue
        entry = totals[collective.cause_id]
        entry[0] += 1
        entry[1] += collective.dur_ns
        entry[2] = collective.bytes
    return {cause_id: (int(count), dur, int(nbytes)) for cause_id, (count, dur, nbytes) in totals.items()}




# ----------------------------------------------------------------- FSDP2 wrapping
def _unwrapped_modules(context: AnalysisContext, out: Collected, records: ShardingRecords,
                       by_cause: TimeByCause) -> float:
    """FSDP2 groups whose parameters are mostly one submodule that has no fully_shard of its own."""
    groups: dict[str, list[ParameterPlacementRecord]] = defaultdict(list)
    for parameter in records.parameters:
        if parameter.wrapper in ("fsdp", "fsdp+tp") and parameter.group:
            groups[parameter.group].append(parameter)
    group_bytes_by_path = {group: sum(parameter.bytes or 0 for parameter in parameters) for group, parameters in groups.items()}
    explained = 0.0
    for group, parameters in groups.items():
        # only an outer group (one with fully_shard calls inside it) holds what the calls inside left out
        inner = [size for path, size in group_bytes_by_path.items() if path.startswith(group + ".")]
        if not inner:
            continue
        inner_median = statistics.median(inner)
        group_bytes = group_bytes_by_path[group]
        children: dict[str, int] = defaultdict(int)
        for parameter in parameters:
            rest = (parameter.module or "").removeprefix(group + ".") if (parameter.module or "").startswith(group + ".") else ""
            if rest:
                children[f"{group}.{rest.split('.')[0]}"] += parameter.bytes or 0
        if not children:
            continue
        child, child_bytes = max(children.items(), key=lambda item: item[1])
        if child_bytes < UNWRAPPED_MIN_BYTES or child_bytes < UNWRAPPED_SHARE * group_bytes or child_bytes < 0.5 * inner_median:
            continue
        group_ns = sum(dur for cause_id, (_, dur, _) in by_cause.items()
                       if (cause := records.causes.get(cause_id)) is not None and (cause.kind or "").startswith("fsdp_") and cause.module == group)
        steady_ns = group_ns * child_bytes / group_bytes if group_bytes else 0.0
        cost = per_step(context, steady_ns)
        explained += cost["cost_total_ns"] or 0.0
        origin = parameters[0].origin
        attribute = child.removeprefix(group.split(".")[0] + ".")
        out.findings.append(Finding(
            analyzer=NAME,
            severity="warning" if child_bytes >= inner_median or context.share_of_steps(steady_ns) >= 0.05 else "info",
            title=f"FSDP2: {child} ({format_bytes(child_bytes)}) has no fully_shard of its own; it is gathered with {group}",
            explanation=(
                f"{child} holds {child_bytes / group_bytes:.0%} of the {format_bytes(group_bytes)} that {group}'s fully_shard groups "
                f"(the fully_shard calls inside {group} hold {format_bytes(inner_median)} each, median), so its "
                f"parameters are all-gathered and reduce-scattered with the rest of {group} in one message that cannot overlap with "
                f"{child}'s own compute, and stay unsharded while any of {group} runs."
            ),
            suggestion=f"Call `fully_shard(model.{attribute})` before this `fully_shard(...)`, so that {child} is gathered just before it runs.",
            evidence=(Evidence(f"{group}: {format_bytes(group_bytes)} in one group; {child}: {format_bytes(child_bytes)}", file=origin.file if origin else None,
                               line=origin.line if origin else None, module=child, table="parameter_placements"),),
            module=child,
            **cost,
            **location(origin),
        ))
    return explained


# ----------------------------------------------------------------- DDP buckets and replication
def _small_buckets(context: AnalysisContext, out: Collected, records: ShardingRecords,
                   by_cause: TimeByCause, world: int) -> float:
    buckets = [(records.causes[cause_id], count, dur, nbytes) for cause_id, (count, dur, nbytes) in by_cause.items()
               if cause_id in records.causes and records.causes[cause_id].kind == "ddp_bucket"]
    if not buckets:
        return 0.0
    steps = max(context.steady_count, 1)
    calls = sum(count for _, count, _, _ in buckets)
    per_step_calls = calls / steps
    cap = buckets[0][0].bucket_bytes or 0
    bucket_calls = [collective for collective in records.collectives
                    if collective.cause_id in records.causes and records.causes[collective.cause_id].kind == "ddp_bucket" and in_steady_steps(context, collective)]
    # with gradient accumulation without no_sync every backward reduces every bucket: count one backward's buckets
    passes = sharding_ddp.backward_passes(records, bucket_calls)
    per_step_calls /= passes
    gradient_bytes = sum(collective.bytes for collective in bucket_calls) / steps / passes
    # buckets are in flight together: their time is the union of their intervals, per step (the median step's:
    # a step that rebuilt DDP's buckets or compiled is not a typical one)
    by_step: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for call in bucket_calls:
        by_step[call.step].append((call.start_ns, call.start_ns + call.dur_ns))
    bucket_ns = statistics.median(merged_ns(sorted(spans)) for spans in by_step.values()) / passes if by_step else 0.0
    out.data["ddp_buckets_per_step"] = per_step_calls
    if per_step_calls <= SMALL_BUCKETS_PER_STEP or cap >= DEFAULT_BUCKET_BYTES:
        return 0.0
    suggested_mb = 25 if gradient_bytes >= 4 * DEFAULT_BUCKET_BYTES else max(1, math.ceil(gradient_bytes / SMALL_BUCKETS_PER_STEP / 2**20))
    new_calls = max(1, math.ceil(gradient_bytes / (suggested_mb * 2**20)))
    # latency-bound messages: the time goes per call, so fewer calls take that share of it
    saved_per_step = bucket_ns * max(per_step_calls - new_calls, 0) / per_step_calls
    cost = per_step(context, saved_per_step * steps)
    origin = buckets[0][0].origin
    unit = "step" if passes == 1 else "backward pass"
    out.findings.append(Finding(
        analyzer=NAME,
        severity=context.severity(context.share_of_steps(saved_per_step * steps), warning=0.02, critical=0.2),
        title=f"DDP buckets of {format_bytes(cap)}: {per_step_calls:.0f} gradient all-reduces per {unit}",
        explanation=(
            f"DDP's bucket cap is {format_bytes(cap)} (bucket_cap_mb={cap / 2**20:.3g}), so the {format_bytes(gradient_bytes)} of gradients "
            f"go out as {per_step_calls:.0f} messages a {unit}, each paying the collective's fixed latency ({format_ns(bucket_ns)} a {unit} "
            f"here, calls in flight together counted once); on {context.target.label} most of each small message's time is latency, "
            f"not ICI bandwidth ({format_ns(ici_estimate_ns('all_reduce', gradient_bytes, world, context.target.ici_bandwidth))} a {unit})."
        ),
        suggestion=(
            f"Construct DDP with `bucket_cap_mb={suggested_mb}` (about {plural(new_calls, 'bucket')} a {unit}"
            + ("; the default of 25 keeps early buckets overlapping the backward" if suggested_mb == 25 else "") + ")."
        ),
        evidence=(evidence(f"{plural(calls, 'bucket all-reduce')} in {plural(steps, 'steady step')}, cap {format_bytes(cap)}", origin, buckets[0][0].module),)
        + _bucket_evidence(buckets, origin),
        module=buckets[0][0].module,
        **cost,
        **location(origin),
    ))
    return cost["cost_total_ns"] or 0.0


def _bucket_evidence(buckets: list[tuple[CollectiveCauseRecord, int, float, int]], origin: SourceLocation | None) -> tuple[Evidence, ...]:
    """One line per bucket (in reduction order, the first few): its size and the parameters in it."""
    by_index: dict[int, tuple[CollectiveCauseRecord, int, int]] = {}  # the cause with the most calls (DDP rebuilds its buckets once)
    for cause, count, _, nbytes in buckets:
        if cause.bucket_index is not None and (cause.bucket_index not in by_index or count > by_index[cause.bucket_index][1]):
            by_index[cause.bucket_index] = (cause, count, nbytes)
    return tuple(evidence(f"bucket {index}: {format_bytes(nbytes)}" + (f" · {cause.tensor}" if cause.tensor else ""), origin, cause.module)
                 for index, (cause, _, nbytes) in sorted(by_index.items())[:MAX_BUCKETS_SHOWN])


def _replicated_parameters(context: AnalysisContext, out: Collected, records: ShardingRecords, world: int) -> None:
    replicated = [parameter for parameter in records.parameters if parameter.wrapper == "ddp"]
    if not replicated or world < 2:
        return
    parameter_bytes = sum(parameter.bytes or 0 for parameter in replicated)
    # parameters and gradients; Adam's two moments would double it again
    saved = 2 * parameter_bytes * (world - 1) / world
    hbm = context.target.hbm_bytes
    share = saved / hbm if hbm else 0.0
    out.data["replicated_bytes"] = parameter_bytes
    origin = replicated[0].origin
    out.findings.append(Finding(
        analyzer=NAME,
        severity="warning" if share >= REPLICATED_HBM_SHARE else "info",
        title=f"DDP replicates {format_bytes(parameter_bytes)} of parameters on every rank; FSDP2 would save {format_bytes(saved)} per rank",
        explanation=(
            f"Each of the {world} ranks holds every parameter and gradient ({format_bytes(2 * parameter_bytes)}, more with optimizer "
            f"state); sharding them with fully_shard would keep 1/{world} of each: {share:.1%} of {context.target.label}'s HBM per rank."
        ),
        suggestion="Where memory limits the batch or model size, replace `DDP(model)` with `fully_shard` on each block and then the model.",
        cost_total_ns=0.0,
        evidence=(Evidence(f"{plural(len(replicated), 'parameter')}, {format_bytes(parameter_bytes)}", file=origin.file if origin else None,
                           line=origin.line if origin else None, table="parameter_placements"),),
        **location(origin),
    ))


def _uneven_shards(context: AnalysisContext, out: Collected, records: ShardingRecords) -> None:
    uneven = []
    for parameter in records.parameters:
        sizes = records.mesh_dim_sizes(parameter.mesh_id)
        shape = [int(size) for size in (parameter.global_shape or "").split(",") if size.strip().lstrip("-").isdigit()]
        for mesh_dim, placement in enumerate((parameter.placements or "").split(",")):
            if not placement.startswith("Shard(") or mesh_dim >= len(sizes) or not shape:
                continue
            dim = int(placement[6:-1])
            if shape[dim] % sizes[mesh_dim]:
                uneven.append((parameter, dim, sizes[mesh_dim]))
    out.data["uneven_shards"] = tuple(UnevenShard(parameter.name, dim, size) for parameter, dim, size in uneven)
    if not uneven:
        return
    parameter, dim, size = uneven[0]
    out.findings.append(Finding(
        analyzer=NAME,
        severity="info",
        title=f"Uneven shards: {parameter.name} dim {dim} ({parameter.global_shape}) is not divisible by its mesh dim of {size}",
        explanation=(
            f"{plural(len(uneven), 'parameter')} are split unevenly: the last rank's shard is smaller, every all-gather of them is padded, "
            "and memory per rank differs."
        ),
        suggestion=f"Make dim {dim} of {parameter.name} a multiple of {size} (pad the layer's width), or choose a mesh size that divides it.",
        cost_total_ns=0.0,
        evidence=tuple(Evidence(f"{p.name}: {p.global_shape}, {p.placements}", file=p.origin.file if p.origin else None,
                                line=p.origin.line if p.origin else None, table="parameter_placements") for p, _, _ in uneven[:5]),
        **location(parameter.origin),
    ))


# ----------------------------------------------------------------- exposed communication
def _set_up_once(context: AnalysisContext, records: ShardingRecords, collective: CausedCollective) -> bool:
    """Whether a library issued the collective once as set-up inside a step (DDP's bucket rebuild), not per step."""
    cause = records.causes.get(collective.cause_id) if collective.cause_id is not None else None
    return cause is not None and one_off_collective(context, collective.frame_id, collective.step, collective.kind,
                                                    collective.bytes, cause.kind)


def _exposed(context: AnalysisContext, out: Collected, records: ShardingRecords, explained_ns: float) -> None:
    """Collective time per steady step with no program running on the chip (exposed) and with one (overlapped)."""
    steady = [collective for collective in records.collectives if in_steady_steps(context, collective)
              and not _set_up_once(context, records, collective)]
    # A capture with no program runs (a CPU process group's profile) cannot tell what the collectives overlapped.
    if not steady or not context.steps or not context.trace.count("executions"):
        return
    intervals = merged_intervals((c.start_ns, c.start_ns + c.dur_ns) for c in steady)
    where, params = context.steady_where()
    busy = merged_intervals((start, start + dur) for start, dur in context.trace.sql(
        f"SELECT start_ns, dur_ns FROM executions WHERE {where} AND dur_ns IS NOT NULL", params))
    communication = sum(end - start for start, end in intervals)
    overlapped = _overlap(intervals, busy)
    exposed = communication - overlapped
    steps = max(context.steady_count, 1)
    out.data["communication_per_step_ns"] = communication / steps
    out.data["exposed_per_step_ns"] = exposed / steps
    out.data["overlapped_per_step_ns"] = overlapped / steps
    share = context.share_of_steps(exposed)
    if share < 0.05:
        return
    # Overlap can hide communication only behind compute: what it saves is at most the chip's busy time.
    compute = sum(end - start for start, end in busy)
    out.data["compute_per_step_ns"] = compute / steps
    cost = per_step(context, exposed)
    unexplained = max((cost["cost_total_ns"] or 0.0) - explained_ns, 0.0)
    hideable = min(unexplained, (per_step(context, compute)["cost_total_ns"] or 0.0))
    top = _top_cause(records, steady)
    origin = top.origin if top is not None else None
    # Virtual chips of one host run their programs and the transport on the same cores: what overlaps there
    # says little about a TPU's overlap, so the finding is only information.
    virtual = shared_host(context.trace)
    out.findings.append(Finding(
        analyzer=NAME,
        severity="info" if virtual or hideable < 0.5 * (cost["cost_total_ns"] or 0.0) else context.severity(share, warning=0.15, critical=0.4),
        title=f"Communication exposed {format_ns(exposed / steps)} per step ({share:.0%} of a step); {format_ns(overlapped / steps)} overlapped",
        explanation=(
            f"Of {format_ns(communication / steps)} of collectives a step (overlapping calls counted once), {format_ns(exposed / steps)} ran "
            f"while no program ran on the chip, so the step waited for it; the chip computed {format_ns(compute / steps)} a step, "
            f"which bounds what overlapping can hide."
            + (f" The most time goes to {top.kind} of {top.module or 'the model'}." if top is not None else "")
            + (" The ranks are virtual chips of one host, whose programs and transport share its cores, so overlap here "
               "says little about a TPU's: the finding is information, with no cost." if virtual else "")
        ),
        suggestion=(
            "Start communication earlier so that compute hides it, and remove the collectives the other findings name. "
            + overlap_advice(context, {(c.kind, c.frame_id) for c in steady if c.cause_id is None},
                             {records.causes[c.cause_id].kind or "" for c in steady if c.cause_id in records.causes})
        ),
        cost_total_ns=0.0 if virtual else hideable,
        cost_per_step_ns=None if virtual or not context.step_count else hideable / context.step_count,
        **location(origin),
    ))


def _top_cause(records: ShardingRecords, collectives: list[CausedCollective]) -> CollectiveCauseRecord | None:
    totals: dict[int, int] = defaultdict(int)
    for collective in collectives:
        if collective.cause_id is not None:
            totals[collective.cause_id] += collective.dur_ns
    if not totals:
        return None
    return records.causes.get(max(totals, key=lambda cause_id: totals[cause_id]))


def _overlap(first: list[tuple[int, int]], second: list[tuple[int, int]]) -> int:
    """Total length of the intersection of two unions of intervals (each sorted, disjoint)."""
    total, index = 0, 0
    for start, end in first:
        while index < len(second) and second[index][1] <= start:
            index += 1
        probe = index
        while probe < len(second) and second[probe][0] < end:
            total += max(0, min(end, second[probe][1]) - max(start, second[probe][0]))
            probe += 1
    return total
