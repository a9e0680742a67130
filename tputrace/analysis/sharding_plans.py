"""Sharding: redistributions that a different tensor-parallel plan (or a different line of the model)
avoids, and parameters the plan leaves replicated. Each finding is at the line to change; costs are the
measured time of the collectives the change removes, per steady step, with the same bytes' time on the
target's ICI (`ici_estimate_ns`) in the explanation.

- Activation gathers between tensor-parallel layers: a `ColwiseParallel(output_layouts=Replicate())`
  all-gathers its output every forward; when the plan's next layer of the same parent module is
  column-parallel too, keeping the first's output sharded (`ColwiseParallel()`) and making the next
  `RowwiseParallel()` replaces two gathers by one all-reduce. Cost: the gathers and the next layer's
  backward collectives.
- Redistributions an op's sharding propagation asks for, at the op's line, with a fix by the kind of op.
- Round trips: a gather from Shard to Replicate that the same step splits back. Cost: the gathers.
- Partial sums reduced again in a step. Cost: the repeated reductions.
- Modules next to planned ones whose parameters stay replicated. Cost: memory only.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Evidence, Finding
from tputrace.analysis.sharding_common import NAME, Collected, TimeByCause, evidence, ici_estimate_ns, location, per_step, in_steady_steps
from tputrace.analysis.sharding_placements import changed_dims, only_reduces, reduced, reduction_dims
from tputrace.store.records import CollectiveCauseRecord, ParameterPlacementRecord, SourceLocation
from tputrace.store.sharding import CausedCollective, ShardingRecords
from tputrace.wording import format_bytes, format_ns, plural

UNPLANNED_MIN_BYTES = 64 * 1024  # replicated parameters below this are not worth a warning


def activation_gathers(context: AnalysisContext, out: Collected, records: ShardingRecords,
                        by_cause: TimeByCause, world: int) -> float:
    """ColwiseParallel layers that gather their output when the plan's next layer is column-parallel too,
    one finding per plan line (a plan applied in a loop over blocks names every block's module)."""
    styles = _styles_by_module(records)
    order = list(styles)
    by_line: dict[tuple[str, int] | str, list[_Gather]] = defaultdict(list)
    for cause_id, (count, dur_ns, nbytes) in by_cause.items():
        cause = records.causes.get(cause_id)
        if cause is None or cause.kind != "redistribute" or cause.phase != "forward" or cause.op != "ColwiseParallel output_layouts":
            continue
        if not (cause.src_placements or "").startswith("Shard") or "Replicate" not in (cause.dst_placements or ""):
            continue
        module = cause.module or "?"
        following = order[order.index(module) + 1:] if module in order else []
        next_module = following[0] if following else None
        # the next layer of the same parent (an MLP's up and down projections): across parents, a residual
        # add or a norm between the layers may need the whole activation
        if next_module is None or next_module.rsplit(".", 1)[0] != module.rsplit(".", 1)[0] or not styles[next_module][0].startswith("ColwiseParallel"):
            continue
        # the plan change also removes the next layer's backward all-reduce of its (gathered) input's gradient
        next_backward_ns = sum(dur for other_id, (_, dur, _) in by_cause.items()
                               if (other := records.causes.get(other_id)) is not None and other.module == next_module and other.phase == "backward")
        gather = _Gather(cause, module, count, dur_ns, nbytes, next_module, next_backward_ns)
        key = (cause.origin.file, cause.origin.line) if cause.origin is not None else module
        by_line[key].append(gather)
    explained = 0.0
    steps = max(context.steady_count, 1)
    for gathers in by_line.values():
        first = gathers[0]
        cause, module, next_module = first.cause, first.module, first.next_module
        next_style, next_origin = styles[next_module]
        gather_ns = sum(gather.dur_ns for gather in gathers)
        calls = sum(gather.count for gather in gathers)
        gathered_bytes = sum(gather.nbytes * gather.count for gather in gathers)
        target_ns = ici_estimate_ns("all_gather", gathered_bytes, world, context.target.ici_bandwidth) / steps
        cost = per_step(context, gather_ns + sum(gather.next_backward_ns for gather in gathers))
        explained += cost["cost_total_ns"] or 0.0
        modules = [gather.module for gather in gathers]
        named = module if len(modules) == 1 else f"{module} and {plural(len(modules) - 1, 'other module')}"
        out.findings.append(Finding(
            analyzer=NAME,
            severity=context.severity(context.share_of_steps(gather_ns), warning=0.02, critical=0.2),
            title=f"Tensor-parallel plan: {named} all-gather their output ({cause.global_shape}) for the next column-parallel layer"
            if len(modules) > 1 else f"Tensor-parallel plan: {module} all-gathers its output ({cause.global_shape}) for the next column-parallel layer",
            explanation=(
                f"This plan entry is ColwiseParallel with output_layouts=Replicate(): every forward all-gathers the "
                f"{cause.src_placements} output ({format_bytes(gathered_bytes / max(calls, 1))} a call, {plural(calls, 'call')} in the "
                f"steady steps, {format_ns(gather_ns / steps)} a step here; about {format_ns(target_ns)} a step on "
                f"{context.target.label}'s ICI), and the next layer ({next_module}) splits its weight by output features again, "
                f"so its backward all-reduces its input's gradient too. A column-parallel layer followed by a row-parallel one "
                f"needs a single all-reduce each way."
            ),
            suggestion=(
                f"In the plan, make this entry `ColwiseParallel()` (keep the output sharded on its last dim) and the next one "
                f"({next_module.rsplit('.', 1)[-1]}) `RowwiseParallel()`" + (f" at {next_origin.short}" if next_origin is not None else "") + "."
            ),
            evidence=tuple(
                evidence(f"{gather.module}: {gather.cause.src_placements} -> {gather.cause.dst_placements}, {gather.cause.global_shape}, "
                          f"{plural(gather.count, 'call')}", gather.cause.origin, gather.module) for gather in gathers[:5]
            ) + (evidence(f"{next_module}: {next_style}", next_origin, next_module),),
            module=module,
            **cost,
            **location(cause.origin),
        ))
    return explained


@dataclass(frozen=True)
class _Gather:
    """One module's output all-gathers that a different plan avoids."""

    cause: CollectiveCauseRecord
    module: str
    count: int
    dur_ns: float
    nbytes: int
    next_module: str
    next_backward_ns: float


def op_redistributions(context: AnalysisContext, out: Collected, records: ShardingRecords, world: int, claimed: frozenset[int] = frozenset()) -> float:
    """Collectives an op's sharding propagation asked for: the op wanted an operand in other placements.
    One finding per op, placements and the user line that ran the op; causes in `claimed` are another
    finding's (the first reduction of partial sums that `reduced_again` reports)."""
    groups: dict[tuple[str, str, str, int | None], list[CausedCollective]] = defaultdict(list)
    for collective in records.collectives:
        cause = records.causes.get(collective.cause_id) if collective.cause_id is not None else None
        if cause is None or cause.kind != "redistribute" or not (cause.op or "").startswith("aten.") or not in_steady_steps(context, collective):
            continue
        if collective.cause_id in claimed:
            continue
        groups[(cause.op or "", cause.src_placements or "", cause.dst_placements or "", collective.frame_id)].append(collective)
    explained = 0.0
    steps = max(context.steady_count, 1)
    for (op, src, dst, frame_id), collectives in sorted(groups.items(), key=lambda item: -sum(c.dur_ns for c in item[1])):
        if _is_optimizer(op) and reduction_dims(src, dst):
            # the gradient's sum over the data-parallel ranks stays whatever the parameter's placement: an update that
            # only needs it is data parallelism working, and the all-reduces of one that also moves a shard are not the move's
            if only_reduces(src, dst):
                continue
            collectives = [collective for collective in collectives if collective.kind != "all_reduce"] or collectives
        dur_ns = sum(collective.dur_ns for collective in collectives)
        share = context.share_of_steps(dur_ns)
        if share < 0.01:
            continue
        cause = records.causes[collectives[0].cause_id]  # type: ignore[index]
        kind = collectives[0].kind
        target_ns = sum(ici_estimate_ns(c.kind, c.bytes, world, context.target.ici_bandwidth) for c in collectives) / steps
        cost = per_step(context, dur_ns)
        explained += cost["cost_total_ns"] or 0.0
        operand = cause.tensor or "an operand"
        maker = _column_parallel_maker(records, cause.global_shape, src)
        suggestion = _op_fix(op, operand, src, dst, context.where(frame_id), maker)
        out.findings.append(Finding(
            analyzer=NAME,
            severity=context.severity(share, warning=0.05, critical=0.25),
            title=(f"The optimizer step moves a ({cause.global_shape}) gradient from {src} to its parameter's {dst}: {_article(kind)} {kind} "
                   f"every step at {context.where(frame_id)}" if _is_optimizer(op)
                   else f"{op} needs {operand} as {dst}, not {src}: {_article(kind)} {kind} every call at {context.where(frame_id)}"),
            explanation=(
                f"DTensor's sharding rule for {op} has no strategy for {operand} ({cause.global_shape}) placed as {src}, so each call "
                f"first redistributes it to {dst}: {plural(len(collectives), 'call')} in the steady steps, {format_ns(dur_ns / steps)} a step "
                f"here, about {format_ns(target_ns)} a step on {context.target.label}'s ICI."
            ),
            suggestion=suggestion,
            evidence=(evidence(f"{op}: {src} -> {dst}, {cause.global_shape} ({cause.module or 'no plan module'})", cause.origin, cause.module),)
            + ((evidence(f"made by {maker[0]}: ColwiseParallel keeps its output split on the last dim", maker[1], maker[0]),) if maker else ()),
            module=cause.module,
            **cost,
            **context.location_fields(frame_id),
        ))
    return explained


# ops that work along one dim (a sharded one must be gathered first), and ops that reshape
_ALONG_A_DIM = ("softmax", "log_softmax", "layer_norm", "rms_norm", "argmax", "argmin", "cumsum", "sort", "topk", "max.dim", "min.dim")
_RESHAPES = ("view", "reshape", "flatten", "_unsafe_view", "unflatten")
_PRODUCTS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear")


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _sharded_dim(placements: str) -> int | None:
    for placement in placements.split(","):
        if placement.startswith("Shard(") and placement.endswith(")") and placement[6:-1].lstrip("-").isdigit():
            return int(placement[6:-1])
    return None


def _column_parallel_maker(records: ShardingRecords, shape: str | None, src: str) -> tuple[str, SourceLocation | None] | None:
    """The column-parallel module whose output an operand split on its last dim is (its weight has as many
    rows as that dim), with its plan line; None when there is none."""
    sizes = [size for size in (shape or "").split(",") if size]
    dim = _sharded_dim(src)
    if not sizes or dim is None or dim not in (-1, len(sizes) - 1):
        return None
    for parameter in records.parameters:
        weight = (parameter.global_shape or "").split(",")
        if (parameter.wrapper in ("tp", "fsdp+tp") and (parameter.name or "").endswith(".weight") and len(weight) == 2
                and weight[0] == sizes[-1] and (parameter.group or "").startswith("ColwiseParallel") and parameter.module):
            return parameter.module, parameter.origin
    return None


def _is_optimizer(op: str) -> bool:
    return op.removeprefix("aten.").lstrip("_").startswith(_OPTIMIZER_OPS)


def _op_fix(op: str, operand: str, src: str, dst: str, where: str, maker: tuple[str, SourceLocation | None] | None) -> str:
    """The change that removes an op's redistribution, by the kind of op and the mesh dims it changes (on a mesh of
    several dims, the ones it keeps say nothing about the fix)."""
    name = op.removeprefix("aten.").rsplit(".", 1)[0].lstrip("_") if op.count(".") > 1 else op.removeprefix("aten.").lstrip("_")
    changed = changed_dims(src, dst)
    gathers = bool(changed) and all(part.dst == "Replicate()" for part in changed)
    dim = next((sharded for part in changed if (sharded := _sharded_dim(part.src)) is not None), None)
    made = ""
    if maker is not None:
        entry = maker[0].rsplit(".", 1)[-1]
        made = (f" It comes out of the plan entry for {entry}" + (f" at {maker[1].short}" if maker[1] is not None else "")
                + ": ColwiseParallel() splits its output on the last dim.")
    if gathers and dim is not None and any(name.startswith(kind) or name == kind for kind in _ALONG_A_DIM):
        return (f"{name} at {where} works along dim {dim}, which {src} splits over the mesh, so every call gathers the whole tensor.{made} "
                f"Split another dim instead (e.g. the batch or the heads dim: output_layouts=Shard(0) in the plan entry, or "
                f"redistribute to Shard(0) before the op), or make the entry's output Replicate() once (output_layouts=Replicate()) "
                f"where later ops need it whole anyway.")
    if gathers and dim is not None and name in _RESHAPES:
        return (f"The {name} at {where} merges or splits dim {dim}, which is sharded, so DTensor gathers it first.{made} Reshape so "
                f"that dim {dim} stays a dim of its own (move it to the front, or merge only unsharded dims), or shard the leading "
                f"dim of the merge.")
    if gathers and dim is not None and name in _PRODUCTS:
        return (f"The other operand's placement does not pair with {operand} as {src} at {where}: split the matching dim of the other "
                f"operand too (for x @ w with x split on its last dim, w as Shard(0)); the product then comes out Partial and one "
                f"all-reduce of the output replaces the gather.{made}")
    if dim is not None and name in _PRODUCTS and all(part.dst.startswith("Shard(") for part in changed):
        return (f"{name} at {where} cannot pair {operand} split as {src} with the other operand's placement, so each call moves it to "
                f"{dst} first. Make the two agree where they are made: for x @ w with w split on its rows (Shard(0)), x split on its "
                f"last dim (the product comes out Partial, one all-reduce); for x split on the batch (dim 0, data parallelism), w "
                f"Replicate().{made}")
    if name.startswith(_OPTIMIZER_OPS):
        summed = reduction_dims(src, dst)
        stays = (f" The all-reduce over mesh dim {', '.join(str(dim) for dim in summed)} stays: it sums the gradient over the ranks "
                 "that saw different batches (data parallelism)." if summed else "")
        return (f"The optimizer step at {where} updates a parameter placed as {dst} with a gradient that the backward leaves as {src}, "
                f"so every step moves the gradient to {dst}. Distribute that parameter as {reduced(src, dst)}, the placement its gradient "
                f"comes out in (distribute_tensor's placements, or its plan entry), so that parameter and gradient agree "
                f"and the update needs no collective of its own; a parameter left Replicate() where the layers around it are split is "
                f"also held whole on every rank.{stays}")
    return (f"Give {operand} the placement {dst} where it is made (the plan entry's output_layouts, or distribute_tensor's "
            f"placements), or redistribute it once outside the loop when it does not change between steps.{made}")


# optimizer updates, which read a parameter and its gradient in the parameter's placement
_OPTIMIZER_OPS = ("foreach_", "fused_adam", "fused_sgd", "fused_adagrad")


def _styles_by_module(records: ShardingRecords) -> dict[str, tuple[str, SourceLocation | None]]:
    """The tensor-parallel style and plan line of each module, in the model's module order: from the
    parameters' placements, or (for parameters FSDP2 took over) from the style named by the module's causes."""
    from_causes: dict[str, tuple[str, SourceLocation | None]] = {}
    for cause in records.causes.values():
        style = (cause.op or "").split(" ", 1)[0]
        if cause.kind == "redistribute" and cause.module and style.endswith("Parallel"):
            from_causes.setdefault(cause.module, (style, cause.origin))
    styles: dict[str, tuple[str, SourceLocation | None]] = {}
    for parameter in records.parameters:
        module = parameter.module
        if not module or module in styles:
            continue
        if parameter.wrapper == "tp":
            styles[module] = (parameter.group or "", parameter.origin)
        elif module in from_causes:
            styles[module] = from_causes[module]
    for cause_module, cause_style in from_causes.items():
        styles.setdefault(cause_module, cause_style)
    return styles


# ----------------------------------------------------------------- round trips and repeated reductions
def _round_trip_gathers(records: ShardingRecords) -> dict[int, CollectiveCauseRecord]:
    """Gather cause id -> the round trip (a later split back to the same Shard) it starts."""
    trips = [cause for cause in records.causes.values() if cause.kind == "round_trip"]
    gathers: dict[int, CollectiveCauseRecord] = {}
    for cause_id, cause in records.causes.items():
        if cause.kind != "redistribute":
            continue
        for trip in trips:
            if (cause.mesh_id, cause.global_shape, cause.phase, cause.src_placements, cause.dst_placements) == (
                    trip.mesh_id, trip.global_shape, trip.phase, trip.dst_placements, trip.src_placements):
                gathers[cause_id] = trip
                break
    return gathers


def explicit_gathers(context: AnalysisContext, out: Collected, records: ShardingRecords, world: int) -> float:
    """Gathers the script asks for itself in the loop (`full_tensor()`, `redistribute(mesh, [Replicate()])` of a
    Shard), that no round trip explains: one finding per line and placements. Cost: their measured time."""
    trips = _round_trip_gathers(records)
    groups: dict[tuple[str, str, int | None], list[CausedCollective]] = defaultdict(list)
    for collective in records.collectives:
        cause = records.causes.get(collective.cause_id) if collective.cause_id is not None else None
        if (cause is None or cause.kind != "redistribute" or cause.op != "redistribute" or collective.cause_id in trips
                or not in_steady_steps(context, collective)):
            continue
        src, dst = cause.src_placements or "", cause.dst_placements or ""
        if "Shard" not in src or "Replicate" not in dst or "Partial" in src:
            continue
        groups[(src, dst, collective.frame_id)].append(collective)
    explained = 0.0
    steps = max(context.steady_count, 1)
    for (src, dst, frame_id), collectives in sorted(groups.items(), key=lambda item: -sum(c.dur_ns for c in item[1])):
        dur_ns = sum(collective.dur_ns for collective in collectives)
        share = context.share_of_steps(dur_ns)
        if share < 0.01:
            continue
        cause = records.causes[collectives[0].cause_id]  # type: ignore[index]
        shapes = sorted({records.causes[c.cause_id].global_shape or "?" for c in collectives})  # type: ignore[index]
        where = context.where(frame_id)
        target_ns = sum(ici_estimate_ns(c.kind, c.bytes, world, context.target.ici_bandwidth) for c in collectives) / steps
        cost = per_step(context, dur_ns)
        explained += cost["cost_total_ns"] or 0.0
        per_call = sum(c.bytes for c in collectives) / len(collectives)
        out.findings.append(Finding(
            analyzer=NAME,
            severity=context.severity(share, warning=0.05, critical=0.25),
            title=(f"full_tensor() or redistribute() at {where} gathers {'a (' + shapes[0] + ')' if len(shapes) == 1 else plural(len(shapes), 'shape')} "
                   f"DTensor from {src} to {dst}: {_article(collectives[0].kind)} {collectives[0].kind} every step"),
            explanation=(
                f"The script asks for the whole tensor at {where}: each call all-gathers the shards ({format_bytes(per_call)} a call, "
                f"{plural(len(collectives), 'call')} in the steady steps, {format_ns(dur_ns / steps)} a step here, about "
                f"{format_ns(target_ns)} a step on {context.target.label}'s ICI), and every rank then holds and computes on all of it."
            ),
            suggestion=(
                f"Compute on the DTensor instead of gathering it at {where}: ops whose operands' placements pair (x split on its last dim "
                f"@ w as Shard(0)) give a Partial result, reduced once; gather only what must be whole (the loss, a logged value), and a "
                f"value that does not change between steps (a weight read whole) once, before the loop."
            ),
            evidence=tuple(evidence(f"{src} -> {dst}, {shape}", cause.origin, cause.module) for shape in shapes[:3]),
            module=cause.module,
            **cost,
            **context.location_fields(frame_id),
        ))
    return explained


def round_trips(context: AnalysisContext, out: Collected, records: ShardingRecords, world: int) -> float:
    """Gathers from a Shard to Replicate that the same step splits back to the same Shard (a `round_trip`
    cause, recorded at the split): one finding per tensor shape and placements, at the gather's line.
    Cost: the measured time of those gathers (forward and the backward's mirror), per steady step."""
    trips = [cause for cause in records.causes.values() if cause.kind == "round_trip"]
    if not trips:
        return 0.0
    gathers = _round_trip_gathers(records)
    groups: dict[tuple[int | None, str | None, str | None, str | None], list[CausedCollective]] = defaultdict(list)
    for collective in records.collectives:
        started = gathers.get(collective.cause_id) if collective.cause_id is not None else None
        if started is not None and in_steady_steps(context, collective):
            groups[(started.mesh_id, started.global_shape, started.dst_placements, started.src_placements)].append(collective)
    explained = 0.0
    steps = max(context.steady_count, 1)
    for (mesh_id, shape, sharded, replicated), collectives in sorted(groups.items(), key=lambda item: -sum(c.dur_ns for c in item[1])):
        dur_ns = sum(collective.dur_ns for collective in collectives)
        share = context.share_of_steps(dur_ns)
        forward = [collective for collective in collectives if records.causes[collective.cause_id].phase == "forward"]  # type: ignore[index]
        first = (forward or collectives)[0]
        gather = records.causes[first.cause_id]  # type: ignore[index]
        split = next((trip for trip in trips if trip.phase == gather.phase and trip.global_shape == shape and trip.mesh_id == mesh_id), None)
        split_origin = split.origin if split is not None else None
        target_ns = sum(ici_estimate_ns(c.kind, c.bytes, world, context.target.ici_bandwidth) for c in collectives) / steps
        cost = per_step(context, dur_ns)
        explained += cost["cost_total_ns"] or 0.0
        gather_line = gather.origin.short if gather.origin is not None else context.where(first.frame_id)
        split_line = split_origin.short if split_origin is not None else "a later line"
        styled = (gather.op or "").endswith("_layouts")
        out.findings.append(Finding(
            analyzer=NAME,
            severity=context.severity(share, warning=0.02, critical=0.2),
            title=f"Round trip: a {shape} tensor is gathered from {sharded} to {replicated} at {gather_line} and split back to {sharded} at {split_line}",
            explanation=(
                f"Every step all-gathers the {sharded} tensor ({format_bytes(first.bytes)} a call, {plural(len(collectives), 'call')} in the "
                f"steady steps with the backward's mirror gathers, {format_ns(dur_ns / steps)} a step here, about {format_ns(target_ns)} a "
                f"step on {context.target.label}'s ICI) only to take its own shard again: the ops in between see the whole tensor, "
                f"but what comes out is split back as it came in."
            ),
            suggestion=(
                f"Keep it {sharded} between the two lines: in the plan, set this entry's layout to {sharded} rather than {replicated} "
                f"(and the next entry's input_layouts to {sharded})" if styled else
                f"Keep it {sharded} between the two lines: remove the redistribute to {replicated} at {gather_line} and the one back to "
                f"{sharded} at {split_line}; pointwise and row-wise ops run on each shard as they are"
            ) + ".",
            evidence=(evidence(f"gather: {sharded} -> {replicated} ({gather.op or 'redistribute'})", gather.origin, gather.module),
                      evidence(f"split back: {replicated} -> {sharded} ({split.op if split else 'redistribute'})", split_origin,
                               split.module if split else None)),
            module=gather.module,
            **cost,
            **(location(gather.origin) if gather.origin is not None else context.location_fields(first.frame_id)),
        ))
    return explained


def first_reductions(records: ShardingRecords) -> frozenset[int]:
    """The causes of the first reduction of partial sums that a later op reduced again: an op's reduction of
    the same mesh, shape and placements as a `reduce_again` cause, in the same phase or, for a reduction
    again in the backward (an op's gradient reading the Partial tensor the forward saved), in the forward."""
    again = {(cause.mesh_id, cause.global_shape, cause.src_placements, cause.dst_placements, cause.phase)
             for cause in records.causes.values() if cause.kind == "reduce_again" and cause.src_placements}
    return frozenset(cause_id for cause_id, cause in records.causes.items() if cause.kind == "redistribute"
                     and any((cause.mesh_id, cause.global_shape, cause.src_placements, cause.dst_placements, phase) in again
                             for phase in ((cause.phase, "backward") if cause.phase == "forward" else (cause.phase,))))


def reduced_again(context: AnalysisContext, out: Collected, records: ShardingRecords, world: int, first: frozenset[int] = frozenset()) -> float:
    """Partial sums reduced a second time in a step (a `reduce_again` cause): by an op that reads a Partial
    DTensor another op already reduced (`first`: the causes of that earlier reduction), or an all-reduce
    of what a DTensor reduction produced. One finding per line. Cost: the measured time of the repeated
    reductions, per steady step."""
    first_lines = sorted({collective.frame_id for collective in records.collectives
                          if collective.cause_id in first and collective.frame_id is not None})
    groups: dict[int | None, list[CausedCollective]] = defaultdict(list)
    for collective in records.collectives:
        cause = records.causes.get(collective.cause_id) if collective.cause_id is not None else None
        if cause is not None and cause.kind == "reduce_again" and in_steady_steps(context, collective):
            groups[collective.frame_id].append(collective)
    explained = 0.0
    steps = max(context.steady_count, 1)
    for frame_id, collectives in sorted(groups.items(), key=lambda item: -sum(c.dur_ns for c in item[1])):
        dur_ns = sum(collective.dur_ns for collective in collectives)
        causes = [records.causes[c.cause_id] for c in collectives]  # type: ignore[index]
        cause = next((c for c in causes if (c.op or "").startswith("aten.")), causes[0])
        target_ns = sum(ici_estimate_ns(c.kind, c.bytes, world, context.target.ici_bandwidth) for c in collectives) / steps
        cost = per_step(context, dur_ns)
        explained += cost["cost_total_ns"] or 0.0
        where = context.where(frame_id)
        measured = (f"{plural(len(collectives), 'call')} in the steady steps, {format_ns(dur_ns / steps)} a step here, about "
                    f"{format_ns(target_ns)} a step on {context.target.label}'s ICI")
        forward_first = [frame for frame in first_lines if frame != frame_id]
        if cause.phase == "backward" and cause.op != "all_reduce" and forward_first:
            # the gradient of a forward op reduces the Partial tensor it saved: the fix is at the forward's line
            earlier = context.where(forward_first[0])
            op = cause.op or "an op"
            title = f"A ({cause.global_shape}) partial sum is reduced at {earlier} and again in the backward by {op}'s gradient"
            explanation = (f"The tensor is Partial (each rank holds a partial sum). The forward reduces it where an op needs it whole "
                           f"({cause.src_placements} -> {cause.dst_placements}), and the backward of {op}, which saved the Partial tensor, "
                           f"reduces it once more ({measured} for the backward's reductions, at the backward() call {where}).")
            suggestion = (f"Reduce it once, right after the op that made it, before {earlier}: `value = value.redistribute(mesh, [Replicate()])` "
                          f"(or the plan entry's output_layouts=Replicate()); the ops and their gradients then read the reduced tensor.")
            frame_id = forward_first[0]
        elif cause.op != "all_reduce" and _in_optimizer_steps(context, collectives):
            # Partial gradients (a replicated weight fed a sharded input: a SequenceParallel norm's) reach the optimizer,
            # and each of its ops that reads them reduces them anew
            ops = sorted({c.op for c in causes if c.op})
            title = f"The optimizer step at {where} reduces Partial gradients again in each op that reads them"
            explanation = (f"Gradients of replicated parameters whose inputs are sharded (a SequenceParallel norm's weight, a bias "
                           f"after a row-parallel layer) come out of the backward as Partial sums ({cause.src_placements}). Each "
                           f"optimizer op that reads them needs them whole and reduces them anew ({', '.join(ops[:3])}), so one "
                           f"gradient is all-reduced several times a step ({measured} for the repeated reductions).")
            suggestion = ("Reduce each such gradient once, after backward() and before the optimizer step: `for p in "
                          "model.parameters(): if isinstance(p.grad, DTensor) and any(pl.is_partial() for pl in p.grad.placements): "
                          "p.grad = p.grad.redistribute(p.grad.device_mesh, p.placements)`; the optimizer's ops then read reduced "
                          "gradients, as they read the others.")
        elif cause.op == "all_reduce":
            title = f"all_reduce at {where} sums a tensor that the tensor-parallel plan already reduced"
            explanation = (f"The tensor is the output of a Partial -> Replicate reduction earlier in the step (a RowwiseParallel "
                           f"output or a DTensor's full_tensor()), so it already holds the sum over the mesh; this all-reduce "
                           f"sums it again ({measured}), and any division by the world size after it only undoes the second sum.")
            suggestion = f"Remove the all_reduce at {where} (and the division that undoes it): the value is already reduced."
        else:
            op = cause.op or "an op"
            title = f"{op} reduces the partial sums of a {cause.global_shape} tensor again at {where}"
            explanation = (f"The tensor is Partial (each rank holds a partial sum) and more than one op reads it: each op whose "
                           f"sharding rule needs it whole reduces it anew ({cause.src_placements} -> {cause.dst_placements}), so the same "
                           f"value is all-reduced more than once a step ({measured} for the repeated reductions).")
            earlier = ", ".join(context.where(frame) for frame in first_lines[:3]) or "an earlier op"
            suggestion = (f"Reduce it once, before the ops that read it (the one at {where} and the one at {earlier}): "
                          f"`value = value.redistribute(mesh, [Replicate()])` right after the op that made it (or the plan entry's "
                          f"output_layouts=Replicate()), and let every op read that.")
        out.findings.append(Finding(
            analyzer=NAME,
            severity=context.severity(context.share_of_steps(dur_ns), warning=0.02, critical=0.2),
            title=title,
            explanation=explanation,
            suggestion=suggestion,
            evidence=(evidence(f"{cause.op}: {cause.src_placements} -> {cause.dst_placements}, {plural(len(collectives), 'call')}"
                               if cause.src_placements else f"all_reduce of a reduced tensor, {plural(len(collectives), 'call')}", cause.origin, cause.module),),
            module=cause.module,
            **cost,
            **context.location_fields(frame_id),
        ))
    return explained


def _in_optimizer_steps(context: AnalysisContext, collectives: list[CausedCollective]) -> bool:
    """Whether the calls ran inside torch.optim's `Optimizer.step#...` ranges (one per step call)."""
    if not context.trace.has_table("annotations"):
        return False
    ranges = context.trace.sql("SELECT a.start_ns, a.start_ns + a.dur_ns FROM annotations a JOIN strings s ON s.id = a.name_sid "
                               "WHERE a.rank = ? AND s.text LIKE 'Optimizer.step#%' AND a.dur_ns IS NOT NULL", (context.rank,))
    return bool(ranges) and all(any(start <= c.start_ns <= end for start, end in ranges) for c in collectives)


# ----------------------------------------------------------------- parameters outside the plan
def unplanned_parameters(context: AnalysisContext, out: Collected, records: ShardingRecords) -> None:
    """Modules next to tensor-parallel ones (same parent) whose parameters the plan leaves replicated on
    every rank of the mesh. Cost: memory, the bytes per rank that splitting them would save."""
    sharded = [parameter for parameter in records.parameters if parameter.wrapper in ("tp", "fsdp+tp") and parameter.module]
    if not sharded:
        return
    parents = {_parent(parameter.module or "") for parameter in sharded}
    sharded_modules = {parameter.module for parameter in sharded}
    mesh_sizes = records.mesh_dim_sizes(next((parameter.mesh_id for parameter in sharded if parameter.wrapper == "tp"), sharded[0].mesh_id))
    ranks = mesh_sizes[-1] if mesh_sizes else max(len(context.trace.distributed_ranks), 1)
    if ranks < 2:
        return
    modules: dict[str, list[ParameterPlacementRecord]] = defaultdict(list)
    for parameter in records.parameters:
        module = parameter.module or ""
        if parameter.wrapper == "none" and module not in sharded_modules and _parent(module) in parents:
            modules[module].append(parameter)
    # a module with a weight matrix (a linear or embedding layer); norms and biases alone stay replicated by design
    modules = {module: parameters for module, parameters in modules.items()
               if any(len((parameter.global_shape or "").split(",")) == 2 for parameter in parameters)}
    if not modules:
        return
    replicated = {module: sum(parameter.bytes_per_rank or 0 for parameter in parameters) for module, parameters in modules.items()}
    total = sum(replicated.values())
    sharded_bytes = sum(parameter.bytes_per_rank or 0 for parameter in sharded)
    saved = total * (ranks - 1) / ranks
    biggest = max(replicated, key=lambda module: replicated[module])
    plan_origin = next((parameter.origin for parameter in sharded if _parent(parameter.module or "") == _parent(biggest)), sharded[0].origin)
    named = ", ".join(f"{module} ({format_bytes(size)})" for module, size in sorted(replicated.items(), key=lambda item: -item[1])[:5])
    entry = biggest.removeprefix(_parent(biggest) + ".") if "." in biggest else biggest
    out.findings.append(Finding(
        analyzer=NAME,
        severity="warning" if total >= max(sharded_bytes, UNPLANNED_MIN_BYTES) else "info",
        title=f"Tensor-parallel plan leaves {plural(len(replicated), 'module')} replicated next to sharded ones: {named}",
        explanation=(
            f"These modules sit beside the plan's sharded layers but are not in the plan, so each of the {ranks} ranks of the mesh holds "
            f"all of their parameters ({format_bytes(total)} per rank, against {format_bytes(sharded_bytes)} per rank for the sharded "
            f"layers) and computes their whole output: splitting them would save {format_bytes(saved)} per rank and their share of the compute."
        ),
        suggestion=(
            f'Add `"{entry}": ColwiseParallel(output_layouts=Replicate())` to the plan (it splits the weight by output features and '
            f"gathers the output), or ColwiseParallel() when the next layer is RowwiseParallel."
        ),
        cost_total_ns=0.0,
        evidence=tuple(Evidence(f"{module}: {format_bytes(size)} per rank, Replicate()", file=plan_origin.file if plan_origin else None,
                                line=plan_origin.line if plan_origin else None, module=module, table="parameter_placements")
                       for module, size in sorted(replicated.items(), key=lambda item: -item[1])[:5]),
        module=biggest,
        **location(plan_origin),
    ))


def _parent(module: str) -> str:
    return module.rsplit(".", 1)[0] if "." in module else ""
