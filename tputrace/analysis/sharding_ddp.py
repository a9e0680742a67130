"""Sharding checks of DDP's gradient all-reduces that are not about bucket sizes.

- Gradient accumulation without `no_sync`: a DDP model whose buckets are all-reduced more than once per
  optimizer step (several backward passes per step, each synchronising every gradient). Only the last
  micro-batch's reduction is needed; `no_sync()` around the others keeps their gradients local, summed
  into `.grad`. At the line that called backward(), with the `DDP(...)` line as evidence. Cost: the bucket
  all-reduces of every backward but the last of each step, measured, per steady step.
- Buffers broadcast in every forward: DDP's `broadcast_buffers=True` (the default) sends the model's buffers
  (BatchNorm's running statistics) from rank 0 before each forward, a collective that waits for every rank and ends
  the pending fused program. At the forward line, with `broadcast_buffers=False` as the fix (SyncBatchNorm keeps
  the statistics equal on every rank already). Cost: the broadcasts of the steady steps, measured.
- Parameters a step did not use: the run ended on DDP's "Expected to have finished reduction in the prior
  iteration" error, whose parameter indices are named (DDP's parameter order, as recorded). At the `DDP(...)`
  line; the run's wall time as the cost, since the run stopped there.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter, defaultdict

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Finding
from tputrace.analysis.library_set_up import one_off_collective
from tputrace.analysis.sharding_common import NAME, Collected, evidence, ici_estimate_ns, in_steady_steps, location, per_step
from tputrace.store.records import SourceLocation
from tputrace.store.sharding import CausedCollective, ShardingRecords
from tputrace.wording import format_bytes, format_ns, plural


_UNFINISHED_REDUCTION = "Expected to have finished reduction in the prior iteration"
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)")


def unused_parameters(context: AnalysisContext, out: Collected, records: ShardingRecords) -> None:
    """A critical finding, naming the parameters, when a rank's run ended because a DDP step left some without a gradient."""
    runs = sorted(context.trace.runs, key=lambda run: (run.rank != context.rank, run.rank))
    failed = next((run for run in runs if _UNFINISHED_REDUCTION in (run.error or "")), None)
    parameters = [parameter for parameter in records.parameters if parameter.wrapper == "ddp"]
    if failed is None or not parameters:
        return
    found = _UNUSED_INDICES.search(failed.error or "")
    indices = [int(index) for index in found.group(2).split()] if found else []
    names = [_short_name(parameters[index].name) for index in indices if index < len(parameters)]
    wrapper = parameters[0].group or "DistributedDataParallel"
    origin = parameters[0].origin
    named = ", ".join(names) if names else "some parameters"
    out.findings.append(Finding(
        analyzer=NAME,
        severity="critical",
        title=f"DDP: {named} got no gradient in a step, so rank {failed.rank} stopped at the next forward",
        explanation=(
            f"DDP all-reduces every parameter's gradient in each backward; a forward that did not use {named} (a branch "
            "taken only in some steps, a head used in some batches only, an output left out of the loss) left their bucket "
            "unreduced, and the next forward raised \"Expected to have finished reduction in the prior iteration\""
            + (f" (parameter indices {' '.join(map(str, indices))} of {wrapper}'s, in its parameter order)." if indices else ".")
        ),
        suggestion=(
            "Make every parameter take part in each step's loss: where the step skips them, add `0.0 *` their output "
            "(or `0.0 * sum(p.sum() for p in module.parameters())`) to the loss, so their gradient is zero and reduced; a "
            "module never trained belongs outside the model DDP wraps, or with `requires_grad_(False)` before `DDP(...)`. "
            "`find_unused_parameters=True`, CUDA's answer, is refused on tpu (see docs/distributed.md)."
        ),
        evidence=tuple(evidence(f"{_short_name(parameters[index].name)}: index {index}, ({parameters[index].global_shape})", origin, parameters[index].module)
                       for index in indices if index < len(parameters)),
        module=parameters[indices[0]].module if indices and indices[0] < len(parameters) else None,
        cost_total_ns=float(context.wall_ns),
        **location(origin),
    ))


def _short_name(name: str | None) -> str:
    """A DDP parameter's name as the script writes it on the wrapped model (`module.aux.weight`)."""
    text = name or "?"
    return text.split(".", 1)[1] if text.startswith("DistributedDataParallel.") else text


def backward_passes(records: ShardingRecords, calls: list[CausedCollective]) -> float:
    """How many times a step all-reduced each bucket (the median over the steps of the most-reduced bucket's count,
    calls of one bucket in flight together counted once): one per backward pass, so more than one means gradient
    accumulation without `no_sync`."""
    by_bucket: dict[int, dict[int | None, list[CausedCollective]]] = defaultdict(lambda: defaultdict(list))
    for call in calls:
        by_bucket[call.step][records.causes[call.cause_id].bucket_index].append(call)  # type: ignore[index]
    if not by_bucket:
        return 1.0
    return float(statistics.median(max(_apart(bucket_calls) for bucket_calls in buckets.values()) for buckets in by_bucket.values()))


def _apart(calls: list[CausedCollective]) -> int:
    """The calls' count, those that started before the previous one ended counted as one."""
    count, end = 0, -1
    for call in sorted(calls, key=lambda call: call.start_ns):
        if call.start_ns >= end:
            count += 1
        end = max(end, call.start_ns + call.dur_ns)
    return count


