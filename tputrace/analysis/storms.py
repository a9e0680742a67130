"""Finding a recompilation storm at a call site: the site's compiles, the dims that varied, where the
changing shape enters the program and, when the data chose the size, the op and line that made it.

A site is the call that triggered the compiles (its line and, where recorded, its column), with the
program's kind and name. The recompiles analyzer decides which sites storm; this module reads one.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from tputrace.analysis.buckets import VaryingDim
from tputrace.analysis.call_sites import call_label
from tputrace.analysis.context import AnalysisContext, in_list
from tputrace.analysis.data_sizes import SizeOrigin, size_origin
from tputrace.analysis.imported import context_import_facts, jax_capture

NAME = "recompiles"
# A recompile's diff names the first op that consumes the changed input, e.g.
# "op 0 aten.embedding.default (train.py:29): arg 1 dim 1: 64 -> 72".
_DIFF_ENTRY = re.compile(r"op \d+ (?P<op>\S+) \((?P<file>[^()]+?):(?P<line>\d+)\): (?P<arg>arg \d+ dim \d+)")
# A compile that may recompile something: all but a structure's first compile. Strict mode compiles each op's program
# once per structure at each line, so the ops of a mode the script enters part-way (strict evaluation after training
# in DeferAndFuse) first compile in the steady steps, several signatures at one line (one per `nn.Linear` of a
# `model(x)` call): first compiles, not a storm. A compile without a recorded reason counts as a possible recompile.
RECOMPILED = "reason IS NOT 'first'"


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
class ShapeEntry:
    """Where a varying input enters the program: the first op consuming it, from the recompiles' diffs."""

    op: str
    argument: str
    frame_id: int | None
    module: str | None

    def describe(self, context: AnalysisContext) -> str:
        return f"{self.argument} of {self.op} at {context.where(self.frame_id)}"


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

    @property
    def compile_ids(self) -> list[int]:
        return [row.compile_id for row in self.rows]

    @property
    def program_ids(self) -> list[int]:
        return [row.program_id for row in self.rows if row.program_id is not None]


def not_evicted(evicted: list[int], column: str = "diff_sid") -> str:
    """An SQL condition on a diff column that leaves out recompiles after an eviction (`evicted` are their diffs)."""
    return f"({column} IS NULL OR {column} NOT IN {in_list(evicted)})" if evicted else "1"


def compile_rows(context: AnalysisContext, kind: str, name_sid: int, frame_id: int | None,
                 evicted: list[int]) -> list[CompileRow]:
    """A site's compiles in the order they ran, but for recompiles after an eviction."""
    trace = context.trace
    frame_clause = "frame_id IS NULL" if frame_id is None else "frame_id = ?"
    params: tuple[object, ...] = (context.rank, kind, name_sid) + (() if frame_id is None else (frame_id,))
    rows = trace.sql(
        "SELECT c.id, c.program_id, c.signature_sid, COALESCE(c.dur_ns, 0), COALESCE(c.step, 0), "
        "COALESCE(p.flops, 0), c.diff_sid FROM compiles c LEFT JOIN programs p ON p.id = c.program_id "
        f"WHERE c.rank = ? AND c.kind IS ? AND c.name_sid IS ? AND c.{frame_clause} AND {not_evicted(evicted, 'c.diff_sid')} "
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


def compiles_in_later_half(context: AnalysisContext, frame_id: int | None, rows: list[CompileRow]) -> int:
    """How many of a site's compiles came after the middle op of those its line ran, by dispatch order (all of them
    when the line ran no op: a flush's line). In a run without steps this tells a size that keeps changing (a cache
    one token longer at each call, compiling to the end) from programs of a few shapes compiled in the loop's first
    iterations and reused after them (the views of several tensors at one line in strict mode)."""
    if frame_id is None:
        return len(rows)
    trace = context.trace
    starts = [start_ns for (start_ns,) in trace.sql(
        "SELECT o.start_ns FROM ops o JOIN frames f ON f.id = o.frame_id JOIN frames sf ON sf.id = ? "
        "WHERE o.rank = ? AND f.file_sid = sf.file_sid AND f.line = sf.line ORDER BY o.seq",
        (frame_id, context.rank),
    )]  # the line's ops, whatever call on it (ops and compiles may record its columns differently)
    if not starts:
        return len(rows)
    compile_ids = [row.compile_id for row in rows]
    ((later,),) = trace.sql(
        f"SELECT COUNT(*) FROM compiles WHERE id IN {in_list(compile_ids)} AND start_ns > ?",
        (*compile_ids, starts[len(starts) // 2]))
    return int(later)


def program_runs(context: AnalysisContext, program_ids: list[int]) -> dict[int, int]:
    """How often each program ran: executions, else ops computed by it (strict mode), else 1."""
    if not program_ids:
        return {}
    trace = context.trace
    placeholders = in_list(program_ids)
    runs: dict[int, int] = dict(trace.sql(
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


def storm_at(context: AnalysisContext, kind: str, name: str, frame_id: int | None, rows: list[CompileRow],
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


def compiled_where(context: AnalysisContext, name: str, site: str) -> str:
    """Where a storm's program was compiled, in the terms of the trace's source: a recording flushes its ops into a
    program at a line; an imported capture's program was compiled for a call (a jitted function's, in JAX)."""
    if context_import_facts(context) is None:
        return f"flushed at {site}"
    return f"the jitted function at {site}" if jax_capture(context, [name]) else f"compiled at {site}"
