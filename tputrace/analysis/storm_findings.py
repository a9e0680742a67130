"""The findings of recompilation storms, on one skeleton (`storm_finding`): a storm whose size comes from
the script's inputs (pad them to buckets), the storms of one batch copied from the host (one bucketing
for every program it reaches), the storms of one size that changes step by step otherwise (a tensor made
on the chip with a size the script chose: one bucketing too), and the storms of one data-dependent size
(compute on a fixed shape).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tputrace.analysis import compile_cache, data_sizes
from tputrace.analysis.buckets import BucketOption, VaryingDim, bucket_options, propose
from tputrace.analysis.context import AnalysisContext, in_list
from tputrace.analysis.data_sizes import LengthRecompile, SizeOrigin
from tputrace.analysis.findings import MEASURED_ON_HOST, Evidence, Finding, Severity
from tputrace.analysis.host_reads import host_read_before, masking_fix
from tputrace.analysis.imported import jax_capture
from tputrace.analysis.index_lists import scatter_of_changing_index, scattered_rows_vary, scatters_at
from tputrace.analysis import bag_ids, partial_batches
from tputrace.analysis.growing_sizes import compiled_graph, growing_suggestion
from tputrace.analysis.storms import NAME, ShapeEntry, Storm, compiled_where, shape_entry
from tputrace.analysis.routing import ROUTING_FIX, routes_tokens
from tputrace.wording import format_ns, plural

MAX_LISTED_PROGRAMS = 6  # programs named in a finding for the storms of one batch or one data-dependent size
MAX_LISTED_OPTIONS = 5  # bucketings listed as evidence
MIN_GROWING_COMPILES = 4  # compiles of a size growing by one amount each time, to call it a growing tensor
_CAT_OPS = ("aten.cat.default", "aten.cat.out")
# Ops that make a tensor on the chip at a size the script gives them (`torch.randn(n, d, device="tpu")`): no data
# pipeline chose that size.
_FACTORY_OPS = ("aten.normal_.", "aten.uniform_.", "aten.random_.", "aten.randn.", "aten.rand.", "aten.randint.",
                "aten.zeros.", "aten.ones.", "aten.full.", "aten.empty.", "aten.arange.", "aten.randperm.")


@dataclass(frozen=True)
class StormCompiles:
    """The compiles one finding covers: how many, their time, the part of it that recompiled, and the steps."""

    count: int
    total_ns: int
    recompile_ns: int
    steps: list[int]  # the steps that compiled
    compile_ids: list[int]


@dataclass(frozen=True)
class HostInputStorm:
    """The storms of one batch copied from the host: the copying line, the programs it reached, the sizes it
    took and the bucketing proposed for them (None when none beats compiling every size); `made_at` is the line
    that made the batch on the host, when the trace says (the line to change)."""

    where: str
    programs: tuple[str, ...]
    compiles: int
    recompile_ns: int
    sizes: tuple[int, ...]
    proposed: BucketOption | None
    made_at: str | None = None


@dataclass(frozen=True)
class DataSizeStorm:
    """The storms of one data-dependent size: the op and line that made it, the programs it reached, and the
    programs compiled again only for a new length of it (`length_recompiles`)."""

    op: str
    what: str
    where: str
    module: str | None
    programs: tuple[str, ...]
    compiles: int
    recompile_ns: int
    length_recompiles: int
    length_recompile_ns: int


def storm_finding(context: AnalysisContext, compiles: StormCompiles, *, programs: str, cause: str, sizes: int,
                  explanation: str, then: str, suggestion: str, evidence: Sequence[Evidence], module: str | None,
                  anchor: int | None) -> Finding:
    """A recompilation storm's finding: `programs` compiled `compiles.count` times as `cause` changes (`sizes`
    sizes), costed at its recompiles. The explanation is `explanation`, what the compiles cost, then `then`."""
    return Finding(
        analyzer=NAME,
        severity=storm_severity(context, compiles.recompile_ns, loop_steps_compiling(context, compiles)),
        title=f"Recompilation storm: {programs} compiled {compiles.count} times as {cause} ({sizes} sizes)",
        explanation=f"{explanation}{_dynamic_graphs_text(context, compiles.compile_ids)}{compile_cost_text(context, compiles)}{then}",
        suggestion=suggestion,
        cost_total_ns=float(compiles.recompile_ns),
        cost_per_step_ns=context.per_step(compiles.recompile_ns),
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(evidence),
        module=module,
        **context.location_fields(anchor),
    )


def _dynamic_graphs_text(context: AnalysisContext, compile_ids: Sequence[int]) -> str:
    """A sentence naming the storm's XLA programs whose torch.compile graph has symbolic sizes (`mark_dynamic`,
    `dynamic=True`): the graph is traced once, but XLA compiles one program per concrete size. '' when none has."""
    if not compile_ids:
        return ""
    names = [name for (name,) in context.trace.sql(
        f"SELECT DISTINCT s.text FROM compiles c JOIN strings s ON s.id = c.name_sid WHERE c.id IN {in_list(compile_ids)} "
        "AND c.kind = 'xla' AND EXISTS (SELECT 1 FROM compiles a JOIN strings sig ON sig.id = a.signature_sid "
        "WHERE a.rank = c.rank AND a.kind = 'aot' AND a.name_sid = c.name_sid AND (sig.text LIKE '%SymInt%' "
        "OR sig.text LIKE '%[s%' OR sig.text LIKE '%,s%'))", tuple(compile_ids),
    )]
    if not names:
        return ""
    names = sorted(names)
    graphs = names[0] if len(names) == 1 else ", ".join(names[:-1][:3]) + (" and " if len(names) <= 4 else ", ... and ") + names[-1]
    one = len(names) == 1
    return (f"{graphs} {'is a graph' if one else 'are graphs'} with dynamic sizes (`mark_dynamic` or `dynamic=True`): "
            f"Dynamo traced {'it' if one else 'them'} once, but the tpu backend compiles one XLA program per concrete "
            "size, so marking the dim dynamic does not save these compiles. ")


def padding_finding(context: AnalysisContext, storm: Storm, options: list[BucketOption], best: BucketOption | None) -> Finding:
    """A storm whose size comes from the script's inputs: pad them to a few bucket sizes."""
    main, entry, frame_id, site = storm.main, storm.entry, storm.frame_id, storm.site
    compiles = StormCompiles(storm.count, storm.total_ns, storm.recompile_ns, storm.steps, storm.compile_ids)
    dim_name = main.label.split(" (")[0]
    if entry is not None:
        dim_name = f"{entry.argument} of {entry.op}"
    evidence = [
        Evidence(f"{dim.label} took {len(dim.distinct)} values: {values_text(dim.distinct)}", table="compiles")
        for dim in storm.dims[:3]
    ]
    evidence.extend(_entry_evidence(context, entry, "the changing shape enters the program as"))
    evidence.append(context.evidence_at(
        f"{storm.count} compiles" + (f" in {plural(len(storm.steps), 'step')}" if context.step_count else "")
        + f", {format_ns(storm.total_ns / storm.count)} each on average, "
        f"triggered at {site}", frame_id, table="compiles",
    ))
    evidence.extend(_bucket_evidence(options, lambda compiles: f"{compiles} compiles"))
    growth, grown_at, each_step = _growth(context, main.values, len(storm.steps), storm.program_ids)
    jax = jax_capture(context, [storm.name])
    if growth is not None:
        grown = dim_name if grown_at is None else f"{dim_name} (the tensor `torch.cat` extends at {context.where(grown_at)})"
        suggestion = growing_suggestion(grown, growth, main.distinct[-1], each_step=each_step, jax=jax,
                                        compiled=compiled_graph(context, storm.compile_ids))
    elif best is not None:
        made_on_chip = entry is not None and entry.op.startswith(_FACTORY_OPS)
        bucketing = (f"e.g. {values_text(list(best.buckets))} ({best.rule}): {plural(best.compiles, 'compile')} instead of "
                     f"{len(main.distinct)} ({best.compiles_saved} saved) for about {best.padding_share_estimate:.1%} more "
                     "FLOPs (estimate)")
        suggestion = (
            f"Give the tensor made on the chip at {context.where(entry.frame_id)} ({entry.op}) a few fixed sizes, "
            f"{bucketing}: pick its size from the buckets where the script chooses it, and mask the padding in the loss."
            if made_on_chip and entry is not None else
            f"Pad {dim_name} up to a few bucket sizes, {bucketing}. Pad the arrays before the jitted call (`np.pad` "
            "or `jnp.pad` to the batch's bucket, in the input pipeline) and mask the padding in the loss; each bucket "
            "compiles once." if jax else
            f"Pad {dim_name} up to a few bucket sizes, {bucketing}. Pad in the data pipeline (a collate_fn that pads "
            "each batch to its bucket) and mask the padding in the loss."
        )
    else:
        suggestion = f"Give {dim_name} a fixed size (pad every batch to {main.distinct[-1]}) so the program compiles once."
    anchor = entry.frame_id if entry is not None and entry.frame_id is not None else frame_id
    module = entry.module if entry else None
    if grown_at is not None:
        anchor, module = grown_at, None  # the cat's line, outside the module that first takes the shape
    where = site if context.location(anchor) == context.location(frame_id) else context.where(anchor)
    changes = "changes" if growth is None else f"grows by {growth} at each compile"
    return storm_finding(
        context, compiles, programs=storm.name, cause=f"the shape entering at {where} {changes}", sizes=len(main.distinct),
        explanation=(
            f"The {storm.kind} program {storm.name} ({compiled_where(context, storm.name, site)}) was compiled "
            f"{storm.count} times because its "
            f"input shapes kept changing: {main.label} took {len(main.distinct)} values ({values_text(main.distinct)})"
            + (f"; the shape enters the program as {entry.describe(context)}" if entry else "")
            + (f"; the programs extend a tensor with `torch.cat` at {context.where(grown_at)}" if grown_at is not None else "")
            + ". "
        ),
        then=".", suggestion=suggestion, evidence=evidence, module=module, anchor=anchor,
    )


