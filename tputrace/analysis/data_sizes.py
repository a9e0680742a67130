"""Sizes the data chose: the lengths of data-dependent results (`x[mask]`, nonzero, unique, ...) per step.

A recompilation storm whose changing dim took, step after step, the length of such a result is not
fixable in the data pipeline: the size is a count of values, not a batch's shape. The ops table
records every data-dependent op with its output shape, step and line; `size_origin` finds the op
whose lengths explain a storm's sizes. The backend compiles a data-dependent result at its length
rounded up (at most a quarter more, at least `SHORTEST_PADDED`), so a size also matches a length
that one of the two could be the padded form of.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.shapes import TensorSpec, parse_specs

# What a data-dependent length is (a storm finding says it, and picks its fix by it).
MASK_COUNT = "the count of a boolean mask"
NONZERO_COUNT = "the count of nonzero elements"
UNIQUE_COUNT = "the number of unique values"
BINCOUNT_LENGTH = "the largest value plus one (bincount)"
REPEATS_SUM = "the sum of the repeats"
# ATen op families (without overload) whose output length depends on the values, and what the length is.
WHAT_THE_LENGTH_IS: dict[str, str] = {
    "aten.index": MASK_COUNT,
    "aten.masked_select": MASK_COUNT,
    "aten.nonzero": NONZERO_COUNT,
    "aten.nonzero_static": NONZERO_COUNT,  # the backend runs `nonzero` as this, at the padded count (one length: no storm)
    "aten.argwhere": NONZERO_COUNT,
    "aten.unique": UNIQUE_COUNT,
    "aten._unique": UNIQUE_COUNT,
    "aten._unique2": UNIQUE_COUNT,
    "aten.unique_dim": UNIQUE_COUNT,
    "aten.unique_consecutive": UNIQUE_COUNT,
    "aten.bincount": BINCOUNT_LENGTH,
    "aten.repeat_interleave": REPEATS_SUM,
}
# How to keep each kind of data-dependent length out of the shapes (a storm finding's suggestion).
FIXES: dict[str, str] = {
    MASK_COUNT: (
        "compute on the full fixed shape and weight by the mask instead of selecting with it, e.g. "
        "`loss = (F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=\"none\") * mask.flatten()).sum()"
        " / mask.sum()`, or `torch.where(mask, x, 0)` in place of `x[mask]`"
    ),
    NONZERO_COUNT: (
        "keep the full shape: `torch.where(condition, x, 0)` or multiplying by the condition instead of gathering "
        "the nonzero positions, or `torch.nonzero_static(condition, size=n)` where a fixed number of indices will do"
    ),
    UNIQUE_COUNT: (
        "work over the known range of values instead of the values present, e.g. "
        "`F.one_hot(x, num_values).sum(0) > 0` marks the values that occur, in place of `torch.unique`"
    ),
    BINCOUNT_LENGTH: (
        "count into a fixed number of bins: `torch.zeros(num_bins).index_add_(0, x, torch.ones_like(x, dtype=torch.float))` "
        "or `F.one_hot(x, num_bins).sum(0)`, in place of `torch.bincount`"
    ),
    REPEATS_SUM: "pass `output_size` with a fixed total (pad the repeats up to it)",
}
SHORTEST_PADDED = 16  # shorter data-dependent results are compiled at this length
MIN_MATCHED_SHARE = 0.8  # share of a storm's compiles whose size a data-dependent length must explain
MIN_MATCHED_SIZES = 2  # ... covering at least this many distinct sizes
# A recompile's diff when only a data-dependent length changed (the signature did not): `size 16 -> 20`,
# `output_size 8 -> 12`, `view aten.slice.Tensor: end 37 -> 41`, a fused program's `non-tensor arguments 32 -> 20`.
_LENGTH_DIFF = re.compile(r"(?:^|[\s:])(?:size|output_size|end|non-tensor arguments) \(?\d")
# A slice's new end read at another line: the slice's own diff, or a fused program's view whose one argument changed
# (`op 1 view (train.py:11): non-tensor arguments 56 -> 52`: `table(torch.unique(ids))` at the unique's new count).
_SLICE_END = re.compile(r"view aten\.slice\.Tensor: end \d+ -> (?P<after>\d+)"
                        r"|^op \d+ view \([^()]+\): non-tensor arguments \d+ -> (?P<view_after>\d+)$")
# A fused program's diff names the first op whose arguments changed and its line.
_DIFF_OP = re.compile(r"op \d+ (?P<op>\S+) \((?P<where>[^()]+)\): ")


@dataclass(frozen=True)
class DataSize:
    """One data-dependent result: its length, the step and line that made it, and the op."""

    step: int
    length: int
    op: str
    frame_id: int | None
    module: str | None

    @property
    def family(self) -> str:
        """`aten.index.Tensor` -> `aten.index`."""
        return _family(self.op)


@dataclass(frozen=True)
class SizeOrigin:
    """The data-dependent op (family and line) whose lengths explain a storm's changing dim."""

    family: str
    frame_id: int | None
    module: str | None
    matched: int  # the storm's compiles whose size it explains
    lengths: tuple[int, ...]  # the lengths it produced that explain them

    @property
    def what(self) -> str:
        return WHAT_THE_LENGTH_IS.get(self.family, "a data-dependent length")


