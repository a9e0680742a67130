"""Recompilation storms: one call site compiled again and again because input shapes keep changing.

Compiles are grouped by call site (the call that triggered them: its line and, where recorded, its
column, so two calls of one op on one line are two sites), kind and program name; a group
whose signatures have the same inputs and dtypes but different dims, and that keeps recompiling after
the warm-up step, is a storm (see `storms`). For each storm: which dims vary and the values they took,
and a bucket advisor that weighs compiles saved against padding FLOPs added (see `buckets`).

A storm whose changing size is the length of a data-dependent result (`x[mask]`, nonzero, unique;
see `data_sizes`) gets no padding advice: the data pipeline does not choose that size. Such storms
are one finding per op and line that made the size, with a fixed-shape rewrite as the fix. Storms
whose size is that of a batch copied from the host (see `host_inputs`) are one finding per copying
line, with one bucketing for all the programs the batch reaches; the other storms of one size that changes
step by step (a tensor made on the chip with a size the script chose) are one finding at the line where that
shape first enters a program. The findings are `storm_findings`'.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tputrace.analysis import (
    chip_shapes,
    data_sizes,
    ddp_rebuild,
    dynamic_sizes,
    entry_storms,
    host_inputs,
    index_storms,
    late_recompiles,
    length_functions,
    program_cache,
    size_sets,
    static_recompiles,
    structure_changes,
)
from tputrace.analysis.chip_shapes import ChipShapeStorm
from tputrace.analysis.buckets import BucketOption, bucket_options, propose, signature_layout, varying_dims
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.data_sizes import SizeOrigin
from tputrace.analysis.ddp_rebuild import DdpRebuild
from tputrace.analysis.dynamic_sizes import DynamicSizeRecompiles
from tputrace.analysis.entry_storms import EntryStorm
from tputrace.analysis.index_storms import IndexStorm
from tputrace.analysis.late_recompiles import LateRecompile
from tputrace.analysis.size_sets import SizeSet
from tputrace.analysis.static_recompiles import StaticRecompile
from tputrace.analysis.findings import AnalysisResult, Finding
from tputrace.analysis.storm_findings import (
    DataSizeStorm,
    HostInputStorm,
    data_size_finding,
    host_input_finding,
    padding_finding,
    shared_size_finding,
)
from tputrace.analysis.storms import (
    NAME,
    RECOMPILED,
    CompileRow,
    Storm,
    compile_rows,
    compiles_in_later_half,
    not_evicted,
    storm_at,
)
from tputrace.analysis.structure_changes import StructureStorm

__all__ = ["NAME", "RecompileData", "analyze"]

MIN_COMPILES = 3  # compiles of one site before it counts as a storm
MIN_STEADY_COMPILES = 2  # ... of which at least this many recompiles after the warm-up step (not first compiles)
MAX_LISTED_SITES = 50


@dataclass(frozen=True)
class CompileSite:
    """The compiles of one program name and kind at one call site."""

    kind: str
    name: str | None
    where: str
    compiles: int
    compile_ns: int
    signatures: int  # distinct input signatures
    steady_compiles: int  # recompiles after the warm-up step (every recompile in a run without steps)


@dataclass(frozen=True)
class EntryPoint:
    """Where a storm's changing shape enters its program: the first op that consumes it."""

    op: str
    argument: str
    where: str
    module: str | None


@dataclass(frozen=True)
class SizeSource:
    """The data-dependent op and line whose result lengths are a storm's changing size."""

    op: str
    what: str
    where: str
    module: str | None
    lengths: tuple[int, ...]


@dataclass(frozen=True)
class StormDim:
    """A dim that varied across a storm's compiles: its label, the (input, dim) positions, its distinct values."""

    label: str
    positions: tuple[tuple[int, int], ...]
    values: tuple[int, ...]


