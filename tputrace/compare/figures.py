"""The figures of one rank of a run that comparisons and budgets use, computed once from the reader.

Warm-up is the first step (step 0, before the first step boundary): compiles, syncs and transfers there
are expected; those of later steps are the steady loop's.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.analysis.collectives import CollectivesData
from tputrace.analysis.findings import Finding
from tputrace.analysis.memory import MemoryData
from tputrace.analysis.report import analyze
from tputrace.store.records import SourceLocation

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

WARMUP_STEPS = 1


@dataclass(frozen=True)
class SiteKey:
    """A source site as comparisons match it: file, function and the line's text (its number where the
    source is not available), so that a site still matches when lines above it moved."""

    file: str
    function: str
    text: str


@dataclass(frozen=True)
class Recompile:
    """A compile after warm-up that was not a program's first: where, what and why."""

    name: str | None
    reason: str | None
    diff: str | None
    step: int
    dur_ns: int
    site: str | None  # file:line
    key: SiteKey | None


@dataclass(frozen=True)
class SiteFinding:
    """A finding with the key of its source line."""

    finding: Finding
    key: tuple[str, str, str]


@dataclass(frozen=True)
class RunFigures:
    """One rank's figures."""

    path: str
    rank: int
    steps: int
    steady_steps: int
    median_step_ns: float | None
    step_spread_ns: float  # the steady steps' median absolute deviation
    compiles: int
    compile_ns: int
    programs: int
    recompiles_after_warmup: tuple[Recompile, ...]
    syncs: int
    steady_syncs: int
    transfers: int
    steady_transfers: int
    fallbacks: int
    collectives: int
    peak_memory_bytes: int
    exposed_communication_share: float
    ops_by_site: dict[str, int]
    ops_by_module: dict[str, int]
    findings: tuple[SiteFinding, ...]

    def per_steady_step(self, count: int) -> float:
        """`count` divided by the steady steps (by one where the run has none)."""
        return count / max(self.steady_steps, 1)


def site_key(trace: Trace, source: SourceLocation | None, text_cache: dict[str, list[str] | None]) -> SiteKey | None:
    """The comparison key of `source`: its file, function and stripped line text when the run's copy of the
    file is readable, else its line number."""
    if source is None:
        return None
    return SiteKey(source.file, source.function, _line_text(trace, source.file, source.line, text_cache))


def _line_text(trace: Trace, file: str, line: int, text_cache: dict[str, list[str] | None]) -> str:
    if file not in text_cache:
        copy = trace.source_copy(file)
        lines = None
        if copy is not None:
            try:
                with open(copy, encoding="utf-8", errors="replace") as handle:
                    lines = handle.read().splitlines()
            except OSError:
                lines = None
        text_cache[file] = lines
    lines = text_cache[file]
    if lines is not None and 0 < line <= len(lines) and lines[line - 1].strip():
        return lines[line - 1].strip()
    return f"line {line}"


def run_figures(trace: Trace, rank: int | None = None) -> RunFigures:
    """The figures of `rank` (default: the trace's first rank) of `trace`."""
    chosen = trace.run.rank if rank is None else rank
    text_cache: dict[str, list[str] | None] = {}
    durations = [step.dur_ns for step in trace.step_times(rank=chosen) if step.dur_ns is not None and step.source != "end"]
    steady = durations[WARMUP_STEPS:] or durations
    median = float(statistics.median(steady)) if steady else None
    spread = float(statistics.median(abs(value - median) for value in steady)) if steady and median is not None else 0.0
    compile_stats = trace.compile_stats(rank=chosen)
    recompiles = tuple(
        Recompile(record.name, record.reason, record.diff, record.step or 0, record.dur_ns or 0,
                  f"{record.source.file}:{record.source.line}" if record.source else None,
                  site_key(trace, record.source, text_cache))
        for record in trace.records("compiles", where="rank = ? AND step >= ? AND reason != 'first'",
                                    params=(chosen, WARMUP_STEPS), order_by="start_ns")
    )
    report = analyze(trace, rank=chosen)
    memory = report.data(MemoryData)
    collectives = report.data(CollectivesData)
    ops_by_site = {stat.label: stat.total_ns for stat in trace.op_stats("source", rank=chosen)}
    ops_by_module = {stat.label: stat.total_ns for stat in trace.op_stats("module", rank=chosen)}
    findings = tuple(SiteFinding(finding, _finding_key(trace, finding, text_cache)) for finding in report.findings)
    return RunFigures(
        path=str(trace.path),
        rank=chosen,
        steps=len(durations),
        steady_steps=max(len(durations) - WARMUP_STEPS, 0),
        median_step_ns=median,
        step_spread_ns=spread,
        compiles=compile_stats.count,
        compile_ns=compile_stats.total_ns,
        programs=compile_stats.programs,
        recompiles_after_warmup=recompiles,
        syncs=_count(trace, "syncs", chosen, 0),
        steady_syncs=_count(trace, "syncs", chosen, WARMUP_STEPS),
        transfers=_count(trace, "transfers", chosen, 0),
        steady_transfers=_count(trace, "transfers", chosen, WARMUP_STEPS),
        fallbacks=_count(trace, "fallbacks", chosen, 0),
        collectives=_count(trace, "collectives", chosen, 0),
        peak_memory_bytes=max((chip.peak_bytes for chip in memory.chips), default=0) if memory else 0,
        exposed_communication_share=collectives.collective_share_of_step if collectives else 0.0,
        ops_by_site=ops_by_site,
        ops_by_module=ops_by_module,
        findings=findings,
    )


def _count(trace: Trace, table: str, rank: int, from_step: int) -> int:
    if not trace.has_table(table):
        return 0
    return trace.count(table, where="rank = ? AND step >= ?", params=(rank, from_step))


def _finding_key(trace: Trace, finding: Finding, text_cache: dict[str, list[str] | None]) -> tuple[str, str, str]:
    if finding.file is not None and finding.line is not None:
        return (finding.analyzer, finding.file, _line_text(trace, finding.file, finding.line, text_cache))
    # No line: match by title with its figures blanked out, so that a finding whose cost changed still matches.
    return (finding.analyzer, finding.module or "", re.sub(r"\d[\d.,]*", "#", finding.title))