def data_sizes(context: AnalysisContext) -> dict[int, list[DataSize]]:
    """The rank's data-dependent results by step (cached on the context: several storms ask)."""
    cached = context.cache.get("data_sizes")
    if cached is not None:
        return cached  # type: ignore[return-value]
    trace = context.trace
    patterns = [f"{family}.%" for family in WHAT_THE_LENGTH_IS]
    # Read through `string`, as every name a finding shows: it writes a trace's control characters as escapes.
    named = ((sid, trace.string(sid)) for (sid,) in trace.sql(
        "SELECT id FROM strings WHERE " + " OR ".join("text LIKE ?" for _ in patterns), patterns,
    ))
    op_names = {sid: name for sid, name in named if name is not None}
    by_step: dict[int, list[DataSize]] = {}
    if op_names:
        placeholders = ", ".join("?" for _ in op_names)
        rows = trace.sql(
            "SELECT COALESCE(step, 0), op_sid, inputs_sid, outputs_sid, frame_id, module_sid FROM ops "
            f"WHERE rank = ? AND op_sid IN ({placeholders})",
            (context.rank, *op_names),
        )
        for step, op_sid, inputs_sid, outputs_sid, frame_id, module_sid in rows:
            op = op_names[op_sid]
            length = result_length(op, trace.string(inputs_sid), trace.string(outputs_sid))
            if length is not None:
                by_step.setdefault(step, []).append(DataSize(step, length, op, frame_id, trace.string(module_sid)))
    context.cache["data_sizes"] = by_step
    return by_step


def result_length(op: str, inputs: str | None, outputs: str | None) -> int | None:
    """The data-chosen length of an op's result, or None when the op's output shape follows from its inputs'
    (`aten.index.Tensor` without a boolean index)."""
    results = [spec for spec in parse_specs(outputs) if spec is not None]
    if not results or not results[0].shape:
        return None
    if not op.startswith("aten.index."):
        return results[0].shape[0]
    arguments = [spec for spec in parse_specs(inputs) if spec is not None]
    masks = [spec for spec in arguments[1:] if spec.dtype == "bool"]
    if not arguments or not masks:
        return None
    return _mask_count(arguments[0], masks[0], results[0])


def _mask_count(source: TensorSpec, mask: TensorSpec, result: TensorSpec) -> int | None:
    """The count dim of `source[..., mask, ...]`: the mask's dims are replaced by one dim, its count."""
    rank = len(mask.shape)
    if len(result.shape) != len(source.shape) - rank + 1:
        return None
    for position in range(len(source.shape) - rank + 1):
        if result.shape[:position] == source.shape[:position] and result.shape[position + 1:] == source.shape[position + rank:]:
            return result.shape[position]
    return None