@dataclass(frozen=True)
class StormData:
    """One call site's storm. `proposed` is None for a size the data chose (no padding fixes it); for a batch
    copied from the host (`copied_at`, the copying line; `made_at`, the line that made it) it is the batch's
    bucketing."""

    kind: str
    name: str
    where: str
    call: str
    compiles: int
    compile_ns: int
    recompile_ns: int
    steps: tuple[int, ...]
    shape_enters_at: EntryPoint | None
    size_from: SizeSource | None
    varying_dims: tuple[StormDim, ...]
    bucket_options: tuple[BucketOption, ...]
    proposed: BucketOption | None
    copied_at: str | None = None
    made_at: str | None = None  # the host line that made the copied batch (the line to change)


@dataclass(frozen=True)
class CausedCompiles:
    """The compiles a storm finding puts on one line: the line that made the changing shape (or, not knowing it,
    where the shape enters), as the Source view's "caused" column shows them."""

    file: str
    line: int
    compiles: int


@dataclass(frozen=True)
class RecompileData:
    """The rank's compiles and recompiles, the costliest sites, and the storms grouped three ways: per site
    (`storms`), per batch copied from the host, and per data-dependent size."""

    compiles: int
    compile_ns: int
    recompiles: int
    recompile_ns: int
    host_input_storms: tuple[HostInputStorm, ...] = ()
    data_size_storms: tuple[DataSizeStorm, ...] = ()
    sites: tuple[CompileSite, ...] = ()
    storms: tuple[StormData, ...] = ()
    chip_shape_storms: tuple[ChipShapeStorm, ...] = ()  # lengths made by an op on the chip (see `chip_shapes`)
    structure_storms: tuple[StructureStorm, ...] = ()  # ops that change from step to step (see `structure_changes`)
    caused: tuple[CausedCompiles, ...] = ()
    dynamic_sizes: tuple[DynamicSizeRecompiles, ...] = ()  # torch.compile size guards that failed (see `dynamic_sizes`)
    ddp_rebuilds: tuple[DdpRebuild, ...] = ()  # DDP's one bucket rebuild (see `ddp_rebuild`)
    entry_storms: tuple[EntryStorm, ...] = ()  # a size that changes the graph's ops too (see `entry_storms`)
    index_storms: tuple[IndexStorm, ...] = ()  # a view's Python-int position that changes (see `index_storms`)
    late_recompiles: tuple[LateRecompile, ...] = ()  # one steady step's costly recompiles (see `late_recompiles`)
    static_recompiles: tuple[StaticRecompile, ...] = ()  # XLA programs compiled again for one signature
    size_sets: tuple[SizeSet, ...] = ()  # a few sizes compiled once each, then reused (see `size_sets`)


@dataclass(frozen=True)
class _PaddingStorm:
    """A storm whose size the script's inputs chose, with its bucketings and the proposed one."""

    storm: Storm
    options: list[BucketOption]
    best: BucketOption | None


