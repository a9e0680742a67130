"""Shapes made on the chip: a program compiled again and again because an op on the chip (a slice
`x[:, :n]`, a `narrow`, an `arange(n)`) took another length each step, with the same input shapes.

The recompiles' diffs name the op and its line (`op 0 view (train.py:10): view aten.slice.Tensor: end 71 -> 88`;
in strict mode the op's own program compiles at its line). Such recompiles that no input-shape storm and no
data-dependent size explains are grouped by that line: it is where the varying length is made, and the line to
change (give the op a few fixed lengths, and mask).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tputrace.analysis.buckets import VaryingDim, bucket_options, propose
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.data_sizes import explains
from tputrace.analysis.findings import Evidence, Finding
from tputrace.analysis.host_reads import host_read_before, masking_fix
from tputrace.analysis.storm_findings import StormCompiles, storm_finding, values_text
from tputrace.wording import plural

MIN_RECOMPILES = 2
MIN_LENGTHS = 3
_DIFF_OP = re.compile(r"op \d+ (?P<op>\S+) \((?P<file>[^()]+?):(?P<line>\d+)\): (?P<change>.*)")
_CHANGE = re.compile(r"(?P<what>end|start|size|length|non-tensor arguments) \(?(?P<before>-?\d+)\)? -> \(?(?P<after>-?\d+)")


@dataclass(frozen=True)
class ChipShapeStorm:
    """The recompiles of one op's line on the chip whose length changed: the op, its line, the lengths it took."""

    op: str
    what: str
    where: str
    programs: tuple[str, ...]
    recompiles: int
    recompile_ns: int
    lengths: tuple[int, ...]


@dataclass(frozen=True)
class _Recompile:
    compile_id: int
    name: str
    dur_ns: int
    step: int
    op: str
    what: str
    before: int
    after: int
    moves: bool  # only where the window starts changed (`x[:, i:i + n]`), not its length
    region: bool  # slices whose starts and lengths both changed (a box cut at a random place and size)


@dataclass(frozen=True)
class _Weight:
    runs: int = 1
    flops: float = 0.0


def findings(context: AnalysisContext, leave_out: set[int], not_evicted: str, evicted: list[int],
             data_lengths: Sequence[set[int]] = (), storm_sizes: Sequence[set[int]] = ()) -> list[tuple[Finding, ChipShapeStorm]]:
    """One finding per op line on the chip whose changing length recompiled a program (`leave_out`: compile ids
    another finding explains), but for lengths that are all a data-dependent size's (`data_lengths`, each size's
    recorded lengths, exactly or one the padded form of the other: an op that takes the count of a mask, such as the
    backward's expand of a masked mean's gradient, is that size's storm, which its own finding names), and for
    lengths that are all the values of an input-shape storm's dim (`storm_sizes`: `torch.arange(h.shape[-1])` of a
    batch whose length changes takes the batch's size, which padding the batch fixes; that storm's finding names
    it)."""
    by_line: dict[int | None, list[_Recompile]] = {}
    trace = context.trace
    rows = trace.sql(
        "SELECT id, name_sid, COALESCE(dur_ns, 0), diff_sid, COALESCE(step, 0), frame_id FROM compiles "
        f"WHERE rank = ? AND reason = 'recompile' AND diff_sid IS NOT NULL AND {not_evicted} ORDER BY start_ns",
        (context.rank, *evicted),
    )
    for compile_id, name_sid, dur_ns, diff_sid, step, frame_id in rows:
        if compile_id in leave_out:
            continue
        diff = trace.string(diff_sid) or ""
        named = _DIFF_OP.match(diff)
        change_text = named.group("change") if named else diff
        change = _CHANGE.search(change_text)
        if change is None or "structure change" in diff:
            continue
        name = trace.string(name_sid) or "?"
        if named is not None:
            frame_id = context.frame_at_line(named.group("file"), int(named.group("line")))
        op = named.group("op") if named is not None else name
        view = re.match(r"view (\S+):", change_text)
        by_line.setdefault(frame_id, []).append(_Recompile(
            compile_id, name, dur_ns, step, view.group(1) if view else op, change.group("what"),
            int(change.group("before")), int(change.group("after")), _window_moves(change_text),
            _region_changes(change_text),
        ))
    found = []
    # With three steps or more, lengths all taken in the warm-up step and reused after it are a fixed set (FSDP's
    # groups of different sizes, each layer's own length), each compiled once, not a length that changes.
    first_steady = context.first_steady_after_warm_up
    for frame_id, recompiles in _at_view_lines(context, by_line).items():
        lengths = sorted({recompiles[0].before} | {recompile.after for recompile in recompiles})
        if frame_id is None or len(recompiles) < MIN_RECOMPILES or len(lengths) < MIN_LENGTHS:
            continue
        if first_steady is not None and all(recompile.step < first_steady for recompile in recompiles):
            continue
        if _reused_set(context, recompiles):
            continue
        if any(all(any(explains(length, known_length) for known_length in known) for length in lengths)
               for known in data_lengths):
            continue
        if any(set(lengths) <= sizes for sizes in storm_sizes):
            continue
        found.append(_finding(context, frame_id, recompiles, lengths))
    return found


