"""Compiling against the on-disk compile cache (`tputrace run --compile-cache DIR`): how many compiles were
loads from it, and a finding that suggests it when compiling takes a large share of a run that did not use it.

A load still traces and lowers the program in JAX, so it is cheaper than a compile but not free. The trace
says a run used the cache by `meta.compile_cache` (its directory), or, in a file from before that key, by
having loaded something.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

from tputrace.analysis.context import AnalysisContext, in_list
from tputrace.analysis.findings import AnalysisResult, Finding
from tputrace.schema import COMPILE_CACHE_META_KEY
from tputrace.store.aggregates import LOADED_FROM_DISK, merged_ns
from tputrace.wording import format_ns, plural

NAME = "compile_cache"
MIN_SHARE = 0.25  # compiling (not loading) this share of the wall time or more is "a large share"
MAX_LISTED_LINES = 3


@dataclass(frozen=True)
class CompileCacheData:
    """Whether the run used the on-disk compile cache, its loads, and the time spent compiling (not loading)."""

    cache_used: bool
    loads: int
    load_ns: int
    compiled_ns: int
    compiled_share: float  # of the wall time


def loads_among(context: AnalysisContext, compile_ids: Sequence[int]) -> tuple[int, int]:
    """(count, ns) of the compiles `compile_ids` that were loads from the on-disk compile cache."""
    if not compile_ids:
        return 0, 0
    (count, load_ns), = context.trace.sql(
        f"SELECT COUNT(*), COALESCE(SUM(dur_ns), 0) FROM compiles WHERE id IN {in_list(compile_ids)} AND {LOADED_FROM_DISK}",
        list(compile_ids),
    )
    return int(count), int(load_ns)


def _costliest_lines(context: AnalysisContext) -> list[tuple[int, int, int]]:
    """(a frame id, compiles, wall ns compiling) of the source lines that compiled longest; a line's
    nested compiles (a Dynamo frame's AOTAutograd and XLA compiles) count each instant once."""
    rows = context.trace.sql(
        "SELECT f.file_sid, f.line, f.function_sid, c.frame_id, c.start_ns, c.start_ns + COALESCE(c.dur_ns, 0) "
        "FROM compiles c JOIN frames f ON f.id = c.frame_id WHERE c.rank = ? "
        "ORDER BY f.file_sid, f.line, f.function_sid, c.start_ns",
        (context.rank,),
    )
    lines = []
    for _, group in groupby(rows, key=lambda row: row[:3]):
        line_rows = list(group)
        lines.append((min(row[3] for row in line_rows), len(line_rows), merged_ns((row[4], row[5]) for row in line_rows)))
    return sorted(lines, key=lambda line: -line[2])[:MAX_LISTED_LINES]


def analyze(context: AnalysisContext) -> AnalysisResult[CompileCacheData]:
    trace, rank = context.trace, context.rank
    stats = trace.compile_stats(rank=rank)
    compiled_ns = stats.total_ns - stats.loaded_ns
    cache_used = COMPILE_CACHE_META_KEY in trace.meta or stats.loaded_from_disk > 0
    share = context.share_of_wall(compiled_ns)
    data = CompileCacheData(cache_used, stats.loaded_from_disk, stats.loaded_ns, compiled_ns, share)
    if cache_used or share < MIN_SHARE:
        return AnalysisResult(NAME, data)
    first_ns = stats.total_ns - stats.recompile_ns
    evidence = tuple(
        context.evidence_at(f"{plural(count, 'compile')}, {format_ns(line_ns)}", frame_id, table="compiles")
        for frame_id, count, line_ns in _costliest_lines(context)
    )
    recompiled = (f" and {format_ns(stats.recompile_ns)} of {plural(stats.recompiles, 'recompile')} (recompile storm "
                  "findings count those they explain)" if stats.recompiles else "")
    finding = Finding(
        analyzer=NAME,
        severity="info",  # the cache shortens later runs, not this one
        title=f"Compiling took {format_ns(compiled_ns)}, {share:.0%} of the run, with no compile cache",
        explanation=(
            f"The run made {plural(stats.count, 'compile')}: {format_ns(first_ns)} of first compiles{recompiled}. "
            "It ran without the on-disk compile cache, so a later run of the script compiles every program again, "
            f"even those with the same shapes: with the cache it could load them instead (up to {format_ns(compiled_ns)} "
            "of compiling; a load still traces and lowers in JAX). Nothing in this run would have been saved, so "
            "the finding costs nothing here."
        ),
        suggestion=(
            "Run it with `tputrace run --compile-cache DIR` (or TPUTRACE_COMPILE_CACHE=DIR): each program compiled "
            "is kept in DIR, and a later run with the same backend, XLA flags and chips loads the programs it shares "
            "instead of compiling them (a load still traces and lowers the program in JAX). The trace counts the loads."
        ),
        cost_total_ns=0.0,  # the saving is a later run's; ranked after this run's own costs
        cost_per_step_ns=None,
        evidence=evidence,
    )
    return AnalysisResult(NAME, data, (finding,))