def _growth(context: AnalysisContext, values: Sequence[int], steps: int, program_ids: list[int]) -> tuple[int | None, int | None, bool]:
    """(the amount a size grew by at each compile, the line of the `torch.cat` extending it, whether it grew once a
    step): several compiles a step grow a tensor at each call; once a step only where the programs extend it with
    `torch.cat` (a queue of past keys that the loop extends every step), not a size the loop sets step by step."""
    growth = growth_step(values, steps)
    if growth is not None:
        return growth, _concatenated_at(context, program_ids), False
    growth = growth_step(values, steps, each_step=True)
    grown_at = None if growth is None else _concatenated_at(context, program_ids)
    return (growth, grown_at, True) if grown_at is not None else (None, None, False)


def _concatenated_at(context: AnalysisContext, program_ids: list[int]) -> int | None:
    """The line of the programs' most frequent `aten.cat` (what extends a growing tensor); None when they have none."""
    cat_sids = [sid for sid in (context.trace.string_id(name) for name in _CAT_OPS) if sid is not None]
    if not cat_sids or not program_ids:
        return None
    rows = context.trace.sql(
        f"SELECT frame_id FROM ops WHERE rank = ? AND op_sid IN {in_list(cat_sids)} AND program_id IN {in_list(program_ids)} "
        "AND frame_id IS NOT NULL GROUP BY frame_id ORDER BY COUNT(*) DESC LIMIT 1",
        (context.rank, *cat_sids, *program_ids),
    )
    return int(rows[0][0]) if rows else None