def _reused_set(context: AnalysisContext, recompiles: list[_Recompile]) -> bool:
    """Whether the lengths were all compiled in one step and their programs then ran from the cache in at least
    `MIN_RECOMPILES` later steps: a fixed set, such as a loop over a tensor's rows (`for row in logits:`) in the first
    iteration's tail after its optimizer step, not a length that changes."""
    steps = {recompile.step for recompile in recompiles}
    if len(steps) != 1:
        return False
    ids = [recompile.compile_id for recompile in recompiles]
    (later,), = context.trace.sql(
        "SELECT COUNT(DISTINCT e.step) FROM executions e JOIN compiles c ON c.program_id = e.program_id "
        f"WHERE e.rank = ? AND e.step > ? AND c.id IN ({', '.join('?' * len(ids))})", (context.rank, *steps, *ids))
    return int(later or 0) >= MIN_RECOMPILES


def _window_moves(change_text: str) -> bool:
    """Whether a slice's diff (`start 20 -> 40, end 40 -> 60`) says its start moved and its length stayed."""
    changes = {match.group("what"): int(match.group("after")) - int(match.group("before")) for match in _CHANGE.finditer(change_text)}
    return "start" in changes and changes.get("end", changes["start"]) == changes["start"]


def _region_changes(change_text: str) -> bool:
    """Whether a view's diff (`start 6 -> 4, end 14 -> 6, start 6 -> 8, end 14 -> 10`) says a slice's start moved and
    a slice's length changed too: a region whose place and size are both chosen per step."""
    deltas = [(match.group("what"), int(match.group("after")) - int(match.group("before")))
              for match in _CHANGE.finditer(change_text) if match.group("what") in ("start", "end")]
    starts_move = any(what == "start" and delta for what, delta in deltas)
    pairs = zip(deltas, deltas[1:])
    lengths_change = any(first[0] == "start" and second[0] == "end" and first[1] != second[1] for first, second in pairs)
    return starts_move and lengths_change


def _at_view_lines(context: AnalysisContext, by_line: dict[int | None, list[_Recompile]]) -> dict[int | None, list[_Recompile]]:
    """A view's diff names the line of the op that read it; the view was made at its own line, which the ops table
    has: the line whose rows of that view op had the most output shapes in the steps that recompiled."""
    moved: dict[int | None, list[_Recompile]] = {}
    for frame_id, recompiles in by_line.items():
        op_sid = context.trace.string_id(recompiles[0].op)
        steps = sorted({recompile.step for recompile in recompiles})
        rows = [] if op_sid is None else context.trace.sql(
            f"SELECT frame_id, COUNT(DISTINCT outputs_sid) FROM ops WHERE rank = ? AND op_sid = ? AND step IN "
            f"({', '.join('?' for _ in steps)}) AND frame_id IS NOT NULL GROUP BY frame_id ORDER BY 2 DESC LIMIT 1",
            (context.rank, op_sid, *steps),
        )
        line = rows[0][0] if rows and rows[0][1] >= MIN_LENGTHS - 1 else frame_id
        moved.setdefault(line, []).extend(recompiles)
    return moved


