"""The change that removes a line's collectives, by what the calls are: pickled objects, one reduction per tensor, a
barrier, broadcasts, scatters (`distribute_tensor` in the loop), point-to-point sends, XLA's collective permutes, the
model's own communication in its forward pass (`collective_phases`); else the general advice to overlap or reduce
gradients less often."""

from __future__ import annotations

from collections.abc import Sequence

from tputrace.analysis.call_sites import line_text
from tputrace.analysis.collective_overlap import SCALAR_BYTES, overlap_advice, run_cause_kinds
from tputrace.analysis.collective_phases import collective_phases, forward_fix
from tputrace.analysis.context import AnalysisContext

# The collectives torch's object calls run on pickled bytes, by the call.
OBJECT_KINDS = {"all_gather": "all_gather_object", "broadcast": "broadcast_object_list", "gather": "gather_object", "scatter": "scatter_object_list"}
PER_TENSOR_KINDS = ("all_reduce", "reduce")  # a reduction a loop may issue once per tensor, where one flattened call does
SECOND_LINE_SHARE = 0.2  # of the top two lines' time: a second line with a fix of its own gets it named too


def line_fix(context: AnalysisContext, where: str, params: Sequence[int], by: str = "COUNT(*) DESC, SUM(dur_ns) DESC") -> str | None:
    """What removes the calls of the top line (by `by`) when its kind has a fix of its own: a barrier, a broadcast, sends,
    XLA's collective permutes, a reduction called once per tensor."""
    rows = context.trace.sql(f"SELECT kind, frame_id, COUNT(*), COUNT(DISTINCT bytes), COALESCE(SUM(dtype = 'u8'), 0), "
                             f"COALESCE(SUM(dtype = 'i64'), 0), MAX(bytes), COALESCE(SUM(algorithm LIKE '%:uneven'), 0) FROM collectives WHERE {where} "
                             f"GROUP BY kind, frame_id ORDER BY {by} LIMIT 1", tuple(params))
    if not rows:
        return None
    kind, frame_id, calls, sizes, pickled, lengths, largest, uneven = rows[0]
    per_step = calls / max(context.steady_count, 1) if context.steps else 0.0
    if kind == "all_to_all" and uneven:
        return _dispatch_fix(context.where(frame_id))
    if kind in OBJECT_KINDS and pickled and lengths:
        return _object_fix(kind, context.where(frame_id), per_step)
    if kind in PER_TENSOR_KINDS and per_step >= 1 and largest is not None and largest <= SCALAR_BYTES:
        return _scalar_fix(kind, context.where(frame_id))
    if collective_phases(context).moves_activations(kind, frame_id):
        return forward_fix(context, kind, frame_id)
    if kind in PER_TENSOR_KINDS and per_step >= 2 and sizes >= 2:
        return _per_tensor_fix(kind, context.where(frame_id), per_step)
    if kind not in ("barrier", "broadcast", "send", "recv", "collective_permute", "scatter"):
        return None
    return small_fix(context, where, params, (kind, frame_id))