def growth_step(values: Sequence[int], steps: int, *, each_step: bool = False) -> int | None:
    """The amount a size grew by from each compile to the next, when it grew by the same amount every time over at
    least `MIN_GROWING_COMPILES` compiles in at most half as many `steps` (several compiles a step: a tensor extended
    at each call; a size that a loop sets step by step grows the same way, once a step), or, `each_step`, in at most
    as many steps; None otherwise."""
    if len(values) < MIN_GROWING_COMPILES or steps > len(values) / (1 if each_step else 2):
        return None
    increments = {after - before for before, after in zip(values, values[1:])}
    if len(increments) != 1:
        return None
    (increment,) = increments
    return increment if increment > 0 else None


# Ops that take images (batch, channels, spatial dims...): a changing dim from 2 on is an image's height or width.
_IMAGE_OPS = ("aten.convolution", "aten._convolution", "aten.conv2d", "aten.conv3d", "aten.max_pool2d", "aten.avg_pool2d",
              "aten.max_pool3d", "aten.avg_pool3d", "aten.upsample_", "aten._upsample_", "aten.adaptive_avg_pool2d")
_ARGUMENT_DIM = re.compile(r"\bdim (\d+)$")


def _image_dim(entry: ShapeEntry) -> bool:
    """Whether the changing shape enters as an image's spatial dim (a convolution's input dim 2 or later)."""
    dim = _ARGUMENT_DIM.search(entry.argument)
    return entry.op.startswith(_IMAGE_OPS) and dim is not None and int(dim.group(1)) >= 2


