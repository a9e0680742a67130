"""How to hide a run's communication behind compute, in the terms of what issued it: DDP's gradient buckets, FSDP's
parameter groups, DTensor redistributions (tensor parallelism), the model's own forward collectives
(`collective_phases`), gradients reduced by hand after the backward, and the user's other calls. Each part of the
advice names only the mechanism the run used: bucket sizes and `no_sync` are for DDP runs alone. An imported capture
records no causes: an XProf capture gets JAX's terms, another capture advice that names no one library."""

from __future__ import annotations

from collections.abc import Iterable

from tputrace.analysis.collective_phases import collective_phases
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.imported import context_import_facts

GRADIENT_KINDS = ("all_reduce", "reduce_scatter", "reduce")  # a user's call of these outside the forward reduces gradients
SCALAR_BYTES = 64  # a call of at most this many bytes carries a few numbers (a loss, an accuracy), not a tensor's data


def overlap_advice(context: AnalysisContext, user_lines: Iterable[tuple[str, int | None]], cause_kinds: Iterable[str]) -> str:
    """The changes that start the communication earlier, by what issued it: `user_lines` are the (kind, frame id) of
    the user's own calls, `cause_kinds` the recorded causes of the library calls."""
    if context.trace.meta.get("imported"):
        facts = context_import_facts(context)
        if facts is not None and facts.format == "xplane":
            return ("Reduce less often or less data: accumulate gradients over micro-batches (a `jax.lax.scan`) before one "
                    "`psum`/`pmean`, cast them to bfloat16 before reducing, or shard parameters and optimizer state "
                    "(`jax.sharding`) so that XLA reduce-scatters them and overlaps the collectives with the backward pass.")
        return ("Issue collectives asynchronously and wait just before their results are used, and reduce gradients as the "
                "backward produces them rather than after it (DDP's buckets and FSDP's prefetch do so where they run).")
    causes = set(cause_kinds)
    phases = collective_phases(context)
    largest = {(kind, frame_id): size or 0 for kind, frame_id, size in context.trace.sql(
        "SELECT kind, frame_id, MAX(bytes) FROM collectives WHERE rank = ? GROUP BY kind, frame_id", (context.rank,))}
    forward: set[str] = set()
    gradients: set[str] = set()
    other: set[str] = set()
    for kind, frame_id in set(user_lines):
        at = context.where(frame_id)
        if phases.moves_activations(kind, frame_id):
            forward.add(at)
        elif kind in GRADIENT_KINDS and largest.get((kind, frame_id), 0) > SCALAR_BYTES:  # not a metric's few numbers
            gradients.add(at)
        else:
            other.add(at)
    parts: list[str] = []
    if any(kind.startswith("ddp") for kind in causes):
        parts.append("DDP's buckets go out as the backward fills them: keep `bucket_cap_mb` near its default of 25 so that the "
                     "first buckets start early, and when accumulating gradients run all micro-batches but the last inside `no_sync()`.")
    if any(kind.startswith("fsdp_") for kind in causes):
        parts.append("FSDP2 all-gathers each group just before it runs: prefetch further ahead "
                     "(`set_modules_to_forward_prefetch` and `set_modules_to_backward_prefetch` on the wrapped modules), and "
                     "keep small groups unsharded between forward and backward (`reshard_after_forward=False`).")
    if "redistribute" in causes:
        parts.append("The DTensor redistributions of the tensor-parallel plan run where a layer needs its input: pair a "
                     "column-parallel layer with a row-parallel one (`ColwiseParallel` then `RowwiseParallel`) so that one "
                     "collective a block remains, and let the next block's work that does not need it run meanwhile.")
    if forward:
        parts.append(f"The forward pass's collectives at {_lines(forward)} move activations: issue each asynchronously "
                     "(`async_op=True`) and call `wait()` just before its result is used, with compute that does not need it "
                     "in between.")
    if gradients:
        parts.append(f"The gradients reduced by hand at {_lines(gradients)} wait for the whole backward pass: reduce each "
                     "gradient as soon as it is ready (`param.register_post_accumulate_grad_hook` issuing "
                     "`dist.all_reduce(param.grad, async_op=True)`, the Works waited before `optimizer.step()`), in a few "
                     "flattened buffers rather than one call per tensor, or wrap the model in DistributedDataParallel, which does both.")
    if other:
        parts.append(f"Issue the calls at {_lines(other)} asynchronously and wait just before their results are used.")
    if not parts:
        parts.append("Issue collectives asynchronously and wait just before their results are used, with compute that does "
                     "not need them in between.")
    return " ".join(parts)


def run_cause_kinds(context: AnalysisContext) -> set[str]:
    """The kinds of the collective causes recorded on the analysed rank (`ddp_bucket`, `fsdp_all_gather`, ...)."""
    trace = context.trace
    if not trace.has_table("collective_causes"):
        return set()
    return {kind for (kind,) in trace.sql("SELECT DISTINCT kind FROM collective_causes WHERE rank = ?", (context.rank,)) if kind}


def _lines(places: set[str]) -> str:
    ordered = sorted(places)
    return ", ".join(ordered[:3]) + (f" and {len(ordered) - 3} more" if len(ordered) > 3 else "")
