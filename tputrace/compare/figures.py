"""The figures of one rank of a run that comparisons and budgets use, computed once from the reader.

Warm-up is the first step (step 0, before the first step boundary): compiles, syncs and transfers there
are expected; those of later steps are the steady loop's.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tputrace.analysis.collectives import CollectivesData
from tputrace.analysis.findings import Finding
from tputrace.analysis.imported import ImportFacts, import_facts
from tputrace.analysis.memory import MemoryData
from tputrace.analysis.report import analyze
from tputrace.compare.programs import ProgramFamily, program_families
from tputrace.derived.op_ranking import self_dispatch_by_frame_and_module
from tputrace.compare.sites import SiteKey, line_text, site_id, site_key

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

WARMUP_STEPS = 1

# Each compared figure -> the analyzer whose absence from an import (`imported.import_facts`: the capture lacks
# what it reads) means the import does not record the figure.
FIGURE_ANALYZERS: dict[str, str] = {
    "compiles": "recompiles",
    "recompiles after warm-up": "recompiles",
    "programs": "recompiles",
    "compile time": "recompiles",
    "host syncs": "syncs",
    "transfers": "transfers",
    "CPU fallbacks": "fallbacks",
    "collectives": "collectives",
    "exposed communication share": "collectives",
    "peak memory": "memory",
    "program runs": "data_movement",  # program families' runs: the `executions` table
}
HOST_MEMORY_ONLY = "the capture records host memory only, no chip's"


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
    ops_by_site: dict[str, int]  # keyed by `site_id` of the line; `site_labels` names it as file:line
    site_labels: dict[str, str]
    ops_by_module: dict[str, int]
    findings: tuple[SiteFinding, ...]
    program_families: dict[tuple[str, ...], ProgramFamily]
    warmup_recompiles: int = 0  # recompiles in the warm-up step (before `recompiles_after_warmup`)
    busiest_steady_lines: dict[str, str] = field(default_factory=dict)  # "syncs"/"transfers" -> file:line of most
    # Figures (`FIGURE_ANALYZERS` names) the trace does not record, with why; their values above are 0, not measured.
    unrecorded: dict[str, str] = field(default_factory=dict)
    skipped_analyzers: frozenset[str] = frozenset()  # analyzers that cannot run on the rank (an import's)
    script: str | None = None  # the rank's script, as recorded
    source_files: frozenset[str] = frozenset()  # the user's files the rank ran, by recorded path

    def records(self, figure: str) -> bool:
        """Whether the trace records `figure` (a `FIGURE_ANALYZERS` name)."""
        return figure not in self.unrecorded

    def per_steady_step(self, count: int) -> float:
        """`count` divided by the steady steps (by one where the run has none)."""
        return count / max(self.steady_steps, 1)


def run_figures(trace: Trace, rank: int | None = None, *, by_line_number: Collection[str] = ()) -> RunFigures:
    """The figures of `rank` (default: the trace's first rank) of `trace`. Sites in the files
    `by_line_number` match by line number, not text: those whose text either compared run cannot read."""
    chosen = trace.run.rank if rank is None else rank
    text_cache: dict[str, list[str] | None] = dict.fromkeys(by_line_number)
    step_times = trace.step_times(rank=chosen)
    durations = [step.dur_ns for step in step_times if step.dur_ns is not None and step.source != "end"]
    # The tail after the last step boundary (a final `.item()` or evaluation after the loop) is no steady step.
    tail_steps = tuple(step.step for step in step_times if step.source == "end")
    # A step the run did not finish (killed, or raising, in its middle) is no steady step either.
    last_step = max((step.step for step in step_times if step.dur_ns is not None and step.source != "end"), default=None)
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
    ops_by_site, site_labels, ops_by_module = _op_time(trace, chosen, text_cache)
    facts = import_facts(trace, chosen)
    chip_peaks = [chip.peak_bytes for chip in memory.chips if not chip.is_host] if memory else []
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
        warmup_recompiles=max(compile_stats.recompiles - len(recompiles), 0),
        syncs=_count(trace, "syncs", chosen, 0),
        steady_syncs=_count(trace, "syncs", chosen, WARMUP_STEPS, tail_steps, last_step),
        transfers=_count(trace, "transfers", chosen, 0),
        steady_transfers=_count(trace, "transfers", chosen, WARMUP_STEPS, tail_steps, last_step),
        fallbacks=_count(trace, "fallbacks", chosen, 0),
        collectives=_count(trace, "collectives", chosen, 0),
        peak_memory_bytes=max(chip_peaks, default=0),
        exposed_communication_share=collectives.collective_share_of_step if collectives else 0.0,
        ops_by_site=ops_by_site,
        site_labels=site_labels,
        ops_by_module=ops_by_module,
        findings=findings,
        program_families=program_families(trace, chosen, text_cache),
        busiest_steady_lines={table: line for table in ("syncs", "transfers")
                              if (line := _busiest_line(trace, table, chosen, WARMUP_STEPS, tail_steps, last_step)) is not None},
        unrecorded=_unrecorded(facts, bool(chip_peaks)),
        skipped_analyzers=frozenset(facts.skipped) if facts else frozenset(),
        script=next((run.script for run in trace.runs if run.rank == chosen), trace.run.script),
        source_files=frozenset(trace.source_files(rank=chosen)),
    )


def _unrecorded(facts: ImportFacts | None, has_chip_memory: bool) -> dict[str, str]:
    """The figures an imported rank does not record, with why (none for a trace tputrace recorded)."""
    if facts is None:
        return {}
    unrecorded = {figure: facts.skipped[analyzer] for figure, analyzer in FIGURE_ANALYZERS.items()
                  if analyzer in facts.skipped}
    if not has_chip_memory:
        unrecorded.setdefault("peak memory", HOST_MEMORY_ONLY)
    return unrecorded


def _op_time(trace: Trace, rank: int, text_cache: dict[str, list[str] | None]
             ) -> tuple[dict[str, int], dict[str, str], dict[str, int]]:
    """Host dispatch (without nested flushes and compiles) by source line and by module."""
    if not trace.has_table("ops"):
        return {}, {}, {}
    by_frame, by_module = self_dispatch_by_frame_and_module(trace, rank)
    by_site: dict[str, int] = {}
    labels: dict[str, str] = {}
    for frame_id, total in by_frame.items():
        source = trace.frame(frame_id)
        key = site_key(trace, source, text_cache)
        identity = site_id(key) if key else "(no line)"
        by_site[identity] = by_site.get(identity, 0) + total
        labels[identity] = f"{source.file}:{source.line}" if source else "(no line)"
    return by_site, labels, by_module


def _count(trace: Trace, table: str, rank: int, from_step: int, leaving_out: tuple[int, ...] = (),
           through_step: int | None = None) -> int:
    """Rows of `table` in `rank`'s steps from `from_step` on (to `through_step`), but for the steps `leaving_out`."""
    if not trace.has_table(table):
        return 0
    where, params = _steps_where(rank, from_step, leaving_out, through_step)
    return trace.count(table, where=where, params=params)


def _steps_where(rank: int, from_step: int, leaving_out: tuple[int, ...],
                 through_step: int | None) -> tuple[str, tuple[int, ...]]:
    where = "rank = ? AND step >= ?" + (f" AND step NOT IN ({', '.join('?' * len(leaving_out))})" if leaving_out else "")
    if through_step is None:
        return where, (rank, from_step, *leaving_out)
    return where + " AND step <= ?", (rank, from_step, *leaving_out, through_step)


def _busiest_line(trace: Trace, table: str, rank: int, from_step: int, leaving_out: tuple[int, ...],
                  through_step: int | None) -> str | None:
    """The file:line with the most rows of `table` in the steady steps (as `_count` counts them)."""
    if not trace.has_table(table):
        return None
    where, params = _steps_where(rank, from_step, leaving_out, through_step)
    rows = trace.sql(f"SELECT frame_id, COUNT(*) AS n FROM {table} WHERE {where} AND frame_id IS NOT NULL "
                     "GROUP BY frame_id ORDER BY n DESC, frame_id", params)
    counts: dict[str, int] = {}
    for frame_id, count in rows:
        source = trace.frame(frame_id)
        if source is not None:
            site = f"{source.file}:{source.line}"
            counts[site] = counts.get(site, 0) + count
    return max(counts, key=lambda site: counts[site]) if counts else None


def _finding_key(trace: Trace, finding: Finding, text_cache: dict[str, list[str] | None]) -> tuple[str, str, str]:
    if finding.file is not None and finding.line is not None:
        return (finding.analyzer, finding.file, line_text(trace, finding.file, finding.line, text_cache))
    # No line: match by title with its figures blanked out, so that a finding whose cost changed still matches.
    return (finding.analyzer, finding.module or "", re.sub(r"\d[\d.,]*", "#", finding.title))