def host_input_finding(context: AnalysisContext, copy_frame: int, batch: Storm, storms: list[Storm],
                       made_at: int | None = None) -> tuple[Finding, HostInputStorm]:
    """One finding (and its data) for the storms of one batch copied from the host at `copy_frame`: every program
    it reaches compiled once per size it took. One bucketing of the batch's changing dim (`batch`'s main dim,
    and the storms whose sizes are its own step by step) serves them all. With `made_at`, the line that made the
    batch on the host, the finding is at that line (the one to change); else where the shape enters the program."""
    storms = sorted(storms, key=lambda storm: -storm.recompile_ns)
    copy_where = context.where(copy_frame)
    made = _made_text(context, made_at)
    batches = f"the batches made at {made} (copied to the chip at {copy_where})" if made else f"the batches copied at {copy_where}"
    shared = _shared_size(context, batch, storms)
    compiles, sizes, options, best = shared.compiles, shared.sizes, shared.options, shared.best
    names = list(dict.fromkeys(storm.name for storm in storms))
    entry = shape_entry(context, [row.diff for storm in storms for row in storm.rows])
    evidence = [] if made_at is None else [context.evidence_at(
        f"the batches copied at {copy_where} were made at {made} on the host (each copy's origin line)", made_at,
        table="transfers",
    )]
    evidence.append(context.evidence_at(
        f"host-to-chip copies at {copy_where} have the bytes of the programs' changing inputs in the steps that compiled",
        copy_frame, table="transfers",
    ))
    evidence.extend(_program_evidence(context, storms))
    evidence.extend(_entry_evidence(context, entry, "the changing shape enters the program as"))
    evidence.extend(_bucket_evidence(options, lambda count: plural(count, "size")))
    programs = [program_id for storm in storms for program_id in storm.program_ids]
    scatter = (entry.frame_id if entry is not None and scatters_at(context, entry.frame_id) else
               scatter_of_changing_index(context, programs))
    index_lists = scatter is not None
    images = entry is not None and not index_lists and _image_dim(entry)
    bags = bag_ids.bag_ids(entry)
    full = None if index_lists or images or bags else partial_batches.full_batch(batch)
    if full is not None:
        suggestion = partial_batches.suggestion(batches, full)
    elif images:
        suggestion = (
            f"Give {batches} one image size: crop or resize every image to the model's input size in the data "
            f"pipeline (`RandomResizedCrop(size)` and `Resize(size)` make one output size whatever the crop, e.g. "
            f"{sizes[-1]}), so each program compiles once; for multi-scale training keep to a few sizes, each "
            "compiled once."
        )
    elif best is not None and bags:
        suggestion = bag_ids.suggestion(batches, _shared_bucketing_text(best, len(sizes)))
    elif best is not None and index_lists:
        suggestion = (
            f"Pad {batches} to a few fixed sizes, {_shared_bucketing_text(best, len(sizes))}. They hold index lists "
            f"({context.where(scatter)} scatters with them, as a graph network's edge list): pad them with indices of "
            "a dummy row (one extra node, dropped after) or with zero weights, so the padding adds nothing to the real "
            "rows" + ("" if scatter == (entry.frame_id if entry else None) or not scattered_rows_vary(context, programs) else
                      "; pad the rows they index (the nodes) to a fixed count as well, and leave the padded rows out of "
                      "pooling and the loss with a mask") + "."
        )
    elif best is not None:
        suggestion = (
            f"Pad {batches} to a few fixed sizes, {_shared_bucketing_text(best, len(sizes))}. Pad in the data "
            f"pipeline (in the collate_fn, round the batch's longest length up to its bucket; Hugging Face's collators "
            f"and tokenizers take `pad_to_multiple_of`) and mask the padding in attention and the loss."
        )
    else:
        suggestion = (f"Give {batches} a fixed size (pad every batch to {sizes[-1]}) so each "
                      "program compiles once.")
    if made_at is not None:
        anchor = made_at
    else:
        anchor = entry.frame_id if entry is not None and entry.frame_id is not None else copy_frame
    cause = (f"the batches made at {made} change shape" if made
             else f"the batches copied to the chip at {copy_where} change shape")
    finding = storm_finding(
        context, compiles, programs=names[0] if len(names) == 1 else f"{len(storms)} programs", cause=cause,
        sizes=len(sizes),
        explanation=(
            (f"The batches made at {made} and copied to the chip at {copy_where}" if made
             else f"The data copied from the host at {copy_where}")
            + f" came in {len(sizes)} sizes ({values_text(sizes)}), and "
            f"every program that takes it compiled once per size: {_listed_programs(storms)}"
            + (f"; the shape enters the programs as {entry.describe(context)}" if entry else "") + ". "
        ),
        then=(
            partial_batches.THEN if full is not None else bag_ids.THEN if bags else
            ". Index lists of a size that changes from batch to batch (a graph's edges, sampled neighbours) are no "
            "problem on a GPU; on a TPU each size is a new XLA program." if index_lists else
            ". Images cropped or resized to a size that changes from batch to batch (random-resized crops that keep "
            "the crop's size, multi-scale training) are no problem on a GPU; on a TPU each size is a new XLA program."
            if images else
            ". The usual cause is a collate_fn (or a tokenizer's `padding=True`) that pads each batch to its own "
            "longest sequence: on a GPU that saves work, on a TPU nearly every batch is a new shape and so a new "
            "XLA program."
        ),
        suggestion=suggestion, evidence=evidence, module=entry.module if entry and made_at is None else None,
        anchor=anchor,
    )
    return finding, HostInputStorm(copy_where, tuple(names), compiles.count, compiles.recompile_ns, tuple(sizes), best,
                                   context.where(made_at) if made_at is not None else None)