def accumulation_without_no_sync(context: AnalysisContext, out: Collected, records: ShardingRecords, world: int) -> float:
    """DDP models whose buckets are reduced several times per steady step; one finding per model."""
    by_model: dict[tuple[str | None, SourceLocation | None], list[CausedCollective]] = defaultdict(list)
    for collective in records.collectives:
        cause = records.causes.get(collective.cause_id) if collective.cause_id is not None else None
        if cause is not None and cause.kind == "ddp_bucket" and in_steady_steps(context, collective):
            by_model[(cause.module, cause.origin)].append(collective)
    explained = 0.0
    steps = max(context.steady_count, 1)
    for (module, origin), calls in by_model.items():
        passes = backward_passes(records, calls)
        if passes < 2:
            continue
        buckets = len({records.causes[call.cause_id].bucket_index for call in calls})  # type: ignore[index]
        dur_ns = sum(call.dur_ns for call in calls)
        saved_ns = dur_ns * (passes - 1) / passes
        gradient_bytes = sum(call.bytes for call in calls) / steps / passes
        target_ns = ici_estimate_ns("all_reduce", gradient_bytes, world, context.target.ici_bandwidth) * (passes - 1)
        cost = per_step(context, saved_ns)
        explained += cost["cost_total_ns"] or 0.0
        lines = Counter(call.frame_id for call in calls if call.frame_id is not None)
        frame_id = lines.most_common(1)[0][0] if lines else None
        where = context.where(frame_id) if frame_id is not None else (origin.short if origin is not None else "the backward")
        out.findings.append(Finding(
            analyzer=NAME,
            severity=context.severity(context.share_of_steps(saved_ns), warning=0.05, critical=0.25),
            title=f"DDP all-reduces the gradients {passes:.0f} times per optimizer step: gradient accumulation without no_sync() at {where}",
            explanation=(
                f"Each steady step ran {passes:.0f} backward passes of the DDP model made at {origin.short if origin else 'its DDP(...) line'}, "
                f"and every one of them all-reduced all its gradients ({plural(buckets, 'bucket')}, {format_bytes(gradient_bytes)} a pass). "
                f"The optimizer reads the gradients once, after the last micro-batch: the earlier {passes - 1:.0f} reductions a step are "
                f"wasted ({format_ns(saved_ns / steps)} a step here, about {format_ns(target_ns)} a step on {context.target.label}'s ICI)."
            ),
            suggestion=(
                f"Run the forward and backward of every micro-batch but the last inside `with model.no_sync():`, where model is the "
                f"DistributedDataParallel made at {origin.short if origin else 'its DDP(...) line'} (the gradients add up locally in .grad), "
                f"and the last one outside it, so that DDP all-reduces once per optimizer step."
            ),
            evidence=(evidence(f"{plural(len(calls), 'bucket all-reduce')} in {plural(steps, 'steady step')}: "
                               f"{plural(buckets, 'bucket')} x {passes:.0f} backward passes a step", origin, module),),
            module=module,
            **cost,
            **context.location_fields(frame_id),
        ))
    return explained


def buffers_broadcast_each_forward(context: AnalysisContext, out: Collected, records: ShardingRecords) -> float:
    """DDP models that broadcast their buffers in most steady steps' forwards; one finding per model."""
    by_model: dict[tuple[str | None, SourceLocation | None], list[CausedCollective]] = defaultdict(list)
    for collective in records.collectives:
        cause = records.causes.get(collective.cause_id) if collective.cause_id is not None else None
        if (cause is not None and cause.kind == "ddp_forward" and collective.kind == "broadcast" and in_steady_steps(context, collective)
                and not one_off_collective(context, collective.frame_id, collective.step, collective.kind, collective.bytes, cause.kind)):
            by_model[(cause.module, cause.origin)].append(collective)  # not the rebuilt bucket order's broadcast, once
    steps = max(context.steady_count, 1)
    synced = bool(context.trace.sql("SELECT 1 FROM strings WHERE text LIKE 'aten.batch_norm_stats%' LIMIT 1"))
    explained = 0.0
    for (module, origin), calls in by_model.items():
        if len({call.step for call in calls}) * 2 < steps:
            continue  # a one-off (the rebuilt bucket order) or a forward run in a few steps only
        dur_ns = float(sum(call.dur_ns for call in calls))
        cost = per_step(context, dur_ns)
        explained += cost["cost_total_ns"] or 0.0
        lines = Counter(call.frame_id for call in calls if call.frame_id is not None)
        frame_id = lines.most_common(1)[0][0] if lines else None
        made = origin.short if origin is not None else "its DDP(...) line"
        out.findings.append(Finding(
            analyzer=NAME,
            severity=context.severity(context.share_of_steps(dur_ns), warning=0.05, critical=0.25),
            title=f"DDP broadcasts the model's buffers from rank 0 in every forward: {len(calls) / steps:.3g} broadcasts a step",
            explanation=(
                f"The DDP model made at {made} has buffers (BatchNorm's running statistics, counters) and "
                "`broadcast_buffers=True`, the default: before each forward it sends rank 0's buffers to every rank, "
                f"{format_bytes(sum(call.bytes for call in calls) / steps)} a step in {format_ns(dur_ns / steps)}, a collective "
                "that waits for every rank and ends the pending fused program."
                + (" Its SyncBatchNorm layers compute the statistics over every rank's batch, so the buffers are equal on "
                   "every rank already and the broadcast changes nothing." if synced else "")
            ),
            suggestion=(
                f"Make the model with `DistributedDataParallel(..., broadcast_buffers=False)` at {made}"
                + ("." if synced else
                   ": each rank then keeps the running statistics of its own batches, which only evaluation reads; where "
                   "evaluation needs one set, broadcast or all-reduce the buffers once before it (or convert the norms "
                   "with `nn.SyncBatchNorm.convert_sync_batchnorm`).")
            ),
            evidence=(evidence(f"{plural(len(calls), 'buffer broadcast')} in {plural(steps, 'steady step')}", origin, module),),
            module=module,
            **cost,
            **context.location_fields(frame_id),
        ))
    return explained