def analyze(context: AnalysisContext) -> AnalysisResult[RecompileData]:
    trace, rank = context.trace, context.rank
    stats = trace.compile_stats(rank=rank)
    first_steady = context.first_steady_after_warm_up
    evicted = program_cache.evicted_diff_ids(context)  # no shape changed: see the program_cache analyzer
    sites = trace.sql(
        "SELECT kind, name_sid, frame_id, COUNT(*), COALESCE(SUM(dur_ns), 0), COUNT(DISTINCT signature_sid), "
        f"COALESCE(SUM(step >= ? AND {RECOMPILED}), 0) FROM compiles WHERE rank = ? AND {not_evicted(evicted)} "
        "GROUP BY kind, name_sid, frame_id ORDER BY 5 DESC",
        (first_steady if first_steady is not None else -1, rank, *evicted),
    )
    site_rows: list[CompileSite] = []
    storm_data: dict[int, StormData] = {}  # id(storm) -> its data, in the order the storms were found
    by_origin: dict[tuple[str, int | None], list[Storm]] = {}
    in_storms: set[int] = set()  # compile ids
    padding_storms: list[_PaddingStorm] = []
    settled: list[Storm] = []  # a fixed set of sizes, each compiled once, then reused: no storm
    found: list[tuple[Storm, bool]] = []  # each storm, and whether its sizes settled
    last_batch = late_recompiles.last_batch_compiles(context, not_evicted(evicted), evicted)
    calls_per_line = Counter((kind, name_sid, context.location(frame_id)) for kind, name_sid, frame_id, *_ in sites)
    for kind, name_sid, frame_id, count, total_ns, signatures, steady_compiles in sites:
        site_rows.append(CompileSite(kind, trace.string(name_sid), context.where(frame_id), count, total_ns, signatures,
                                     steady_compiles))
        if count < MIN_COMPILES or signatures < MIN_COMPILES:
            continue
        if steady_compiles < MIN_STEADY_COMPILES:
            continue  # first compiles only (each a new structure), or recompiles in the warm-up step
        rows = _main_layout(compile_rows(context, kind, name_sid, frame_id, evicted))
        if last_batch and first_steady is not None and \
                steady_compiles - sum(row.compile_id in last_batch for row in rows) < MIN_STEADY_COMPILES:
            continue  # only the last, smaller batch compiled again (see `late_recompiles`)
        if len(rows) < MIN_COMPILES or len({row.signature for row in rows}) < MIN_COMPILES:
            continue
        dims = varying_dims([row.signature for row in rows])
        if not dims:
            continue
        if not context.steps and compiles_in_later_half(context, frame_id, rows) < MIN_STEADY_COMPILES:
            continue  # a run without steps: shapes compiled in the first iterations, then reused, are no storm
        shares_line = calls_per_line[(kind, name_sid, context.location(frame_id))] > 1
        storm = storm_at(context, kind, trace.string(name_sid) or "?", frame_id, rows, dims, shares_line)
        found.append((storm, storm.origin is None and size_sets.settled(context, storm)))
    # A settled set whose sizes a storm still compiling also took is that storm's size (the batch's eager program
    # compiling later than a compiled graph fed the same sizes): one storm, not a storm and a settled set.
    unsettled_sizes = [set(storm.main.distinct) for storm, settles in found if not settles]
    for storm, settles in found:
        if settles and not any(set(storm.main.distinct) <= sizes for sizes in unsettled_sizes):
            settled.append(storm)
            in_storms.update(storm.compile_ids)
            continue
        options, best = _bucketing(context, storm)
        storm_data[id(storm)] = _storm_data(context, storm, options, best)
        in_storms.update(storm.compile_ids)
        if storm.origin is None:
            padding_storms.append(_PaddingStorm(storm, options, best))
        else:
            by_origin.setdefault((storm.origin.family, storm.origin.frame_id), []).append(storm)
    padding_storms = _joined_to_data_sizes(context, by_origin, padding_storms, storm_data)
    findings: list[Finding] = []
    caused: list[tuple[Finding, int]] = []  # each finding, and the compiles it explains
    host_input_storms: list[HostInputStorm] = []
    by_copy_line = _by_copy_line(context, [padding.storm for padding in padding_storms])
    for copy_frame, copied_batch in by_copy_line.items():
        finding, host_input = host_input_finding(context, copy_frame, copied_batch.batch, copied_batch.storms,
                                                 copied_batch.made_at)
        findings.append(finding)
        caused.append((finding, host_input.compiles))
        host_input_storms.append(host_input)
        for storm in copied_batch.storms:  # one bucketing of the batch serves every program it reaches
            storm_data[id(storm)] = dataclasses.replace(storm_data[id(storm)], copied_at=host_input.where,
                                                        made_at=host_input.made_at, proposed=host_input.proposed)
    copied = {id(storm) for copied_batch in by_copy_line.values() for storm in copied_batch.storms}
    for group in _by_shared_size([padding for padding in padding_storms if id(padding.storm) not in copied]):
        if len(group) == 1:
            padding = group[0]
            findings.append(padding_finding(context, padding.storm, padding.options, padding.best))
            caused.append((findings[-1], padding.storm.count))
            continue
        storms = [padding.storm for padding in group]
        finding, proposed = shared_size_finding(context, _first_entered(context, storms), storms)
        findings.append(finding)
        caused.append((finding, sum(storm.count for storm in storms)))
        for storm in storms:  # one bucketing of the size serves every program it reaches
            storm_data[id(storm)] = dataclasses.replace(storm_data[id(storm)], proposed=proposed)
    settled_sets = _take(size_sets.findings(context, settled), findings, caused, set())
    size_storms: list[DataSizeStorm] = []
    length_recompiles = data_sizes.length_recompiles_by_origin(context, in_storms, not_evicted(evicted), evicted)
    explained = in_storms | {compile.compile_id for own in length_recompiles.values() for compile in own}
    data_lengths: list[set[int]] = []  # each data-dependent size's recorded lengths
    for key, grouped in by_origin.items():
        origin = grouped[0].origin
        assert origin is not None
        data_lengths.append(set(origin.lengths))
        finding, size_storm = data_size_finding(context, origin, grouped, length_recompiles.pop(key, []))
        findings.append(finding)
        caused.append((finding, size_storm.compiles))
        size_storms.append(size_storm)
    for (family, frame_id), own in length_recompiles.items():
        if len(own) < MIN_COMPILES or len({compile.diff for compile in own}) < data_sizes.MIN_MATCHED_SIZES:
            continue
        origin = SizeOrigin(family, frame_id, data_sizes.module_at(context, family, frame_id), len(own),
                            data_sizes.lengths_at(context, family, frame_id))
        data_lengths.append(set(origin.lengths))
        finding, size_storm = data_size_finding(context, origin, [], own)
        findings.append(finding)
        caused.append((finding, size_storm.compiles))
        size_storms.append(size_storm)
    chip_shape_storms = []
    for finding, chip_shape in chip_shapes.findings(context, explained, not_evicted(evicted), evicted, data_lengths,
                                                       [set(dim.values) for padding in padding_storms for dim in padding.storm.dims]):
        findings.append(finding)
        caused.append((finding, chip_shape.recompiles))
        chip_shape_storms.append(chip_shape)
    structure_storms = []
    for finding, structure in structure_changes.findings(context, explained, not_evicted(evicted), evicted):
        findings.append(finding)
        caused.append((finding, structure.recompiles))
        structure_storms.append(structure)
    dynamic = _take(dynamic_sizes.findings(context, explained), findings, caused, explained)
    rebuilds = _take(ddp_rebuild.findings(context, explained), findings, caused, explained)
    entries = _take(entry_storms.findings(context, explained, not_evicted(evicted), evicted), findings, caused, explained)
    positions = _take(index_storms.findings(context, explained, not_evicted(evicted), evicted), findings, caused, explained)
    lates = _take(late_recompiles.findings(context, explained, not_evicted(evicted), evicted), findings, caused, explained)
    same_shapes = _take(static_recompiles.findings(context, explained, not_evicted(evicted), evicted), findings, caused,
                        explained)
    data = RecompileData(
        compiles=stats.count, compile_ns=stats.total_ns, recompiles=stats.recompiles, recompile_ns=stats.recompile_ns,
        host_input_storms=tuple(host_input_storms), data_size_storms=tuple(size_storms),
        sites=tuple(site_rows[:MAX_LISTED_SITES]), storms=tuple(storm_data.values()),
        chip_shape_storms=tuple(chip_shape_storms), structure_storms=tuple(structure_storms), dynamic_sizes=tuple(dynamic),
        ddp_rebuilds=tuple(rebuilds), entry_storms=tuple(entries), index_storms=tuple(positions),
        late_recompiles=tuple(lates), static_recompiles=tuple(same_shapes), size_sets=tuple(settled_sets),
        caused=tuple(CausedCompiles(finding.file, finding.line, count) for finding, count in caused
                     if finding.file is not None and finding.line is not None),
    )
    return AnalysisResult(NAME, data, tuple(findings))