def shared_size_finding(context: AnalysisContext, first: Storm, storms: list[Storm]) -> tuple[Finding, BucketOption | None]:
    """One finding for the storms of one size that changed step by step and that no copy from the host brought
    (a tensor made on the chip with a size the script chose, a slice the script sized): every program it reaches
    compiled once per value. `first` is the storm where the changing shape enters the run first: the finding is
    at that line, with one bucketing of the size (of the storm that saw the most of its values) for every program
    (also returned)."""
    storms = sorted(storms, key=lambda storm: -storm.recompile_ns)
    widest = max(storms, key=lambda storm: (len(storm.main.distinct), storm.count))  # the size's values seen most whole
    shared = _shared_size(context, widest, storms)
    sizes, best, entry = shared.sizes, shared.best, first.entry
    anchor = entry.frame_id if entry is not None and entry.frame_id is not None else first.frame_id
    growth, grown_at, each_step = _growth(context, widest.main.values, len(widest.steps),
                                          [program_id for storm in storms for program_id in storm.program_ids])
    if grown_at is not None:
        anchor = grown_at
    where = context.where(anchor)
    evidence = _program_evidence(context, storms)
    evidence.extend(_entry_evidence(context, entry, "the changing shape first enters a program as"))
    evidence.extend(_bucket_evidence(shared.options, lambda count: plural(count, "size")))
    read = None if growth is not None else host_read_before(context, anchor, set(shared.compiles.steps))
    if growth is not None:
        suggestion = growing_suggestion(f"the shape made at {where}", growth, sizes[-1], each_step=each_step,
                                        jax=jax_capture(context, [storm.name for storm in storms]),
                                        compiled=compiled_graph(context, shared.compiles.compile_ids))
    elif read is not None:
        suggestion = f"At {where}: {masking_fix(*read)}. Then each program compiles once."
    elif best is not None:
        suggestion = (
            f"Give the shape made at {where} a few fixed sizes, {_shared_bucketing_text(best, len(sizes))}. Pad to the "
            f"bucket where the size is chosen and mask the padding in the loss."
        )
    else:
        suggestion = f"Give the shape made at {where} a fixed size (pad it to {sizes[-1]}) so each program compiles once."
    finding = storm_finding(
        context, shared.compiles, programs=f"{len(storms)} programs",
        cause=f"the shape entering at {where} " + ("changes" if growth is None else f"grows by {growth} at each compile"),
        sizes=len(sizes),
        explanation=(
            f"One size changed step by step through {len(sizes)} values ({values_text(sizes)}), and every program it "
            f"reached compiled once per value: {_listed_programs(storms)}"
            + (f"; it first enters a program as {entry.describe(context)}" if entry else "")
            + (f"; the programs extend a tensor with `torch.cat` at {context.where(grown_at)}" if grown_at is not None else "")
            + ". "
        ),
        then=".", suggestion=suggestion, evidence=evidence, anchor=anchor,
        module=entry.module if entry and grown_at is None else None,  # no module at the cat's line
    )
    return finding, best


