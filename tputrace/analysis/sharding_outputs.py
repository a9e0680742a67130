"""Sharding: a tensor-parallel plan's last entry of a module that gathers its output every forward.

A `ColwiseParallel(output_layouts=Replicate())` entry with no later plan entry under the same parent module
(the model's output projection, most often a vocabulary head whose logits feed the loss) all-gathers its
whole output every forward. When the output feeds a cross-entropy loss, `loss_parallel()` computes the loss
on the sharded logits with a few all-reduces of one value per row instead; when another layer reads it,
that layer can take it split. One finding per plan line. Cost: the gathers' measured time. An entry whose
next plan entry is column-parallel too is `activation_gathers`' (in `sharding_plans`), and is left out.
"""

from __future__ import annotations

from collections import defaultdict

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Finding
from tputrace.analysis.sharding_common import NAME, Collected, TimeByCause, evidence, ici_estimate_ns, location, per_step
from tputrace.analysis.sharding_plans import _styles_by_module
from tputrace.store.records import CollectiveCauseRecord
from tputrace.store.sharding import ShardingRecords
from tputrace.wording import format_bytes, format_ns, plural


def output_gathers(context: AnalysisContext, out: Collected, records: ShardingRecords, by_cause: TimeByCause, world: int) -> float:
    """Column-parallel entries that gather their output and are the last plan entry of their parent module."""
    styles = _styles_by_module(records)
    order = list(styles)
    by_line: dict[tuple[str, int] | str, list[tuple[CollectiveCauseRecord, int, float, int]]] = defaultdict(list)
    gathering = {cause.module for cause in records.causes.values() if cause.op == "ColwiseParallel output_layouts" and cause.phase == "forward"}
    for cause_id, (count, dur_ns, nbytes) in by_cause.items():
        cause = records.causes.get(cause_id)
        if cause is None or cause.kind != "redistribute" or cause.phase != "forward" or cause.op != "ColwiseParallel output_layouts":
            continue
        if not (cause.src_placements or "").startswith("Shard") or "Replicate" not in (cause.dst_placements or ""):
            continue
        module = cause.module or "?"
        parent = module.rsplit(".", 1)[0]
        following = order[order.index(module) + 1:] if module in order else []
        if any(other.rsplit(".", 1)[0] == parent for other in following):
            continue  # another plan entry of the same parent reads it: `activation_gathers` judges the pair
        before = [other for other in (order[:order.index(module)] if module in order else []) if other.rsplit(".", 1)[0] == parent]
        if before and before[-1] in gathering and styles[before[-1]][0].startswith("ColwiseParallel"):
            continue  # the second of a column-column pair, whose fix (RowwiseParallel) `activation_gathers` gives
        key = (cause.origin.file, cause.origin.line) if cause.origin is not None else module
        by_line[key].append((cause, count, dur_ns, nbytes))
    explained = 0.0
    steps = max(context.steady_count, 1)
    for gathers in by_line.values():
        cause = gathers[0][0]
        dur_ns = sum(dur for _, _, dur, _ in gathers)
        share = context.share_of_steps(dur_ns)
        if share < 0.01:
            continue
        calls = sum(count for _, count, _, _ in gathers)
        gathered = sum(count * nbytes for _, count, _, nbytes in gathers)
        target_ns = ici_estimate_ns("all_gather", gathered, world, context.target.ici_bandwidth) / steps
        cost = per_step(context, dur_ns)
        explained += cost["cost_total_ns"] or 0.0
        module = cause.module or "the module"
        entry = module.rsplit(".", 1)[-1]
        out.findings.append(Finding(
            analyzer=NAME,
            severity=context.severity(share, warning=0.05, critical=0.25),
            title=f"Tensor-parallel plan: {module} all-gathers its whole output ({cause.global_shape}) every forward",
            explanation=(
                f"The plan entry \"{entry}\" is ColwiseParallel with output_layouts=Replicate(), and no later entry of the plan reads its "
                f"output split: every forward all-gathers the {cause.src_placements} output ({format_bytes(gathered / max(calls, 1))} a call, "
                f"{plural(calls, 'call')} in the steady steps, {format_ns(dur_ns / steps)} a step here; about {format_ns(target_ns)} a step "
                f"on {context.target.label}'s ICI), and every rank then holds all of it."
            ),
            suggestion=(
                f"If the output feeds the loss (logits over a vocabulary), keep it split: `ColwiseParallel(use_local_output=False)` for "
                f"\"{entry}\" and the cross-entropy inside `with torch.distributed.tensor.parallel.loss_parallel():` (the backward too), which "
                f"reduces one value per row instead of gathering the logits; if a later layer reads it, make that layer RowwiseParallel "
                f"and this entry ColwiseParallel()."
            ),
            evidence=tuple(evidence(f"{gather.module}: {gather.src_placements} -> {gather.dst_placements}, {gather.global_shape}, "
                                    f"{plural(count, 'call')}", gather.origin, gather.module) for gather, count, _, _ in gathers[:5]),
            module=cause.module,
            **cost,
            **location(cause.origin),
        ))
    return explained
