"""Recompiles of graphs whose ops change with a size: a flush site whose programs compile again in the steady steps
under other names (another op count each time), each recompile's diff naming the same op, line and argument dim
whose size changed (`op 4 aten.index_select.default (train.py:15): arg 1 dim 0: 54 -> 41`).

A Python loop whose trip count is the size unrolls into the graph: `pack_padded_sequence` makes the packed length and
the number of time steps an RNN runs follow each batch's lengths, so every batch is a new graph with a different op
count. The storms by program name miss them (each name compiles once); grouped by the shape that enters, they are one
finding at that line, with a fixed size as the fix.
"""

from __future__ import annotations

import linecache
import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Finding
from tputrace.analysis.host_inputs import copy_line, origin_line
from tputrace.analysis.shapes import TensorSpec, parse_specs
from tputrace.analysis.storm_findings import StormCompiles, storm_finding
from tputrace.analysis.storms import NAME, shape_entry
from tputrace.wording import plural

__all__ = ["NAME", "EntryStorm", "findings"]

MIN_RECOMPILES = 2  # recompiles in the steady steps (all steps in a run without steps)
MIN_SIZES = 3
_ENTRY = re.compile(r"^op \d+ (?P<op>\S+) \((?P<file>[^()]+?):(?P<line>\d+)\): (?P<arg>arg \d+ dim \d+): "
                    r"(?P<before>\d+) -> (?P<after>\d+)")
_PACKING = ("pack_padded_sequence", "pack_sequence")


@dataclass(frozen=True)
class EntryStorm:
    """The recompiles of one shape entering at one op and line, in programs of several op counts."""

    where: str
    op: str
    argument: str
    programs: tuple[str, ...]
    recompiles: int
    recompile_ns: int
    sizes: tuple[int, ...]
    steps: tuple[int, ...]


def findings(context: AnalysisContext, leave_out: set[int], not_evicted: str,
             evicted: list[int]) -> list[tuple[Finding, EntryStorm, set[int]]]:
    """One finding per (op, line, argument) that the recompiles no other finding explains (`leave_out`) name, in
    programs of at least two names, with `MIN_RECOMPILES` in the steady steps and `MIN_SIZES` sizes."""
    trace = context.trace
    steady = context.steady_range if context.steps else None
    groups: dict[tuple[str, str, int, str], list[tuple[int, str, int, int, tuple[int, int], str]]] = {}
    for compile_id, name_sid, dur_ns, step, diff_sid, signature_sid in trace.sql(
        "SELECT id, name_sid, COALESCE(dur_ns, 0), COALESCE(step, 0), diff_sid, signature_sid FROM compiles WHERE rank = ? AND "
        f"reason = 'recompile' AND diff_sid IS NOT NULL AND {not_evicted} ORDER BY start_ns",
        (context.rank, *evicted),
    ):
        match = _ENTRY.match(trace.string(diff_sid) or "")
        if compile_id in leave_out or match is None:
            continue
        key = (match["op"], match["file"], int(match["line"]), match["arg"])
        groups.setdefault(key, []).append((compile_id, trace.string(name_sid) or "?", dur_ns, step,
                                           (int(match["before"]), int(match["after"])), trace.string(signature_sid) or ""))
    found = []
    for (op, file, line, argument), recompiles in groups.items():
        in_steady = [row for row in recompiles if steady is None or steady[0] <= row[3] <= steady[1]]
        sizes = sorted({size for *_, change, _ in recompiles for size in change})
        names = tuple(dict.fromkeys(name for _, name, *_ in recompiles))
        if len(in_steady) < MIN_RECOMPILES or len(sizes) < MIN_SIZES or len(names) < 2:
            continue
        found.append(_finding(context, op, file, line, argument, recompiles, sizes, names))
    return found