@dataclass(frozen=True)
class _SharedSize:
    """The compiles of the storms of one changing size, the sizes it took, and its bucketings."""

    compiles: StormCompiles
    sizes: list[int]
    options: list[BucketOption]
    best: BucketOption | None


def _shared_size(context: AnalysisContext, lead: Storm, storms: list[Storm]) -> _SharedSize:
    """The storms' compiles, and one bucketing of `lead`'s main dim for them all: the sizes are those of the storms
    whose (step, size) pairs are `lead`'s own (another storm's dim may be a flattened view, batch times length), and
    a size costs one compile of every program."""
    rows = [row for storm in storms for row in storm.rows]
    lead_pairs = set(zip((row.step for row in lead.rows), lead.main.values))
    own_dim = [storm for storm in storms if set(zip((row.step for row in storm.rows), storm.main.values)) <= lead_pairs]
    values = tuple(value for storm in own_dim for value in storm.main.values)
    sizes = sorted(set(values))
    compiles = StormCompiles(len(rows), sum(storm.total_ns for storm in storms), sum(storm.recompile_ns for storm in storms),
                             sorted({row.step for row in rows}), [row.compile_id for row in rows])
    per_size_ns = sum(storm.total_ns / storm.count for storm in storms)  # every program compiled once
    own_rows = [row for storm in own_dim for row in storm.rows]
    program_ids = [row.program_id for row in own_rows if row.program_id is not None]
    options = bucket_options(VaryingDim(lead.main.positions, values), own_rows, per_size_ns, context.busy_of_programs(program_ids))
    return _SharedSize(compiles, sizes, options, propose(options, len(sizes) * per_size_ns))


def _shared_bucketing_text(best: BucketOption, sizes: int) -> str:
    """'e.g. 32, 64 (multiple of 32): 2 sizes instead of 5, so each program compiles 2 times, for about 12.0% more
    FLOPs (estimate)': a bucketing of one size shared by every program it reaches."""
    times = "once" if best.compiles == 1 else plural(best.compiles, "time")
    return (f"e.g. {values_text(list(best.buckets))} ({best.rule}): {plural(best.compiles, 'size')} instead of {sizes}, "
            f"so each program compiles {times}, for about {best.padding_share_estimate:.1%} more FLOPs (estimate)")


def _made_text(context: AnalysisContext, frame_id: int | None) -> str | None:
    """'data.py:12 in collate()' for the line that made a batch; None when unknown."""
    location = context.location(frame_id)
    if location is None:
        return None
    return f"{location.short} in {location.function}()" if location.function.isidentifier() else location.short