def share_fix(context: AnalysisContext, where: str, params: Sequence[int]) -> str:
    """What removes the collectives' share: the fix of each line among the two that take the most time that has one of
    its own (the second where it takes a fair part of the time: a loop that reduces gradients and then broadcasts
    the parameters has two), else the general one."""
    rows = context.trace.sql(f"SELECT kind, frame_id, COALESCE(SUM(dur_ns), 0) FROM collectives WHERE {where} "
                             "GROUP BY kind, frame_id ORDER BY 3 DESC LIMIT 2", tuple(params))
    total = sum(dur for _, _, dur in rows) or 1
    fixes: list[tuple[str, str]] = []  # (fix, the line it names)
    forward_named = False  # the forward's calls and their backward mirror: one change for both, named at the first
    for index, (kind, frame_id, dur) in enumerate(rows):
        if index and dur < SECOND_LINE_SHARE * total:
            break
        fix = line_fix(context, f"{where} AND kind = ? AND frame_id IS ?", tuple(params) + (kind, frame_id))
        at = context.where(frame_id)
        forward = fix is not None and collective_phases(context).moves_activations(kind, frame_id) and fix == forward_fix(context, kind, frame_id)
        if fix is None or (forward and forward_named):
            continue
        forward_named = forward_named or forward
        if fixes and fix.replace(at, fixes[0][1]) == fixes[0][0]:  # the same change at both lines (a send and its recv)
            fixes[0] = (fixes[0][0].replace(fixes[0][1], f"{fixes[0][1]} and {at}", 1), f"{fixes[0][1]} and {at}")
        elif all(fix != known for known, _ in fixes):
            fixes.append((fix, at))
    if not fixes:
        # a line whose calls take less time can still be what the top line's calls serve: an all-to-all of pieces the
        # ranks size each step, whose split sizes another collective exchanged first
        dispatch = context.trace.sql(f"SELECT frame_id FROM collectives WHERE {where} AND kind = 'all_to_all' AND algorithm "
                                     "LIKE '%:uneven' GROUP BY frame_id ORDER BY SUM(dur_ns) DESC LIMIT 1", tuple(params))
        if dispatch:
            return _dispatch_fix(context.where(dispatch[0][0]))
    return " ".join(fix for fix, _ in fixes) or overlap_fix(context, where, params)


def _object_fix(kind: str, at: str, per_step: float) -> str:
    """The fix for a collective of Python objects (`all_gather_object`, `broadcast_object_list`, `gather_object`): torch
    pickles each object into a byte tensor and sends the lengths first, two calls where one tensor would take one."""
    often = f", {per_step:.3g} calls a step" if per_step else ""
    return (f"The {kind} calls at {at} carry pickled Python objects (`{OBJECT_KINDS[kind]}`: the lengths as int64, then the bytes{often}): "
            "each call pickles on the host and waits for every rank, and numbers in them are read from the chip first (`.item()`). Put the "
            "numbers in one tensor on the chip (`torch.stack([loss.detach(), accuracy])`) and reduce or gather that, reading it "
            "every N steps or after the loop; keep object collectives for set-up and checkpoints.")


def _per_tensor_fix(kind: str, at: str, per_step: float) -> str:
    """The fix for one line reducing tensors of several sizes one call each, every step (a loop over the parameters'
    gradients): the calls' latency adds up and none overlaps the backward pass."""
    return (f"{kind} at {at} runs {per_step:.3g} times a step, one call per tensor of several sizes (a loop over the parameters' "
            "gradients): wrap the model in DistributedDataParallel, whose buckets reduce the gradients in a few large calls "
            "overlapped with the backward pass, or flatten the tensors into one buffer and reduce it once "
            "(`torch._utils._flatten_dense_tensors`, one call, then `_unflatten_dense_tensors` and copy the pieces back).")


def _dispatch_fix(at: str) -> str:
    """The fix for an all-to-all whose pieces the ranks size each step (a mixture of experts' token dispatch): the split
    sizes are counted on the chip, exchanged and read on the host before each call, and every new size is a new shape."""
    return (f"The all_to_all at {at} sends pieces whose sizes the ranks choose each step (split sizes, as a mixture of "
            "experts' token dispatch has): the counts are exchanged and read from the chip before every call, and each new "
            "size gives the programs after it a shape to compile again. Give each expert a fixed capacity (capacity factor × "
            "tokens / experts: pad the short ones, drop or reroute the overflow) and send equal splits (`all_to_all_single` "
            "without split sizes), so nothing is counted, exchanged or read on the host and every step keeps one shape.")


def _scalar_fix(kind: str, at: str) -> str:
    """The fix for a reduction of a few numbers every step (a loss or an accuracy reduced for logging): each call costs a
    round trip that waits for every rank, and ends the fused program before it, for a value the step does not need."""
    return (f"The {kind} calls at {at} reduce a few numbers every step (a metric for logging, such as a loss or an "
            "accuracy): each is a round trip that waits for every rank and ends the fused program before it. Add the "
            "values to a running sum on the chip and reduce that every N steps or after the loop, with the metrics "
            "stacked into one tensor (`torch.stack([loss.detach(), accuracy])`, one call); a value each step needs from "
            "every rank (a global norm for clipping) stays.")


