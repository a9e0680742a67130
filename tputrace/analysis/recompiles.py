"""Recompilation storms: one call site compiled again and again because input shapes keep changing.

Compiles are grouped by call site (the call that triggered them: its line and, where recorded, its
column, so two calls of one op on one line are two sites), kind and program name; a group
whose signatures have the same inputs and dtypes but different dims, and that keeps compiling after
the warm-up step, is a storm. For each storm: which dims vary and the values they took, and a bucket
advisor that weighs compiles saved against padding FLOPs added (a linear-in-the-dim estimate).

A storm whose changing size is the length of a data-dependent result (`x[mask]`, nonzero, unique;
see `data_sizes`) gets no padding advice: the data pipeline does not choose that size. Such storms
are one finding per op and line that made the size, with a fixed-shape rewrite as the fix. Storms
whose size is that of a batch copied from the host (see `host_inputs`) are one finding per copying
line, with one bucketing for all the programs the batch reaches.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tputrace.analysis import compile_cache, data_sizes, host_inputs, program_cache
from tputrace.analysis.call_sites import call_label
from tputrace.analysis.chips import round_up
from tputrace.analysis.context import AnalysisContext, in_list
from tputrace.analysis.data_sizes import SizeOrigin, size_origin
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding, Severity
from tputrace.analysis.shapes import TensorSpec, parse_specs
from tputrace.summary import format_ns
from tputrace.wording import plural

NAME = "recompiles"
MIN_COMPILES = 3  # compiles of one site before it counts as a storm
MIN_STEADY_COMPILES = 2  # ... of which at least this many after the warm-up step
BUCKET_MULTIPLES = (8, 16, 32, 64, 128, 256, 512)
MAX_PROPOSED_PADDING = 0.25  # the proposal keeps padding FLOPs under this share when any option does
MAX_LISTED_PROGRAMS = 6  # programs named in a finding for storms of one data-dependent size
# A recompile's diff names the first op that consumes the changed input, e.g.
# "op 0 aten.embedding.default (train.py:29): arg 1 dim 1: 64 -> 72".
_DIFF_ENTRY = re.compile(r"op \d+ (?P<op>\S+) \((?P<file>[^()]+?):(?P<line>\d+)\): (?P<arg>arg \d+ dim \d+)")


@dataclass(frozen=True)
class CompileRow:
    compile_id: int
    program_id: int | None
    signature: str
    dur_ns: int
    step: int
    runs: int  # executions of the program (how often this shape occurred)
    flops: float  # per execution, from XLA's cost analysis (0 when unknown)
    diff: str | None = None


@dataclass(frozen=True)
class VaryingDim:
    """One logical dim that varies across a site's compiles: every (input, dim) with the same values."""

    positions: tuple[tuple[int, int], ...]
    values: tuple[int, ...]  # per compile, in compile order

    @property
    def label(self) -> str:
        index, dim = self.positions[0]
        more = len(self.positions) - 1
        return f"input {index} dim {dim}" + (f" (and {more} more input dims with the same values)" if more else "")

    @property
    def distinct(self) -> list[int]:
        return sorted(set(self.values))


@dataclass(frozen=True)
class BucketOption:
    """One way to bucket a varying dim: the buckets, compiles needed, padding FLOPs added (estimate)."""

    rule: str
    buckets: tuple[int, ...]
    compiles: int
    compiles_saved: int
    padding_flops: float
    padding_share: float
    estimated_cost_ns: float

    def as_dict(self) -> dict[str, object]:
        return {
            "rule": self.rule, "buckets": list(self.buckets), "compiles": self.compiles,
            "compiles_saved": self.compiles_saved, "padding_flops_estimate": self.padding_flops,
            "padding_share_estimate": self.padding_share, "estimated_cost_ns": self.estimated_cost_ns,
        }