def explains(size: int, length: int) -> bool:
    """Whether a program compiled for `size` could be for a result recorded as `length`: the same, or one the
    padded form of the other (up to a quarter longer, or `SHORTEST_PADDED`). Either side may be padded: the
    ops table may record a result's padded buffer while a later op takes its exact count, or the reverse."""
    shorter, longer = sorted((size, length))
    return longer <= max(SHORTEST_PADDED, -(-shorter * 5 // 4))


def size_origin(context: AnalysisContext, sizes: tuple[int, ...], steps: list[int]) -> SizeOrigin | None:
    """The data-dependent op whose lengths explain `sizes` (one per compile, compiled in `steps`), or None
    when none does for `MIN_MATCHED_SHARE` of the compiles and `MIN_MATCHED_SIZES` sizes. A length made in
    the compile's own step explains it (an exact one before a padded one)."""
    by_step = data_sizes(context)
    if not by_step:
        return None
    votes: Counter[tuple[str, int | None]] = Counter()
    matched_sizes: dict[tuple[str, int | None], set[int]] = {}
    lengths: dict[tuple[str, int | None], set[int]] = {}
    modules: dict[tuple[str, int | None], str | None] = {}
    padded_from = _padded_sizes(sizes, steps, by_step)
    for size, step in zip(sizes, steps):
        candidates = by_step.get(step, [])
        found = [result for result in candidates if result.length == size] or [
            result for result in candidates if explains(size, result.length)
            and (size < result.length or padded_from[(result.family, result.frame_id, result.length)] == {size})
        ]
        for result in found:
            key = (result.family, result.frame_id)
            lengths.setdefault(key, set()).add(result.length)
            modules.setdefault(key, result.module)
        for key in {(result.family, result.frame_id) for result in found}:
            votes[key] += 1
            matched_sizes.setdefault(key, set()).add(size)
    explaining = [(key, matched) for key, matched in votes.items()
                  if matched >= MIN_MATCHED_SHARE * len(sizes) and len(matched_sizes[key]) >= MIN_MATCHED_SIZES]
    if not explaining:
        return None
    # Autograd replays a forward's `x[mask]` in the backward (`grad[mask]`) at the same lengths: the forward's line
    # is where the length is chosen, so it goes before the backward's line at as many votes.
    autograd = autograd_frames(context)
    key, matched = max(explaining, key=lambda item: (item[1], item[0][1] not in autograd))
    return SizeOrigin(key[0], key[1], modules.get(key), matched, tuple(sorted(lengths[key])))


def _padded_sizes(sizes: tuple[int, ...], steps: list[int],
                  by_step: dict[int, list[DataSize]]) -> dict[tuple[str, int | None, int], set[int]]:
    """The sizes above each recorded length (by op family, frame and length) that could be its padded form. A length
    pads to one size, so a length that several larger sizes would need (a beam's `nonzero` of 4 against a sequence
    grown from 2 to 12) is the padded form of none of them."""
    above: dict[tuple[str, int | None, int], set[int]] = {}
    for size, step in zip(sizes, steps):
        for result in by_step.get(step, []):
            if result.length < size and explains(size, result.length):
                above.setdefault((result.family, result.frame_id, result.length), set()).add(size)
    return above


def autograd_frames(context: AnalysisContext) -> set[int]:
    """The frames at which backward ops (`aten.*_backward*`) were recorded: the lines that run autograd
    (`loss.backward()`), where a data-dependent op is the replay of a forward's (cached on the context)."""
    cached = context.cache.get("autograd_frames")
    if cached is not None:
        return cached  # type: ignore[return-value]
    trace = context.trace
    backward_sids = [sid for (sid,) in trace.sql("SELECT id FROM strings WHERE text LIKE 'aten.%backward%'")]
    frames: set[int] = set()
    if backward_sids:
        frames = {frame_id for (frame_id,) in trace.sql(
            f"SELECT DISTINCT frame_id FROM ops WHERE rank = ? AND frame_id IS NOT NULL AND op_sid IN ({', '.join('?' for _ in backward_sids)})",
            (context.rank, *backward_sids),
        )}
    context.cache["autograd_frames"] = frames
    return frames


@dataclass(frozen=True)
class LengthRecompile:
    """A program compiled again only for a new data-dependent length: its signature is the same (the length
    is a non-tensor argument, e.g. of a fused program's `x[mask]` at its padded length), so no storm sees it."""

    compile_id: int
    name: str
    dur_ns: int
    diff: str
    step: int


def length_recompiles_by_origin(context: AnalysisContext, leave_out: set[int], not_evicted: str,
                                evicted: list[int]) -> dict[tuple[str, int | None], list[LengthRecompile]]:
    """Recompiles whose diff names only a new length, by the data-dependent op (family, frame) that made it,
    but for the compile ids in `leave_out` (a storm's already) and those the SQL condition `not_evicted`
    (over `diff_sid`, parameters `evicted`) drops. A fused program's diff names the op and its line
    (`op 0 aten.index.Tensor (train.py:14): non-tensor arguments 24 -> 28`); an op's own program (strict
    mode) is compiled at the op's line."""
    results_by_frame: dict[int | None, Counter[str]] = {}
    for results in data_sizes(context).values():
        for result in results:
            results_by_frame.setdefault(result.frame_id, Counter())[result.family] += 1
    if not results_by_frame:
        return {}
    frames_by_where = {context.where(frame_id): frame_id for frame_id in results_by_frame if frame_id is not None}
    # A compile's frame also has the call's column: it meets the op's frame at the same line.
    frames_by_line = {context.location(frame_id): frame_id for frame_id in results_by_frame if frame_id is not None}
    trace = context.trace
    rows = trace.sql(
        "SELECT id, name_sid, COALESCE(dur_ns, 0), diff_sid, COALESCE(step, 0), frame_id FROM compiles "
        f"WHERE rank = ? AND reason = 'recompile' AND diff_sid IS NOT NULL AND {not_evicted} ORDER BY start_ns",
        (context.rank, *evicted),
    )
    found: dict[tuple[str, int | None], list[LengthRecompile]] = {}
    slice_frames = _slice_frames(context, [frame_id for frame_id in results_by_frame if frame_id is not None])
    for compile_id, name_sid, dur_ns, diff_sid, step, frame_id in rows:
        diff = trace.string(diff_sid) or ""
        if compile_id in leave_out or not _LENGTH_DIFF.search(diff):
            continue
        named = _DIFF_OP.match(diff)
        origin_frame: int | None
        if named is not None:
            origin_frame = frames_by_where.get(named.group("where"), -1)
            if origin_frame not in results_by_frame:
                origin_frame = _sliced_result_frame(context, diff, step, slice_frames)
        else:
            origin_frame = frame_id if frame_id is None else frames_by_line.get(context.location(frame_id), frame_id)
        if origin_frame not in results_by_frame:
            continue
        families = results_by_frame[origin_frame]
        family = _family(named.group("op")) if named is not None else ""
        if family not in families:  # a view or loss of the result, made at the same line
            family = families.most_common(1)[0][0]
        recompile = LengthRecompile(compile_id, trace.string(name_sid) or "?", dur_ns, diff, step)
        found.setdefault((family, origin_frame), []).append(recompile)
    return found


def _slice_frames(context: AnalysisContext, frames: list[int]) -> set[int]:
    """The data-dependent results' lines that also sliced a result (DeferAndFuse keeps `x[mask]` at its padded
    length and slices it to the count, a view that a later line reads)."""
    slice_sid = context.trace.string_id("aten.slice.Tensor")
    if slice_sid is None or not frames:
        return set()
    return {frame_id for (frame_id,) in context.trace.sql(
        f"SELECT DISTINCT frame_id FROM ops WHERE rank = ? AND op_sid = ? AND frame_id IN ({', '.join('?' for _ in frames)})",
        (context.rank, slice_sid, *frames),
    )}


def _sliced_result_frame(context: AnalysisContext, diff: str, step: int, slice_frames: set[int]) -> int:
    """For a diff of a slice's end read at a line without a data-dependent op (`op 5 view (gnn.py:14): view
    aten.slice.Tensor: end 795 -> 796`, `op 1 view (gnn.py:14): non-tensor arguments 56 -> 52`), the line of the data-dependent result of that step, sliced where it was
    made, whose recorded length the new end could be the count of; -1 when there is none."""
    end = _SLICE_END.search(diff)
    if end is None:
        return -1
    after = int(end.group("after") or end.group("view_after"))
    frames = {result.frame_id for result in data_sizes(context).get(step, [])
              if result.frame_id in slice_frames and after <= result.length and explains(after, result.length)}
    return next(iter(frames)) if len(frames) == 1 else -1


def data_dependent_fix(context: AnalysisContext, frame_id: int | None) -> str | None:
    """What to change for the waits of a line whose data-dependent ops are all of one kind of length (a bincount's
    largest value, a mask's count): that length's fix, or None when the line made none or several kinds."""
    kinds = {WHAT_THE_LENGTH_IS[result.family] for results in data_sizes(context).values() for result in results
             if result.frame_id == frame_id and result.family in WHAT_THE_LENGTH_IS}
    if frame_id is None or len(kinds) != 1:
        return None
    (what,) = kinds
    return (f"The line's output length is {what}, which the host learns only by waiting for the chip; "
            f"{FIXES[what]}, so the line keeps one shape and needs no wait.")


def lengths_at(context: AnalysisContext, family: str, frame_id: int | None) -> tuple[int, ...]:
    """The lengths the data-dependent op `family` made at `frame_id`, as recorded."""
    return tuple(sorted({
        result.length for results in data_sizes(context).values() for result in results
        if result.family == family and result.frame_id == frame_id
    }))


def module_at(context: AnalysisContext, family: str, frame_id: int | None) -> str | None:
    """The module that ran the data-dependent op `family` at `frame_id` (None when unknown)."""
    return next((
        result.module for results in data_sizes(context).values() for result in results
        if result.family == family and result.frame_id == frame_id and result.module
    ), None)


def _family(op: str) -> str:
    """`aten.index.Tensor` -> `aten.index`."""
    return op.rsplit(".", 1)[0] if op.count(".") >= 2 else op