def overlap_fix(context: AnalysisContext, where: str, params: Sequence[int]) -> str:
    """The general fix for the share of the collectives `where` selects, in the terms of what issued them
    (`overlap_advice`: DDP's buckets only for a DDP run, JAX's terms for an XProf capture)."""
    if context.trace.meta.get("imported"):
        return overlap_advice(context, (), ())
    lines = [(kind, frame_id) for kind, frame_id in context.trace.sql(
        f"SELECT DISTINCT kind, frame_id FROM collectives WHERE {where}" + (" AND cause_id IS NULL" if context.trace.has_column("collectives", "cause_id") else ""),
        tuple(params))]
    return "Overlap communication with compute. " + overlap_advice(context, lines, run_cause_kinds(context)) + " Communicate in bfloat16 where the values allow it."


def small_fix(context: AnalysisContext, where: str, params: Sequence[int], top: tuple[str, int | None] | None = None) -> str:
    """What removes most of the small messages, by the kind of the line that sends the most of them."""
    if top is None and (fix := line_fix(context, where, params)) is not None:
        return fix
    rows = [top] if top is not None else context.trace.sql(
        f"SELECT kind, frame_id FROM collectives WHERE {where} GROUP BY kind, frame_id ORDER BY COUNT(*) DESC, SUM(dur_ns) DESC LIMIT 1", tuple(params))
    kind, frame_id = rows[0] if rows else (None, None)
    at = context.where(frame_id)
    if kind == "barrier":
        return (f"Remove the barrier at {at} from the loop: the collectives after it already wait for every rank, and a barrier "
                "only adds a round trip (keep one before timing or checkpointing, outside the steps).")
    if kind == "scatter":
        return _scatter_fix(context, frame_id, at)
    if kind == "broadcast":
        return (f"Broadcast less at {at}: values that stay equal on every rank (parameters after an all-reduced update) need it "
                "once, before the loop; the rest can go as one flattened tensor (torch.cat, then split) rather than one call each.")
    if kind in ("send", "recv"):
        return (f"Send fewer, larger messages at {at}: one per micro-batch of activations at most, started with isend/irecv so "
                "that they overlap the next micro-batch's compute.")
    if kind == "collective_permute":  # XLA's (JAX's `ppermute`), not torch's point-to-point calls
        return (f"Permute fewer, larger blocks at {at}: in a `shard_map` ring (`jax.lax.ppermute` of each hop), concatenate "
                "the arrays a hop passes into one, and start the next hop's ppermute before computing on the block in hand, "
                "so that XLA's asynchronous collective-permute runs under that compute.")
    if kind is not None and collective_phases(context).moves_activations(kind, frame_id):
        return forward_fix(context, kind, frame_id)
    ddp = any(cause.startswith("ddp") for cause in run_cause_kinds(context))
    return (f"Bucket them (the most calls are at {at}): " + ("a larger DDP `bucket_cap_mb`, or " if ddp else "")
            + "flatten small tensors into one before reducing (torch.cat, one all_reduce, then split).")




def _scatter_fix(context: AnalysisContext, frame_id: int | None, at: str) -> str:
    """A scatter in the steps sends each rank its piece of one rank's tensor; `distribute_tensor` runs one each call for
    a Shard placement, and drops the tensor every other rank made."""
    location = context.trace.frame(frame_id) if frame_id is not None else None
    text = line_text(location, context.trace) or ""
    if "distribute_tensor" in text:
        return (f"distribute_tensor at {at} scatters rank 0's tensor to the ranks every call, and the tensors the other ranks made "
                "there are dropped: in the loop, make each rank's own piece (its part of the batch) and wrap it with "
                "`DTensor.from_local(piece, mesh, placements)`, which sends nothing; keep distribute_tensor for set-up "
                "(parameters, before the loop).")
    return (f"The scatter at {at} sends each rank its piece of one rank's tensor every step: where a rank can load or make its "
            "own piece (a data loader with a DistributedSampler, a slice by rank), do that and send nothing.")