class _Recompiling(Protocol):
    @property
    def recompiles(self) -> int: ...


_StormT = TypeVar("_StormT", bound=_Recompiling)


def _take(found: Iterable[tuple[Finding, _StormT, set[int]]], findings: list[Finding], caused: list[tuple[Finding, int]],
          explained: set[int]) -> list[_StormT]:
    """Add each found storm's finding, with the recompiles it explains, and mark its compiles explained for the
    analyzers after it; the storms, in order."""
    storms = []
    for finding, storm, compile_ids in found:
        findings.append(finding)
        caused.append((finding, storm.recompiles))
        storms.append(storm)
        explained |= compile_ids
    return storms

def _joined_to_data_sizes(context: AnalysisContext, by_origin: dict[tuple[str, int | None], list[Storm]],
                          padding_storms: list[_PaddingStorm], storm_data: dict[int, StormData]) -> list[_PaddingStorm]:
    """The storms of no traced origin left once each whose compiles a data-dependent size's storms explain step for
    step (`host_inputs.line_of_sizes`) joins that size's storms: in strict mode `loss.backward()`'s views and matrix
    products take the counts the forward's `x[mask]` chose, and no bucketing there fixes them, the fixed shape at the
    mask's line does."""
    origins = list(by_origin)
    known = {index: {(row.step, value) for storm in by_origin[key] for row, value in zip(storm.rows, storm.main.values)}
             for index, key in enumerate(origins)}
    left = []
    for padding in padding_storms:
        storm = padding.storm
        index = host_inputs.line_of_sizes(known, [row.step for row in storm.rows], storm.main.values) if known else None
        if index is None:
            left.append(padding)
            continue
        grouped = by_origin[origins[index]]
        grouped.append(storm)
        origin = grouped[0].origin
        assert origin is not None
        storm_data[id(storm)] = dataclasses.replace(storm_data[id(storm)], proposed=None, size_from=SizeSource(
            origin.family, origin.what, context.where(origin.frame_id), origin.module, tuple(origin.lengths)))
    return left