def data_size_finding(context: AnalysisContext, origin: SizeOrigin, storms: list[Storm],
                      own: list[LengthRecompile]) -> tuple[Finding, DataSizeStorm]:
    """One finding (and its data) for the storms whose changing size one data-dependent op chose (the same
    count reaches several programs: the forward's, the backward's, or each op's in strict mode), with the
    programs compiled again only for a new length of it (`own`; there may be no storm at all when the
    backend passes the length as a non-tensor argument). Bucketing the inputs cannot fix them; computing
    on the full fixed shape can."""
    storms = sorted(storms, key=lambda storm: -storm.recompile_ns)
    where = context.where(origin.frame_id)
    own_ns = sum(compile.dur_ns for compile in own)
    compiles = StormCompiles(
        sum(storm.count for storm in storms) + len(own),
        sum(storm.total_ns for storm in storms) + own_ns,
        sum(storm.recompile_ns for storm in storms) + own_ns,
        sorted({step for storm in storms for step in storm.steps} | {compile.step for compile in own}),
        [compile_id for storm in storms for compile_id in storm.compile_ids] + [compile.compile_id for compile in own],
    )
    own_names = sorted({compile.name for compile in own})
    sizes = max([len(storm.main.distinct) for storm in storms] + [len({compile.diff for compile in own})])
    program_names = list(dict.fromkeys([storm.name for storm in storms] + own_names))
    own_text = (
        f" {', '.join(own_names[:3])}{' and more' if len(own_names) > 3 else ''} compiled "
        f"{plural(len(own), 'more time')} for new lengths of it, with the same input shapes (e.g. '{own[0].diff}')."
        if own else ""
    )
    entry = next((storm.entry for storm in storms if storm.entry is not None), None)
    cuts = _data_dependent_flushes(context, origin.frame_id)
    lengths = sorted(set(origin.lengths) | {length for storm in storms if storm.origin for length in storm.origin.lengths})
    evidence = [context.evidence_at(
        f"{origin.family} at {where} made results of length {values_text(lengths)} (as recorded: a data-dependent "
        f"result may be recorded at its padded length) in the steps that compiled", origin.frame_id,
        module=origin.module, table="ops",
    )]
    evidence.extend(_program_evidence(context, storms))
    if own:
        evidence.append(context.evidence_at(
            f"{plural(len(own), 'recompile')} of {', '.join(own_names[:3])} for a new length ({format_ns(own_ns)}), "
            f"e.g. '{own[0].diff}'", origin.frame_id, table="compiles",
        ))
    evidence.extend(_entry_evidence(context, entry, "the size enters as"))
    flushes = plural(cuts, "data_dependent flush", "data_dependent flushes")
    if cuts:
        evidence.append(context.evidence_at(
            f"{flushes} at {where} (the line's host-sync findings count their cost, not these compiles)",
            origin.frame_id, table="flushes",
        ))
    routed = origin.what in (data_sizes.MASK_COUNT, data_sizes.NONZERO_COUNT) and routes_tokens(
        context, origin.family, origin.frame_id, origin.module)
    fix = ROUTING_FIX if routed else data_sizes.FIXES.get(origin.what, "use an op with a fixed output shape")
    routed_text = (" It is how many tokens a routing chose for each expert: the module chose with a top-k (or an "
                   "argmax) and the line selected rows several times a step, once per expert." if routed else "")
    took = (
        f" {_listed_programs(storms)} took it as an input dim" + (f" (it enters as {entry.describe(context)})" if entry else "")
        + f" and compiled once per size it took (up to {sizes} sizes)." if storms else ""
    )
    finding = storm_finding(
        context, compiles, programs=_programs(program_names), cause=f"{origin.what} at {where} changes", sizes=sizes,
        explanation=(
            f"The changing size is {origin.what} at {where} ({origin.family}): the data decides it, so it differs "
            f"from step to step.{routed_text}{took}{own_text} "
        ),
        then=(
            ". Padding batches in the data pipeline cannot help: the size is a count of values, not a batch's shape."
            + (f" The same line also cuts the pending graph and waits for the chip ({flushes}); the line's host-sync "
               "findings count that cost, these compiles are counted here only." if cuts else "")
        ),
        suggestion=f"At {where}: {fix}. Then every step has the same shapes: one compile, and no data-dependent sync.",
        evidence=evidence, module=origin.module, anchor=origin.frame_id,
    )
    data = DataSizeStorm(origin.family, origin.what, where, origin.module, tuple(program_names), compiles.count,
                         compiles.recompile_ns, len(own), own_ns)
    return finding, data