def analyze(context: AnalysisContext) -> AnalysisResult:
    trace, rank = context.trace, context.rank
    result = AnalysisResult(NAME)
    stats = trace.compile_stats(rank=rank)
    result.data["compiles"] = stats.count
    result.data["compile_ns"] = stats.total_ns
    result.data["recompiles"] = stats.recompiles
    result.data["recompile_ns"] = stats.recompile_ns
    first_steady = context.steady_range[0] if context.steady_range and context.step_count >= 3 else None
    evicted = program_cache.evicted_diff_ids(context)  # no shape changed: see the program_cache analyzer
    sites = trace.sql(
        "SELECT kind, name_sid, frame_id, COUNT(*), COALESCE(SUM(dur_ns), 0), COUNT(DISTINCT signature_sid), "
        f"COALESCE(SUM(step >= ?), 0) FROM compiles WHERE rank = ? AND {_not_evicted(evicted)} "
        "GROUP BY kind, name_sid, frame_id ORDER BY 5 DESC",
        (first_steady if first_steady is not None else -1, rank, *evicted),
    )
    site_rows = []
    storms = []
    by_origin: dict[tuple[str, int | None], list[Storm]] = {}
    in_storms: set[int] = set()  # compile ids
    padding_storms: list[tuple[Storm, list[BucketOption], BucketOption | None]] = []
    storm_data: dict[int, dict] = {}  # id(storm) -> its entry in `storms`
    calls_per_line = Counter((kind, name_sid, context.location(frame_id)) for kind, name_sid, frame_id, *_ in sites)
    for kind, name_sid, frame_id, count, total_ns, signatures, steady_compiles in sites:
        site_rows.append({
            "kind": kind, "name": trace.string(name_sid), "where": context.where(frame_id),
            "compiles": count, "compile_ns": total_ns, "signatures": signatures, "steady_compiles": steady_compiles,
        })
        if count < MIN_COMPILES or signatures < MIN_COMPILES:
            continue
        if first_steady is not None and steady_compiles < MIN_STEADY_COMPILES:
            continue
        rows = _compile_rows(context, kind, name_sid, frame_id, evicted)
        dims = varying_dims([row.signature for row in rows])
        if not dims:
            continue
        shares_line = calls_per_line[(kind, name_sid, context.location(frame_id))] > 1
        storm = _storm(context, kind, trace.string(name_sid) or "?", frame_id, rows, dims, shares_line)
        options, best = _bucketing(context, storm)
        storms.append(_storm_data(context, storm, options, best))
        storm_data[id(storm)] = storms[-1]
        in_storms.update(row.compile_id for row in storm.rows)
        if storm.origin is None:
            padding_storms.append((storm, options, best))
        else:
            by_origin.setdefault((storm.origin.family, storm.origin.frame_id), []).append(storm)
    result.data["host_input_storms"] = []
    by_copy_line = _by_copy_line(context, [storm for storm, _, _ in padding_storms])
    for copy_frame, (batch, grouped) in by_copy_line.items():
        finding, data = _host_input_finding(context, copy_frame, batch, grouped)
        result.findings.append(finding)
        result.data["host_input_storms"].append(data)
        for storm in grouped:  # one bucketing of the batch serves every program it reaches
            storm_data[id(storm)].update(copied_at=data["where"], proposed=data["proposed"])
    copied = {id(storm) for _, grouped in by_copy_line.values() for storm in grouped}
    for storm, options, best in padding_storms:
        if id(storm) not in copied:
            result.findings.append(_padding_finding(context, storm, options, best))
    result.data["data_size_storms"] = []
    length_recompiles = data_sizes.length_recompiles_by_origin(context, in_storms, _not_evicted(evicted), evicted)
    for key, grouped in by_origin.items():
        origin = grouped[0].origin
        assert origin is not None
        finding, data = _data_size_finding(context, origin, grouped, length_recompiles.pop(key, []))
        result.findings.append(finding)
        result.data["data_size_storms"].append(data)
    for (family, frame_id), own in length_recompiles.items():
        if len(own) < MIN_COMPILES or len({compile.diff for compile in own}) < data_sizes.MIN_MATCHED_SIZES:
            continue
        origin = SizeOrigin(family, frame_id, data_sizes.module_at(context, family, frame_id), len(own),
                            data_sizes.lengths_at(context, family, frame_id))
        finding, data = _data_size_finding(context, origin, [], own)
        result.findings.append(finding)
        result.data["data_size_storms"].append(data)
    result.data["sites"] = site_rows[:50]
    result.data["storms"] = storms
    return result


def _not_evicted(evicted: list[int], column: str = "diff_sid") -> str:
    """An SQL condition on a diff column that leaves out recompiles after an eviction (`evicted` are their diffs)."""
    return f"({column} IS NULL OR {column} NOT IN {in_list(evicted)})" if evicted else "1"