def _storm_data(context: AnalysisContext, storm: Storm, options: list[BucketOption], best: BucketOption | None) -> StormData:
    entry, origin = storm.entry, storm.origin
    return StormData(
        kind=storm.kind, name=storm.name, where=context.where(storm.frame_id), call=storm.site, compiles=storm.count,
        compile_ns=storm.total_ns, recompile_ns=storm.recompile_ns, steps=tuple(storm.steps),
        shape_enters_at=None if entry is None else EntryPoint(
            entry.op, entry.argument, context.where(entry.frame_id), entry.module,
        ),
        size_from=None if origin is None else SizeSource(
            origin.family, origin.what, context.where(origin.frame_id), origin.module, tuple(origin.lengths),
        ),
        varying_dims=tuple(StormDim(dim.label, dim.positions, tuple(dim.distinct)) for dim in storm.dims),
        bucket_options=tuple(options),
        proposed=best if origin is None else None,  # no padding fixes a data-chosen size
    )


def _main_layout(rows: list[CompileRow]) -> list[CompileRow]:
    """The site's compiles of its most frequent input layout (dtypes and ranks): a site whose one compile took other
    inputs (a decoding loop's first token, flushed with the prompt's forward, before the cache it then grows) storms
    in the others."""
    by_layout: dict[tuple, list[CompileRow]] = {}
    for row in rows:
        by_layout.setdefault(signature_layout(row.signature), []).append(row)
    return max(by_layout.values(), key=len)


def _bucketing(context: AnalysisContext, storm: Storm) -> tuple[list[BucketOption], BucketOption | None]:
    mean_compile_ns = storm.total_ns / storm.count
    options = bucket_options(storm.main, storm.rows, mean_compile_ns, context.busy_of_programs(storm.program_ids))
    return options, propose(options, len(storm.main.distinct) * mean_compile_ns)


def _by_shared_size(storms: list[_PaddingStorm]) -> list[list[_PaddingStorm]]:
    """The storms in groups of one changing size, in the order their first compiles ran: a storm joins the group
    whose (step, size) pairs explain its own (`host_inputs.line_of_sizes`), or explain them a step earlier (ops
    after a step boundary in the same loop iteration), so the programs that one size reaches are one finding."""
    groups: list[list[_PaddingStorm]] = []
    known: dict[int, set[tuple[int, int]]] = {}  # a group's index -> the (step, size) pairs its storms compiled for
    for padding in sorted(storms, key=lambda padding: padding.storm.rows[0].compile_id):
        storm = padding.storm
        steps = [row.step for row in storm.rows]
        index = host_inputs.line_of_sizes(known, steps, storm.main.values)
        if index is None:
            index = host_inputs.line_of_sizes(known, [step - 1 for step in steps], storm.main.values)
        if index is None:
            index = len(groups)
            groups.append([])
            known[index] = set()
        groups[index].append(padding)
        known[index].update(zip(steps, storm.main.values))
    return _joined_by_length(groups, known)