def _finding(context: AnalysisContext, op: str, file: str, line: int, argument: str,
             recompiles: list[tuple[int, str, int, int, tuple[int, int], str]], sizes: list[int],
             names: tuple[str, ...]) -> tuple[Finding, EntryStorm, set[int]]:
    entry = shape_entry(context, [f"op 0 {op} ({file}:{line}): {argument}"])
    anchor = entry.frame_id if entry is not None else None
    where = context.where(anchor) if anchor is not None else f"{file.rsplit('/', 1)[-1]}:{line}"
    entry_where = where
    total_ns = sum(dur_ns for _, _, dur_ns, *_ in recompiles)
    steps = sorted({row[3] for row in recompiles})
    compiles = StormCompiles(len(recompiles), total_ns, total_ns, steps, [row[0] for row in recompiles])
    packing = _is_packing(context, anchor)
    copied = _copied_at(context, recompiles)
    if copied is not None and not packing:
        anchor, where = copied[1] if copied[1] is not None else copied[0], context.where(copied[0])
        made = f"made at {context.where(copied[1])} and " if copied[1] is not None else ""
        suggestion = (
            f"Pad the batches {made}copied to the chip at {where} to one length ({sizes[-1]} here, or the data's "
            f"longest), or a few fixed lengths, so the graph keeps its ops: the shape enters the programs at "
            f"{entry_where}, and a Python loop over that length (its trip count following the data) unrolls into a new "
            "graph for each length. Loop a fixed number of times and mask the steps past each sequence's length."
        )
    elif packing:
        suggestion = (
            f"`{packing}` at {where} makes the packed length and the number of time steps the RNN runs follow each "
            "batch's lengths, so each batch is a new graph. On a TPU pad every batch to one length (or a few fixed "
            "ones), run the RNN on the padded tensor without packing, and take each sequence's last valid output by "
            "its length (`out[torch.arange(b), lengths - 1]`) or mask the padding in the loss."
        )
    else:
        suggestion = (
            f"Give the shape entering at {where} a fixed size (pad it to {sizes[-1]}), or a few fixed sizes, so the "
            "graph keeps its ops: a Python loop over that size (its trip count following the data) unrolls into a "
            "new graph for each size. Loop a fixed number of times and mask the steps past the size instead."
        )
    entry_frame = entry.frame_id if entry is not None else None
    evidence = [context.evidence_at(f"step {step}: {name} compiled again: {op} {argument}: {before} -> {after}", entry_frame,
                                    table="compiles")
                for _, name, _, step, (before, after), _ in recompiles[:3]]
    finding = storm_finding(
        context, compiles, programs=f"{len(names)} programs of different op counts",
        cause=(f"the batches copied at {where} change shape" if copied is not None and not packing
               else f"the shape entering at {where} changes"), sizes=len(sizes),
        explanation=(
            f"{argument[0].upper()}{argument[1:]} of {op} at {entry_where} took {len(sizes)} sizes "
            f"({', '.join(str(size) for size in sizes[:12])}{', ...' if len(sizes) > 12 else ''}), and the graph around "
            f"it changed its ops with it ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}): "
            f"{plural(len(recompiles), 'recompile')}. "
        ),
        then=".", suggestion=suggestion, evidence=evidence,
        module=entry.module if entry and (copied is None or packing) else None, anchor=anchor,
    )
    data = EntryStorm(where, op, argument, names, len(recompiles), total_ns, tuple(sizes), tuple(steps))
    return finding, data, {row[0] for row in recompiles}


def _is_packing(context: AnalysisContext, frame_id: int | None) -> str | None:
    """The packing call (`pack_padded_sequence`) on the run's copy of the line, if it has one."""
    location = context.location(frame_id)
    copy = None if location is None else context.trace.source_copy(location.file)
    if location is None or copy is None:
        return None
    text = linecache.getline(copy, location.line)
    return next((name for name in _PACKING if name in text), None)


def _copied_at(context: AnalysisContext,
               recompiles: list[tuple[int, str, int, int, tuple[int, int], str]]) -> tuple[int, int | None] | None:
    """The line whose host-to-chip copies brought the changing shape (and the line that made them, when recorded):
    a copy in each recompile's step with the bytes of an input whose shape differs between the recompiles."""
    signatures = [row[5] for row in recompiles]
    specs = [parse_specs(signature) for signature in signatures]
    inputs = min(len(spec) for spec in specs)
    varying = {index for index in range(inputs) if len({_shape(spec[index]) for spec in specs}) > 1}
    if not varying:
        return None
    match = copy_line(context, signatures, [row[3] for row in recompiles], varying, [row[4][1] for row in recompiles])
    if match is None:
        return None
    return match.frame_id, origin_line(context, match.frame_id, set(match.copies))


def _shape(spec: TensorSpec | None) -> tuple[int, ...] | None:
    return None if spec is None else spec.shape