def _compile_rows(context: AnalysisContext, kind: str, name_sid: int, frame_id: int | None, evicted: list[int]) -> list[CompileRow]:
    trace = context.trace
    frame_clause = "frame_id IS NULL" if frame_id is None else "frame_id = ?"
    params: tuple = (context.rank, kind, name_sid) + (() if frame_id is None else (frame_id,))
    rows = trace.sql(
        "SELECT c.id, c.program_id, c.signature_sid, COALESCE(c.dur_ns, 0), COALESCE(c.step, 0), "
        "COALESCE(p.flops, 0), c.diff_sid FROM compiles c LEFT JOIN programs p ON p.id = c.program_id "
        f"WHERE c.rank = ? AND c.kind IS ? AND c.name_sid IS ? AND c.{frame_clause} AND {_not_evicted(evicted, 'c.diff_sid')} "
        "ORDER BY c.start_ns",
        (*params, *evicted),
    )
    program_ids = [row[1] for row in rows if row[1] is not None]
    runs = program_runs(context, program_ids)
    return [
        CompileRow(compile_id, program_id, trace.string(signature_sid) or "", dur_ns, step,
                   runs.get(program_id, 1) if program_id is not None else 1, float(flops or 0.0), trace.string(diff_sid))
        for compile_id, program_id, signature_sid, dur_ns, step, flops, diff_sid in rows
    ]


def program_runs(context: AnalysisContext, program_ids: list[int]) -> dict[int, int]:
    """How often each program ran: executions, else ops computed by it (strict mode), else 1."""
    if not program_ids:
        return {}
    trace = context.trace
    placeholders = in_list(program_ids)
    runs = dict(trace.sql(
        f"SELECT program_id, COUNT(*) FROM executions WHERE program_id IN {placeholders} GROUP BY program_id",
        program_ids,
    ))
    missing = [program_id for program_id in program_ids if program_id not in runs]
    if missing:
        runs.update(trace.sql(
            f"SELECT program_id, COUNT(*) FROM ops WHERE program_id IN {in_list(missing)} GROUP BY program_id",
            missing,
        ))
    return runs


def varying_dims(signatures: list[str]) -> list[VaryingDim]:
    """The dims that differ across signatures of the same inputs (same count, dtypes and ranks).

    Returns [] when the signatures are not one program at different shapes. (input, dim) pairs that
    took the same values in every compile are one logical dim (a sequence length shared by many inputs).
    """
    parsed = [parse_specs(signature) for signature in signatures]
    if len(parsed) < 2 or len({len(specs) for specs in parsed}) != 1:
        return []
    columns: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for index in range(len(parsed[0])):
        specs: list[TensorSpec | None] = [signature[index] for signature in parsed]
        if any(spec is None for spec in specs):
            if not all(spec is None for spec in specs):
                return []
            continue
        tensors = [spec for spec in specs if spec is not None]
        if len({spec.dtype for spec in tensors}) != 1 or len({len(spec.shape) for spec in tensors}) != 1:
            return []
        for dim in range(len(tensors[0].shape)):
            values = tuple(spec.shape[dim] for spec in tensors)
            if len(set(values)) > 1:
                columns.setdefault(values, []).append((index, dim))
    dims = [VaryingDim(tuple(positions), values) for values, positions in columns.items()]
    return sorted(dims, key=lambda dim: (-len(set(dim.values)), -len(dim.positions)))


def bucket_options(dim: VaryingDim, rows: list[CompileRow], mean_compile_ns: float, exec_ns: float) -> list[BucketOption]:
    """Bucketings of `dim` that need fewer compiles, cheapest (compiles + padding, estimated) first.

    Padding FLOPs assume a program's FLOPs grow linearly with the dim (attention grows faster, so this
    is a lower bound); the padding's time is that share of the measured execution time of the site.
    """
    weights: dict[int, float] = {}
    for value, row in zip(dim.values, rows):
        weights[value] = weights.get(value, 0.0) + row.runs * (row.flops or 1.0)
    distinct = sorted(weights)
    base_flops = sum(weights.values())
    have_flops = any(row.flops for row in rows)
    rules: list[tuple[str, dict[int, int]]] = []
    for multiple in BUCKET_MULTIPLES:
        rules.append((f"multiple of {multiple}", {value: round_up(value, multiple) for value in distinct}))
    rules.append(("power of two", {value: 1 << (value - 1).bit_length() if value > 0 else 0 for value in distinct}))
    options: dict[tuple[int, ...], BucketOption] = {}
    for rule, mapping in rules:
        buckets = tuple(sorted(set(mapping.values())))
        if len(buckets) >= len(distinct) or buckets in options:
            continue
        added = sum(weight * (mapping[value] / value - 1.0) for value, weight in weights.items() if value > 0)
        share = added / base_flops if base_flops else 0.0
        cost = len(buckets) * mean_compile_ns + share * exec_ns
        options[buckets] = BucketOption(rule, buckets, len(buckets), len(distinct) - len(buckets),
                                        added if have_flops else 0.0, share, cost)
    return sorted(options.values(), key=lambda option: (option.estimated_cost_ns, option.compiles))