def _joined_by_length(groups: list[list[_PaddingStorm]], known: dict[int, set[tuple[int, int]]]) -> list[list[_PaddingStorm]]:
    """The groups, with each group whose compiles a function of another group's length explains (a multiple of it,
    its square: a flattened view, attention scores) joined to that group."""
    joined = True
    while joined:
        joined = False
        for index in [index for index in known if groups[index]]:
            others = {other: pairs for other, pairs in known.items() if other != index and groups[other]}
            rows = [row for padding in groups[index] for row in padding.storm.rows]
            target = length_functions.group_of_length(others, rows)
            if target is not None:
                groups[target].extend(groups[index])
                groups[index] = []
                joined = True
    return [group for group in groups if group]


def _first_entered(context: AnalysisContext, storms: list[Storm]) -> Storm:
    """The storm whose changing shape enters a program first in the run: the earliest op (by dispatch order) of those
    the storms' diffs name, at its line; the storm that compiled first when no diff names one."""
    first: tuple[int, Storm] | None = None
    for storm in storms:
        entry = storm.entry
        op_sid = None if entry is None or entry.frame_id is None else context.trace.string_id(entry.op)
        if entry is None or op_sid is None:
            continue
        (seq,), = context.trace.sql("SELECT MIN(seq) FROM ops WHERE rank = ? AND op_sid = ? AND frame_id = ?",
                                    (context.rank, op_sid, entry.frame_id))
        if seq is not None and (first is None or seq < first[0]):
            first = (int(seq), storm)
    return first[1] if first is not None else min(storms, key=lambda storm: storm.rows[0].compile_id)


@dataclass(frozen=True)
class _CopiedBatch:
    """The storms of one batch copied at one line: the storm whose dim is the batch's own, all of them, and the line
    that made the batch on the host (None when the trace does not say)."""

    batch: Storm
    storms: list[Storm]
    made_at: int | None


def _by_copy_line(context: AnalysisContext, storms: list[Storm]) -> dict[int, _CopiedBatch]:
    """The storms whose changing size is that of a batch copied from the host, by the copying line: first those
    with a varying input of a copy's bytes, then those whose sizes, step by step, are the matched storms'. With
    each line, the storm whose matched input had the most dims (then the most compiles): its changing dim is the
    batch's own, where the others' may be a flattened view's (batch times length); and the line that made the
    matched copies on the host."""
    by_line: dict[int, list[Storm]] = {}
    known: dict[int, set[tuple[int, int]]] = {}
    batch_storm: dict[int, tuple[int, int, Storm]] = {}
    copies: dict[int, set[tuple[int, int]]] = {}
    unmatched = []
    for storm in storms:
        steps = [row.step for row in storm.rows]
        varying_inputs = {index for dim in storm.dims for index, _ in dim.positions}
        matched = host_inputs.copy_line(context, [row.signature for row in storm.rows], steps, varying_inputs,
                                        storm.main.values)
        if matched is None:
            unmatched.append(storm)
            continue
        frame_id = matched.frame_id
        by_line.setdefault(frame_id, []).append(storm)
        known.setdefault(frame_id, set()).update(zip(steps, storm.main.values))
        copies.setdefault(frame_id, set()).update(matched.copies)
        if frame_id not in batch_storm or (matched.dims, storm.count) > batch_storm[frame_id][:2]:
            batch_storm[frame_id] = (matched.dims, storm.count, storm)
    for storm in unmatched:
        copy_frame = host_inputs.line_of_sizes(known, [row.step for row in storm.rows], storm.main.values)
        if copy_frame is None:
            copy_frame = length_functions.group_of_length(known, storm.rows)
        if copy_frame is not None:
            by_line[copy_frame].append(storm)
    return {
        frame_id: _CopiedBatch(batch_storm[frame_id][2], grouped, host_inputs.origin_line(context, frame_id, copies[frame_id]))
        for frame_id, grouped in by_line.items()
    }