def values_text(values: list[int], limit: int = 12) -> str:
    shown = ", ".join(str(value) for value in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def loop_steps_compiling(context: AnalysisContext, compiles: StormCompiles) -> int:
    """How many of the loop's steps compiled (the work after the loop's last step is no step of it)."""
    return len({step.step for step in context.loop_steps} & set(compiles.steps))


def storm_severity(context: AnalysisContext, recompile_ns: float, steps_compiling: int) -> Severity:
    severity = context.severity(context.share_of_wall(recompile_ns))
    if steps_compiling >= max(3, context.step_count // 2) and severity == "info":
        return "warning"
    return severity


def compile_cost_text(context: AnalysisContext, compiles: StormCompiles) -> str:
    """What a storm's compiles cost, as a finding's explanation says it (no closing full stop), with how many of
    them were loads from the on-disk compile cache."""
    total_ns, recompile_ns = compiles.total_ns, compiles.recompile_ns
    text = (f"Compiling took {format_ns(total_ns)} in all, {format_ns(recompile_ns)} of it recompiles "
            f"({context.share_of_wall(recompile_ns):.0%} of the run)")
    if context.step_count:
        text += f"; compiles happened in {loop_steps_compiling(context, compiles)} of {context.step_count} steps"
    loads, load_ns = compile_cache.loads_among(context, compiles.compile_ids)
    if loads == len(compiles.compile_ids):
        text += f"; all {loads} were loads from the compile cache (--compile-cache), not compiles"
    elif loads:
        text += (f"; {loads} of the {len(compiles.compile_ids)} were loads from the compile cache (--compile-cache), "
                 f"{format_ns(load_ns)} of the {format_ns(total_ns)}")
    return text


def _programs(names: list[str]) -> str:
    """A title's name for the programs: the one program's name, or how many there are."""
    return names[0] if len(names) == 1 else f"{len(names)} programs"


def _listed_programs(storms: list[Storm]) -> str:
    listed = ", ".join(f"{storm.name} ({storm.count}×, at {storm.site})" for storm in storms[:MAX_LISTED_PROGRAMS])
    return listed + (f" and {len(storms) - MAX_LISTED_PROGRAMS} more" if len(storms) > MAX_LISTED_PROGRAMS else "")


def _program_evidence(context: AnalysisContext, storms: list[Storm]) -> list[Evidence]:
    return [
        context.evidence_at(
            f"{storm.name}: {storm.count} compiles ({format_ns(storm.recompile_ns)} recompiling), {storm.main.label} "
            f"took {len(storm.main.distinct)} values: {values_text(storm.main.distinct)}", storm.frame_id, table="compiles",
        )
        for storm in storms[:MAX_LISTED_PROGRAMS]
    ]


def _entry_evidence(context: AnalysisContext, entry: ShapeEntry | None, enters: str) -> list[Evidence]:
    if entry is None:
        return []
    return [context.evidence_at(f"{enters} {entry.describe(context)}", entry.frame_id, module=entry.module, table="compiles")]


def _bucket_evidence(options: list[BucketOption], compiles_text: Callable[[int], str]) -> list[Evidence]:
    return [
        Evidence(
            f"buckets ({option.rule}) {values_text(list(option.buckets))}: {compiles_text(option.compiles)} "
            f"({option.compiles_saved} saved), +{option.padding_share_estimate:.1%} FLOPs from padding (estimate)"
        )
        for option in options[:MAX_LISTED_OPTIONS]
    ]


def _data_dependent_flushes(context: AnalysisContext, frame_id: int | None) -> int:
    """Flushes a data-dependent op made at `frame_id` (DeferAndFuse), in the rank's whole run."""
    if frame_id is None:
        return 0
    (count,), = context.trace.sql(
        "SELECT COUNT(*) FROM flushes WHERE rank = ? AND trigger = 'data_dependent' AND frame_id = ?",
        (context.rank, frame_id),
    )
    return int(count)