def propose(options: list[BucketOption], current_cost_ns: float) -> BucketOption | None:
    """The cheapest option (estimated) that keeps padding under `MAX_PROPOSED_PADDING`, else the one with the
    least padding; None when no option beats compiling every shape."""
    if not options:
        return None
    moderate = [option for option in options if option.padding_share <= MAX_PROPOSED_PADDING]
    if moderate:
        return moderate[0]
    least = min(options, key=lambda option: option.padding_share)
    return least if least.estimated_cost_ns < current_cost_ns else None


@dataclass(frozen=True)
class ShapeEntry:
    """Where a varying input enters the program: the first op consuming it, from the recompiles' diffs."""

    op: str
    argument: str
    frame_id: int | None
    module: str | None

    def describe(self, context: AnalysisContext) -> str:
        return f"{self.argument} of {self.op} at {context.where(self.frame_id)}"


def shape_entry(context: AnalysisContext, diffs: list[str | None]) -> ShapeEntry | None:
    """The op, argument and line most often named by the diffs (None when they name none)."""
    entries = Counter(
        (match["op"], match["file"], int(match["line"]), match["arg"])
        for diff in diffs if diff for match in _DIFF_ENTRY.finditer(diff)
    )
    if not entries:
        return None
    (op, file, line, argument), _ = entries.most_common(1)[0]
    trace = context.trace
    frame_id = context.frame_at_line(file, line)
    module = None
    op_sid = trace.string_id(op)
    if frame_id is not None and op_sid is not None:
        modules = trace.sql(
            "SELECT module_sid FROM ops WHERE rank = ? AND op_sid = ? AND frame_id = ? AND module_sid IS NOT NULL "
            "GROUP BY module_sid ORDER BY COUNT(*) DESC LIMIT 1",
            (context.rank, op_sid, frame_id),
        )
        module = trace.string(modules[0][0]) if modules else None
    return ShapeEntry(op, argument, frame_id, module)


@dataclass(frozen=True)
class Storm:
    """One call site's storm: its compiles, the dims that varied, where the shape enters and, when the data chose
    the size (a data-dependent result), the op and line that made it."""

    kind: str
    name: str
    frame_id: int | None
    site: str  # the line, or the call on it when other calls on the line compile the same op
    rows: list[CompileRow]
    dims: list[VaryingDim]
    entry: ShapeEntry | None
    origin: SizeOrigin | None

    @property
    def count(self) -> int:
        return len(self.rows)

    @property
    def total_ns(self) -> int:
        return sum(row.dur_ns for row in self.rows)

    @property
    def recompile_ns(self) -> int:
        return self.total_ns - self.rows[0].dur_ns

    @property
    def steps(self) -> list[int]:
        return sorted({row.step for row in self.rows})

    @property
    def main(self) -> VaryingDim:
        return self.dims[0]


def _storm(context: AnalysisContext, kind: str, name: str, frame_id: int | None, rows: list[CompileRow],
           dims: list[VaryingDim], shares_line: bool) -> Storm:
    """The storm at a site; a dim whose sizes a data-dependent op's lengths explain comes first. A site that
    `shares_line` with other calls compiling the same program name is named by its call."""
    steps = [row.step for row in rows]
    origin = None
    for index, dim in enumerate(dims[:3]):
        origin = size_origin(context, dim.values, steps)
        if origin is not None:
            dims = [dim] + dims[:index] + dims[index + 1:]
            break
    entry = shape_entry(context, [row.diff for row in rows])
    location = context.location(frame_id)
    site = call_label(location, context.trace) if shares_line and location is not None else context.where(frame_id)
    return Storm(kind, name, frame_id, site, rows, dims, entry, origin)


def _storm_data(context: AnalysisContext, storm: Storm, options: list[BucketOption], best: BucketOption | None) -> dict:
    entry, origin = storm.entry, storm.origin
    return {
        "kind": storm.kind, "name": storm.name, "where": context.where(storm.frame_id), "call": storm.site,
        "compiles": storm.count,
        "compile_ns": storm.total_ns, "recompile_ns": storm.recompile_ns, "steps": storm.steps,
        "shape_enters_at": None if entry is None else {
            "op": entry.op, "argument": entry.argument, "where": context.where(entry.frame_id), "module": entry.module,
        },
        "size_from": None if origin is None else {
            "op": origin.family, "what": origin.what, "where": context.where(origin.frame_id), "module": origin.module,
            "lengths": list(origin.lengths),
        },
        "varying_dims": [{"label": dim.label, "positions": [list(p) for p in dim.positions], "values": dim.distinct}
                         for dim in storm.dims],
        "bucket_options": [option.as_dict() for option in options],
        "proposed": best.as_dict() if best and origin is None else None,  # no padding fixes a data-chosen size
        "copied_at": None,  # the line copying the batch whose size this is (then `proposed` is the batch's)
    }


