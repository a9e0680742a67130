"""FSDP2 groups one layer each: `fully_shard` called on every leaf module (each Linear and LayerNorm, as a
wrap policy by layer type does) where the blocks that hold them have none of their own.

Each group is all-gathered before its layer runs and reduce-scattered after its backward, so a block of
three layers makes three small, latency-bound calls of each where one would do, and the gather of one
layer cannot be prefetched under a block's compute. Cost: the leaf groups' collectives in the median steady
step (calls in flight together once), times the share of the calls that one group per block saves, over
the loop's steps.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Finding
from tputrace.analysis.sharding_common import NAME, Collected, evidence, in_steady_steps, location, per_step
from tputrace.store.aggregates import merged_ns
from tputrace.store.sharding import ShardingRecords
from tputrace.wording import format_bytes, format_ns, plural

SMALL_GROUP_BYTES = 1 << 20  # a group under this is gathered in a latency-bound message
MIN_LEAF_GROUPS = 4
MAX_PARENTS_SHOWN = 4


def leaf_groups(context: AnalysisContext, out: Collected, records: ShardingRecords) -> float:
    """A finding when blocks without a fully_shard of their own hold several leaf groups each, small ones;
    returns its cost (0.0 without one)."""
    groups: dict[str, int] = defaultdict(int)
    leaf: dict[str, bool] = {}
    for parameter in records.parameters:
        if parameter.wrapper in ("fsdp", "fsdp+tp") and parameter.group:
            groups[parameter.group] += parameter.bytes or 0
            leaf[parameter.group] = leaf.get(parameter.group, True) and parameter.module == parameter.group
    by_parent: dict[str, list[str]] = defaultdict(list)
    for group in groups:
        parent = group.rpartition(".")[0]
        # the root (a path of one name) is left out: the layers directly in it have no block to share a group with
        if leaf[group] and "." in parent and parent not in groups:
            by_parent[parent].append(group)
    parents = {parent: children for parent, children in by_parent.items() if len(children) >= 2}
    leaves = [group for children in parents.values() for group in children]
    if len(leaves) < MIN_LEAF_GROUPS or statistics.median(groups[group] for group in leaves) >= SMALL_GROUP_BYTES:
        return 0.0
    leaf_causes = {cause_id for cause_id, cause in records.causes.items() if (cause.kind or "").startswith("fsdp_") and cause.module in leaves}
    calls = [collective for collective in records.collectives if collective.cause_id in leaf_causes and in_steady_steps(context, collective)]
    if not calls:
        return 0.0
    steps = max(context.steady_count, 1)
    by_step: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for call in calls:
        by_step[call.step].append((call.start_ns, call.start_ns + call.dur_ns))
    leaf_ns = statistics.median(merged_ns(sorted(spans)) for spans in by_step.values())
    calls_per_step = len(calls) / steps
    kept = calls_per_step * len(parents) / len(leaves)  # one group per block instead of one per layer
    saved_per_step = leaf_ns * (calls_per_step - kept) / calls_per_step
    cost = per_step(context, saved_per_step * steps)
    first_cause = records.causes[min(leaf_causes)]
    origin = first_cause.origin
    named = sorted(parents, key=lambda parent: -len(parents[parent]))
    shown = ", ".join(f"{parent} ({plural(len(parents[parent]), 'layer')})" for parent in named[:MAX_PARENTS_SHOWN]) + (
        f" and {plural(len(named) - MAX_PARENTS_SHOWN, 'more')}" if len(named) > MAX_PARENTS_SHOWN else "")
    leaf_bytes = sum(groups[group] for group in leaves)
    out.findings.append(Finding(
        analyzer=NAME,
        severity=context.severity(context.share_of_steps(saved_per_step * steps), warning=0.02, critical=0.2),
        title=(f"FSDP2 wraps single layers: {plural(len(leaves), 'fully_shard group')} of {format_bytes(leaf_bytes / len(leaves))} "
               f"on average in {plural(len(parents), 'module')} that have none of their own, {calls_per_step:.0f} calls per step"),
        explanation=(
            f"fully_shard was called on each layer of {shown}, not on those modules: each layer's "
            f"parameters are all-gathered before it runs and reduce-scattered after its backward, {calls_per_step:.0f} small, "
            f"latency-bound calls a step ({format_ns(leaf_ns)} a step here, calls in flight together counted once) where one group "
            f"per module would make about {kept:.0f}, and a layer's gather is too small to hide under a module's compute."
        ),
        suggestion=(
            f"Call fully_shard on the modules that hold the layers ({', '.join(named[:MAX_PARENTS_SHOWN])}: each transformer or "
            "residual block, e.g. `for block in model.blocks: fully_shard(block)`), then on the root, instead of on every "
            "Linear and norm layer (a wrap policy by layer type)."
        ),
        evidence=tuple(evidence(f"{parent}: {plural(len(children), 'group')} of " + ", ".join(format_bytes(groups[child]) for child in children),
                                origin, parent) for parent, children in sorted(parents.items())[:MAX_PARENTS_SHOWN]),
        module=named[0],
        **cost,
        **location(origin),
    ))
    return cost["cost_total_ns"] or 0.0