def _finding(context: AnalysisContext, frame_id: int, recompiles: list[_Recompile],
             lengths: list[int]) -> tuple[Finding, ChipShapeStorm]:
    where = context.where(frame_id)
    # The most common op and change: a slice from 0 reads as the view's arguments in its first diff.
    op = Counter(recompile.op for recompile in recompiles).most_common(1)[0][0]
    what = Counter(recompile.what for recompile in recompiles).most_common(1)[0][0]
    names = list(dict.fromkeys(recompile.name for recompile in recompiles))
    total_ns = sum(recompile.dur_ns for recompile in recompiles)
    compiles = StormCompiles(len(recompiles), total_ns, total_ns, sorted({recompile.step for recompile in recompiles}),
                             [recompile.compile_id for recompile in recompiles])
    values = tuple(recompile.after for recompile in recompiles)
    options = bucket_options(VaryingDim(((0, 0),), values), [_Weight()] * len(values), total_ns / len(values), 0.0)
    best = propose(options, len(lengths) * total_ns / len(values))
    evidence = [context.evidence_at(
        f"{op} at {where} took {what} {values_text(lengths)}: {plural(len(recompiles), 'recompile')} of "
        f"{', '.join(names[:3])} with the same input shapes", frame_id, table="compiles",
    )]
    evidence.extend(Evidence(f"buckets ({option.rule}) {values_text(list(option.buckets))}: "
                             f"{plural(option.compiles, 'compile')} ({option.compiles_saved} saved)") for option in options[:5])
    moves = what == "start" and sum(recompile.moves for recompile in recompiles) * 2 > len(recompiles)
    region = not moves and sum(recompile.region for recompile in recompiles) * 2 > len(recompiles)
    if region:
        what = "start and length"
    read = None if moves or region else host_read_before(context, frame_id, {recompile.step for recompile in recompiles})
    if region:
        evidence = evidence[:1]
        fix = ("the region's place and size both change, and a slice's bounds are part of its program: make the region "
               "a mask on the chip from its bounds, `rows = torch.arange(H, device=x.device)[:, None]`, `cols = "
               "torch.arange(W, device=x.device)`, `inside = (rows >= top) & (rows < top + h) & (cols >= left) & "
               "(cols < left + w)` (Python numbers compared with a tensor are inputs of the program, not part of it), "
               "and blend with `torch.where(inside, other, x)` instead of slicing (a CutMix box, a random erase)")
    elif read is not None:
        evidence = evidence[:1]
        fix = masking_fix(*read)
    elif moves:
        evidence = evidence[:1]
        fix = ("the window keeps its length and only its start moves, and a slice's start is part of its program: take "
               "the window with `index_select` at positions made on the chip, `x.index_select(dim, "
               "torch.arange(length, device=x.device) + start)` (a Python number added to a tensor is an input of the "
               "program, not part of it), instead of slicing at a new start (where the view read here is made)")
    else:
        fix = (f"round the length up to a few bucket sizes, e.g. {values_text(list(best.buckets))} ({best.rule}), and "
               "mask what the padding adds" if best is not None else f"use one fixed length ({lengths[-1]}) and mask what it adds")
    own_program = names == [op]  # strict mode: the op's own program, named as the op
    finding = storm_finding(
        context, compiles,
        programs=f"{op} at {where}" if own_program else names[0] if len(names) == 1 else f"{len(names)} programs",
        cause=f"its {what} {'change' if what.endswith('s') else 'changes'}" if own_program else f"{op} at {where} changes {what}", sizes=len(lengths),
        explanation=(
            f"The changing {'slice' if moves or region else 'shape'} is made on the chip: {op} at {where} took {len(lengths)} values of "
            f"{'its first start, its lengths changing too' if region else what} ({values_text(lengths)}), and the program that holds it compiled again for each, with the same input "
            "shapes. "
        ),
        then=f". Padding the data pipeline's batches does not help: the {'start' if moves else 'region' if region else 'length'} is chosen on the chip.",
        suggestion=f"At {where}: {fix}. Then the program compiles {'once per bucket' if read is None and not moves and not region else 'once'}.",
        evidence=evidence, module=None, anchor=frame_id,
    )
    return finding, ChipShapeStorm(op, what, where, tuple(names), len(recompiles), total_ns, tuple(lengths))