def _bucketing(context: AnalysisContext, storm: Storm) -> tuple[list[BucketOption], BucketOption | None]:
    mean_compile_ns = storm.total_ns / storm.count
    program_ids = [row.program_id for row in storm.rows if row.program_id is not None]
    options = bucket_options(storm.main, storm.rows, mean_compile_ns, context.busy_of_programs(program_ids))
    return options, propose(options, len(storm.main.distinct) * mean_compile_ns)


def _severity(context: AnalysisContext, recompile_ns: float, steps_compiling: int) -> Severity:
    severity = context.severity(context.share_of_wall(recompile_ns))
    if steps_compiling >= max(3, context.step_count // 2) and severity == "info":
        return "warning"
    return severity


def _padding_finding(context: AnalysisContext, storm: Storm, options: list[BucketOption], best: BucketOption | None) -> Finding:
    """A storm whose size comes from the script's inputs: pad them to a few bucket sizes."""
    rows, main, entry, frame_id, site = storm.rows, storm.main, storm.entry, storm.frame_id, storm.site
    count, total_ns, recompile_ns, steps_compiling = storm.count, storm.total_ns, storm.recompile_ns, storm.steps
    dim_name = main.label.split(" (")[0]
    if entry is not None:
        dim_name = f"{entry.argument} of {entry.op}"
    values_text = _values_text(main.distinct)
    evidence = [
        Evidence(f"{dim.label} took {len(dim.distinct)} values: {_values_text(dim.distinct)}", table="compiles")
        for dim in storm.dims[:3]
    ]
    if entry is not None:
        evidence.append(context.evidence_at(
            f"the changing shape enters the program as {entry.describe(context)}", entry.frame_id,
            module=entry.module, table="compiles",
        ))
    evidence.append(context.evidence_at(
        f"{count} compiles" + (f" in {plural(len(steps_compiling), 'step')}" if context.step_count else "")
        + f", {format_ns(total_ns / count)} each on average, "
        f"triggered at {site}", frame_id, table="compiles",
    ))
    for option in options[:5]:
        evidence.append(Evidence(
            f"buckets ({option.rule}) {_values_text(list(option.buckets))}: {option.compiles} compiles "
            f"({option.compiles_saved} saved), +{option.padding_share:.1%} FLOPs from padding (estimate)"
        ))
    if best is not None:
        suggestion = (
            f"Pad {dim_name} up to a few bucket sizes, e.g. {_values_text(list(best.buckets))} ({best.rule}): "
            f"{best.compiles} compiles instead of {len(main.distinct)} ({best.compiles_saved} saved) for about "
            f"{best.padding_share:.1%} more FLOPs (estimate). Pad in the data pipeline (a collate_fn that pads each "
            f"batch to its bucket) and mask the padding in the loss."
        )
    else:
        suggestion = f"Give {dim_name} a fixed size (pad every batch to {main.distinct[-1]}) so the program compiles once."
    anchor = entry.frame_id if entry is not None and entry.frame_id is not None else frame_id
    where = site if context.location(anchor) == context.location(frame_id) else context.where(anchor)
    return Finding(
        analyzer=NAME,
        severity=_severity(context, recompile_ns, len(steps_compiling)),
        title=(
            f"Recompilation storm: {storm.name} compiled {count} times as the shape entering at {where} changes "
            f"({len(main.distinct)} sizes)"
        ),
        explanation=(
            f"The {storm.kind} program {storm.name} (flushed at {site}) was compiled {count} times because its input shapes "
            f"kept changing: {main.label} took {len(main.distinct)} values ({values_text})"
            + (f"; the shape enters the program as {entry.describe(context)}" if entry else "")
            + f". {_compile_cost_text(context, total_ns, recompile_ns, steps_compiling, [row.compile_id for row in rows])}."
        ),
        suggestion=suggestion,
        cost_total_ns=float(recompile_ns),
        cost_per_step_ns=context.per_step(recompile_ns),
        evidence=tuple(evidence),
        module=entry.module if entry else None,
        **context.location_fields(anchor),
    )



def _compile_cost_text(context: AnalysisContext, total_ns: int, recompile_ns: int, steps_compiling: Sequence[int],
                       compile_ids: Sequence[int]) -> str:
    """What a storm's compiles (`compile_ids`) cost, as a finding's explanation says it (no closing full stop),
    with how many of them were loads from the on-disk compile cache."""
    text = (f"Compiling took {format_ns(total_ns)} in all, {format_ns(recompile_ns)} of it recompiles "
            f"({context.share_of_wall(recompile_ns):.0%} of the run)")
    if context.step_count:
        text += f"; compiles happened in {len(steps_compiling)} of {context.step_count} steps"
    loads, load_ns = compile_cache.loads_among(context, compile_ids)
    if loads == len(compile_ids):
        text += f"; all {loads} were loads from the compile cache (--compile-cache), not compiles"
    elif loads:
        text += (f"; {loads} of the {len(compile_ids)} were loads from the compile cache (--compile-cache), "
                 f"{format_ns(load_ns)} of the {format_ns(total_ns)}")
    return text

def _by_copy_line(context: AnalysisContext, storms: list[Storm]) -> dict[int, tuple[Storm, list[Storm]]]:
    """The storms whose changing size is that of a batch copied from the host, by the copying line: first those
    with a varying input of a copy's bytes, then those whose sizes, step by step, are the matched storms'. With
    each line, the storm whose matched input had the most dims (then the most compiles): its changing dim is the
    batch's own, where the others' may be a flattened view's (batch times length)."""
    by_line: dict[int, list[Storm]] = {}
    known: dict[int, set[tuple[int, int]]] = {}
    batch_storm: dict[int, tuple[int, int, Storm]] = {}
    unmatched = []
    for storm in storms:
        steps = [row.step for row in storm.rows]
        varying_inputs = {index for dim in storm.dims for index, _ in dim.positions}
        matched = host_inputs.copy_line(context, [row.signature for row in storm.rows], steps, varying_inputs,
                                        storm.main.values)
        if matched is None:
            unmatched.append(storm)
            continue
        frame_id, dims = matched
        by_line.setdefault(frame_id, []).append(storm)
        known.setdefault(frame_id, set()).update(zip(steps, storm.main.values))
        if frame_id not in batch_storm or (dims, storm.count) > batch_storm[frame_id][:2]:
            batch_storm[frame_id] = (dims, storm.count, storm)
    for storm in unmatched:
        frame_id = host_inputs.line_of_sizes(known, [row.step for row in storm.rows], storm.main.values)
        if frame_id is not None:
            by_line[frame_id].append(storm)
    return {frame_id: (batch_storm[frame_id][2], grouped) for frame_id, grouped in by_line.items()}


def _host_input_finding(context: AnalysisContext, copy_frame: int, batch: Storm, storms: list[Storm]) -> tuple[Finding, dict]:
    """One finding (and its data) for the storms of one batch copied from the host at `copy_frame`: every program
    it reaches compiled once per size it took. One bucketing of the batch's changing dim (`batch`'s main dim,
    and the storms whose sizes are its own step by step) serves them all."""
    storms = sorted(storms, key=lambda storm: -storm.recompile_ns)
    copy_where = context.where(copy_frame)
    rows = [row for storm in storms for row in storm.rows]
    batch_pairs = set(zip((row.step for row in batch.rows), batch.main.values))
    own_dim = [storm for storm in storms
               if set(zip((row.step for row in storm.rows), storm.main.values)) <= batch_pairs]
    values = tuple(value for storm in own_dim for value in storm.main.values)
    sizes = sorted(set(values))
    count = len(rows)
    total_ns = sum(storm.total_ns for storm in storms)
    recompile_ns = sum(storm.recompile_ns for storm in storms)
    steps_compiling = sorted({row.step for row in rows})
    per_size_ns = sum(storm.total_ns / storm.count for storm in storms)  # every program compiled once
    own_rows = [row for storm in own_dim for row in storm.rows]
    program_ids = [row.program_id for row in own_rows if row.program_id is not None]
    options = bucket_options(VaryingDim(batch.main.positions, values), own_rows, per_size_ns,
                             context.busy_of_programs(program_ids))
    best = propose(options, len(sizes) * per_size_ns)
    names = list(dict.fromkeys(storm.name for storm in storms))
    programs = names[0] if len(names) == 1 else f"{len(names)} programs"
    entry = shape_entry(context, [row.diff for row in rows])
    listed = ", ".join(
        f"{storm.name} ({storm.count}×, at {storm.site})" for storm in storms[:MAX_LISTED_PROGRAMS]
    ) + (f" and {len(storms) - MAX_LISTED_PROGRAMS} more" if len(storms) > MAX_LISTED_PROGRAMS else "")
    evidence = [context.evidence_at(
        f"host-to-chip copies at {copy_where} have the bytes of the programs' changing inputs in the steps that compiled",
        copy_frame, table="transfers",
    )]
    for storm in storms[:MAX_LISTED_PROGRAMS]:
        evidence.append(context.evidence_at(
            f"{storm.name}: {storm.count} compiles ({format_ns(storm.recompile_ns)} recompiling), {storm.main.label} "
            f"took {len(storm.main.distinct)} values: {_values_text(storm.main.distinct)}", storm.frame_id, table="compiles",
        ))
    if entry is not None:
        evidence.append(context.evidence_at(
            f"the changing shape enters the program as {entry.describe(context)}", entry.frame_id,
            module=entry.module, table="compiles",
        ))
    for option in options[:5]:
        evidence.append(Evidence(
            f"buckets ({option.rule}) {_values_text(list(option.buckets))}: {plural(option.compiles, 'size')} "
            f"({option.compiles_saved} saved), +{option.padding_share:.1%} FLOPs from padding (estimate)"
        ))
    if best is not None:
        times = "once" if best.compiles == 1 else plural(best.compiles, "time")
        suggestion = (
            f"Pad the batches copied at {copy_where} to a few fixed sizes, e.g. {_values_text(list(best.buckets))} "
            f"({best.rule}): {plural(best.compiles, 'size')} instead of {len(sizes)}, so each program compiles "
            f"{times}, for about {best.padding_share:.1%} more FLOPs (estimate). Pad in the data "
            f"pipeline (in the collate_fn, round the batch's longest length up to its bucket; Hugging Face's collators "
            f"and tokenizers take `pad_to_multiple_of`) and mask the padding in attention and the loss."
        )
    else:
        suggestion = (f"Give the batches copied at {copy_where} a fixed size (pad every batch to {sizes[-1]}) so each "
                      "program compiles once.")
    anchor = entry.frame_id if entry is not None and entry.frame_id is not None else copy_frame
    finding = Finding(
        analyzer=NAME,
        severity=_severity(context, recompile_ns, len(steps_compiling)),
        title=(
            f"Recompilation storm: {programs} compiled {count} times as the batches copied to the chip at "
            f"{copy_where} change shape ({len(sizes)} sizes)"
        ),
        explanation=(
            f"The data copied from the host at {copy_where} came in {len(sizes)} sizes ({_values_text(sizes)}), and "
            f"every program that takes it compiled once per size: {listed}"
            + (f"; the shape enters the programs as {entry.describe(context)}" if entry else "")
            + f". {_compile_cost_text(context, total_ns, recompile_ns, steps_compiling, [row.compile_id for row in rows])}"
            + ". The usual cause is a collate_fn (or a tokenizer's `padding=True`) that pads each batch to its own "
            "longest sequence: on a GPU that saves work, on a TPU nearly every batch is a new shape and so a new "
            "XLA program."
        ),
        suggestion=suggestion,
        cost_total_ns=float(recompile_ns),
        cost_per_step_ns=context.per_step(recompile_ns),
        evidence=tuple(evidence),
        module=entry.module if entry else None,
        **context.location_fields(anchor),
    )
    data = {
        "where": copy_where, "programs": names, "compiles": count, "recompile_ns": recompile_ns, "sizes": sizes,
        "proposed": best.as_dict() if best else None,
    }
    return finding, data


def _data_size_finding(context: AnalysisContext, origin: SizeOrigin, storms: list[Storm],
                       own: list[data_sizes.LengthRecompile]) -> tuple[Finding, dict]:
    """One finding (and its data) for the storms whose changing size one data-dependent op chose (the same
    count reaches several programs: the forward's, the backward's, or each op's in strict mode), with the
    programs compiled again only for a new length of it (`own`; there may be no storm at all when the
    backend passes the length as a non-tensor argument). Bucketing the inputs cannot fix them; computing
    on the full fixed shape can."""
    storms = sorted(storms, key=lambda storm: -storm.recompile_ns)
    where = context.where(origin.frame_id)
    own_ns = sum(compile.dur_ns for compile in own)
    compile_ids = [row.compile_id for storm in storms for row in storm.rows] + [compile.compile_id for compile in own]
    count = sum(storm.count for storm in storms) + len(own)
    total_ns = sum(storm.total_ns for storm in storms) + own_ns
    recompile_ns = sum(storm.recompile_ns for storm in storms) + own_ns
    steps_compiling = sorted({step for storm in storms for step in storm.steps} | {compile.step for compile in own})
    own_names = sorted({compile.name for compile in own})
    sizes = max([len(storm.main.distinct) for storm in storms] + [len({compile.diff for compile in own})])
    program_names = list(dict.fromkeys([storm.name for storm in storms] + own_names))
    programs = program_names[0] if len(program_names) == 1 else f"{len(program_names)} programs"
    listed = ", ".join(
        f"{storm.name} ({storm.count}×, at {storm.site})" for storm in storms[:MAX_LISTED_PROGRAMS]
    ) + (f" and {len(storms) - MAX_LISTED_PROGRAMS} more" if len(storms) > MAX_LISTED_PROGRAMS else "")
    own_text = (
        f" {', '.join(own_names[:3])}{' and more' if len(own_names) > 3 else ''} compiled "
        f"{plural(len(own), 'more time')} for new lengths of it, with the same input shapes (e.g. '{own[0].diff}')."
        if own else ""
    )
    entry = next((storm.entry for storm in storms if storm.entry is not None), None)
    cuts = _data_dependent_flushes(context, origin.frame_id)
    lengths = sorted(set(origin.lengths) | {length for storm in storms if storm.origin for length in storm.origin.lengths})
    evidence = [context.evidence_at(
        f"{origin.family} at {where} made results of length {_values_text(lengths)} (as recorded: a data-dependent "
        f"result may be recorded at its padded length) in the steps that compiled", origin.frame_id,
        module=origin.module, table="ops",
    )]
    for storm in storms[:MAX_LISTED_PROGRAMS]:
        evidence.append(context.evidence_at(
            f"{storm.name}: {storm.count} compiles ({format_ns(storm.recompile_ns)} recompiling), {storm.main.label} "
            f"took {len(storm.main.distinct)} values: {_values_text(storm.main.distinct)}", storm.frame_id, table="compiles",
        ))
    if own:
        evidence.append(context.evidence_at(
            f"{plural(len(own), 'recompile')} of {', '.join(own_names[:3])} for a new length ({format_ns(own_ns)}), "
            f"e.g. '{own[0].diff}'", origin.frame_id, table="compiles",
        ))
    if entry is not None:
        evidence.append(context.evidence_at(
            f"the size enters as {entry.describe(context)}", entry.frame_id, module=entry.module, table="compiles",
        ))
    if cuts:
        evidence.append(context.evidence_at(
            f"{plural(cuts, 'data_dependent flush', 'data_dependent flushes')} at {where} (the fragmented-fusion "
            f"finding counts their cost, not these compiles)", origin.frame_id, table="flushes",
        ))
    fix = data_sizes.FIXES.get(origin.what, "use an op with a fixed output shape")
    took = (
        f" {listed} took it as an input dim" + (f" (it enters as {entry.describe(context)})" if entry else "")
        + f" and compiled once per size it took (up to {sizes} sizes)." if storms else ""
    )
    finding = Finding(
        analyzer=NAME,
        severity=_severity(context, recompile_ns, len(steps_compiling)),
        title=(
            f"Recompilation storm: {programs} compiled {count} times as {origin.what} at {where} changes "
            f"({sizes} sizes)"
        ),
        explanation=(
            f"The changing size is {origin.what} at {where} ({origin.family}): the data decides it, so it differs "
            f"from step to step.{took}{own_text} "
            f"{_compile_cost_text(context, total_ns, recompile_ns, steps_compiling, compile_ids)}"
            + ". Padding batches in the data pipeline cannot help: the size is a count of values, not a batch's shape."
            + (f" The same line also cuts the pending graph ({plural(cuts, 'data_dependent flush', 'data_dependent flushes')}); "
               "the fragmented-fusion finding counts that cost, these compiles are counted here only." if cuts else "")
        ),
        suggestion=f"At {where}: {fix}. Then every step has the same shapes: one compile, and no data-dependent sync.",
        cost_total_ns=float(recompile_ns),
        cost_per_step_ns=context.per_step(recompile_ns),
        evidence=tuple(evidence),
        module=origin.module,
        **context.location_fields(origin.frame_id),
    )
    data = {
        "op": origin.family, "what": origin.what, "where": where, "module": origin.module,
        "programs": program_names, "compiles": count, "recompile_ns": recompile_ns,
        "length_recompiles": len(own), "length_recompile_ns": own_ns,
    }
    return finding, data


def _data_dependent_flushes(context: AnalysisContext, frame_id: int | None) -> int:
    """Flushes a data-dependent op made at `frame_id` (DeferAndFuse), in the rank's whole run."""
    if frame_id is None:
        return 0
    return context.trace.sql(
        "SELECT COUNT(*) FROM flushes WHERE rank = ? AND trigger = 'data_dependent' AND frame_id = ?",
        (context.rank, frame_id),
    )[0][0]


def _values_text(values: list[int], limit: int = 12) -> str:
    shown = ", ".join(str(value) for value in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")
