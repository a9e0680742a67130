"""Parameters a data-parallel run's optimizer updates that no wrapper holds: their gradients are never summed over
the ranks, so each rank's copy drifts from the others' with no error (a module outside every `fully_shard`
group, as the embedding and head of a model whose blocks alone were wrapped; a parameter kept beside a DDP
model). The backend records them at the optimizer's first step (`tputrace.backend.distributed.unsynced`),
named by their module and shape. A run that all-reduces as many bytes a step by hand is taken to sum them
itself. Cost: none measured; the finding is about what the training computes.
"""

from __future__ import annotations

from collections import defaultdict

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Finding
from tputrace.analysis.sharding_common import NAME, Collected, evidence, in_steady_steps, location
from tputrace.store.sharding import ShardingRecords
from tputrace.wording import format_bytes, plural

DATA_PARALLEL = ("ddp", "fsdp", "fsdp+tp")
MAX_MODULES_SHOWN = 4


def unsynced_parameters(context: AnalysisContext, out: Collected, records: ShardingRecords) -> None:
    """A critical finding when a data-parallel wrapper holds some of the optimizer's parameters and none holds others."""
    held = [parameter for parameter in records.parameters if parameter.wrapper in DATA_PARALLEL]
    loose = [parameter for parameter in records.parameters
             if parameter.wrapper == "none" and parameter.mesh_id is None and parameter.origin is None]
    if not held or not loose:
        return
    loose_bytes = sum(parameter.bytes or 0 for parameter in loose)
    by_hand = sum(collective.bytes for collective in records.collectives
                  if collective.cause_id is None and collective.kind == "all_reduce" and in_steady_steps(context, collective))
    if by_hand >= loose_bytes * max(context.steady_count, 1):
        return
    modules: dict[str, list[str]] = defaultdict(list)
    for parameter in loose:
        modules[parameter.module or "an unnamed module"].append((parameter.global_shape or "").replace(",", "x") or "scalar")
    names = list(modules)
    shown = ", ".join(names[:MAX_MODULES_SHOWN]) + (f" and {plural(len(names) - MAX_MODULES_SHOWN, 'more')}" if len(names) > MAX_MODULES_SHOWN else "")
    fsdp = any(parameter.wrapper.startswith("fsdp") for parameter in held if parameter.wrapper)
    origin = next((parameter.origin for parameter in held if parameter.origin is not None), None)
    wrapper = "fully_shard group" if fsdp else "DistributedDataParallel model"
    out.findings.append(Finding(
        analyzer=NAME,
        severity="critical",
        title=(f"{plural(len(loose), 'parameter')} in {shown} ({format_bytes(loose_bytes)}) {'is' if len(loose) == 1 else 'are'} in no "
               f"{wrapper}: {'its gradient is' if len(loose) == 1 else 'their gradients are'} never summed over the ranks, so each "
               "rank's copy drifts apart"),
        explanation=(
            f"The optimizer updates {plural(len(held), 'parameter')} that {'FSDP2' if fsdp else 'DDP'} holds and {len(loose)} more "
            f"that no wrapper holds. Each rank computes those gradients from its own batch only and nothing reduces them, so after the "
            f"first step the ranks train different copies of {shown}: no error is raised, the model just stops being one model."
        ),
        suggestion=(
            ("Call fully_shard on the root model after its blocks (`fully_shard(model)`: the root group takes every parameter that no "
             "inner group holds), or on each module named here." if fsdp else
             "Put the module that holds them inside the model DDP wraps, or all-reduce their gradients (op=AVG) before "
             "optimizer.step().")
        ),
        evidence=tuple(evidence(f"{module}: {', '.join(shapes)}, not reduced", None, module) for module, shapes in modules.items()),
        cost_total_ns=0.0,
        cost_per_step_ns=0.0,
        **location(origin),
    ))
