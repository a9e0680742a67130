"""The Overview's data and the findings for the TUI: the run, its steps, time split and compiles, and
the analysis's findings, ranked."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.analysis.target import DEFAULT_TARGET, target_chip
from tputrace.derived.op_time import OpTimeKind, op_time_kind
from tputrace.derived.projection import ProjectedSteps, projected_steps
from tputrace.derived.run_facts import RunFacts, run_facts
from tputrace.derived.steps import StepRow, step_rows
from tputrace.store.aggregates import CompileStats, TimeSplit

if TYPE_CHECKING:
    from tputrace.analysis.findings import Finding
    from tputrace.store.reader import Trace


@dataclass(frozen=True)
class Overview:
    """Everything the Overview shows except the findings (which come from the analysis)."""

    facts: RunFacts
    steps: list[StepRow]
    split: TimeSplit
    compiles: CompileStats
    projected: ProjectedSteps  # chip time per step projected for the default target
    op_time: OpTimeKind = OpTimeKind(device_ops=False, chip_share=True)  # what the ops' times are
    op_count: int | None = None  # the rank's ops (None: the file's, as `facts.counts` has them)


def overview(trace: Trace, rank: int) -> Overview:
    projected = projected_steps(trace, rank, target_chip(DEFAULT_TARGET))
    return Overview(run_facts(trace, rank), step_rows(trace, rank), trace.time_split(rank=rank), trace.compile_stats(rank=rank),
                    projected, op_time_kind(trace, rank, bool(projected.programs_costed)),
                    trace.count("ops", where="rank = ?", params=(rank,)) if len(trace.ranks) > 1 else None)


# -- findings ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FindingsResult:
    """The ranked findings, or why there are none to show (`unavailable` is then a sentence)."""

    findings: tuple[Finding, ...] = ()
    unavailable: str | None = None


SEPARATE_ANALYZERS: tuple[str, ...] = ("syncs", "fusion")
"""Analyzers run on a connection of their own, beside the others (`load_findings` with a reader
factory): the others read the ops' columns once (`tputrace.analysis.op_facts`), and these two scan the
ops for the modules of their lines' host reads (`sync_modules`, shared between them), so the scans
overlap the read on a second core."""


def load_findings(trace: Trace, rank: int | None = None, *,
                  reader: Callable[[], AbstractContextManager[Trace]] | None = None) -> FindingsResult:
    """Run the analysis for `rank` (default: the first rank) if this build has it
    (`tputrace.analysis.analyze`), and rank its findings.

    With `reader` (a factory of `Trace`s on the same file, one per thread), the analyzers in
    `SEPARATE_ANALYZERS` run in a thread of their own while `trace` runs the rest: SQLite runs
    queries without holding the GIL, so the two overlap.
    """
    try:
        from tputrace.analysis import ANALYZERS, analyze  # type: ignore[attr-defined]
    except ImportError:
        return FindingsResult(unavailable="diagnoses unavailable: this build of tputrace has no analysis (tputrace.analysis.analyze)")
    from tputrace.analysis.findings import rank as rank_findings

    separate = {name: analyzer for name, analyzer in ANALYZERS.items() if name in SEPARATE_ANALYZERS} if reader else {}
    rest = {name: analyzer for name, analyzer in ANALYZERS.items() if name not in separate}

    def run_separately(open_reader: Callable[[], AbstractContextManager[Trace]]) -> list[Finding]:
        with open_reader() as own_trace:
            return list(analyze(own_trace, rank=rank, analyzers=separate).findings)

    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tputrace-analysis") as pool:
            separate_findings = pool.submit(run_separately, reader) if separate and reader else None
            report = analyze(trace, rank=rank, analyzers=rest)
            findings = list(getattr(report, "findings", report))
            if separate_findings is not None:
                findings.extend(separate_findings.result())
    except Exception as error:  # the analysis is another layer: a failure there must not take the UI down
        return FindingsResult(unavailable=f"diagnoses unavailable: the analysis failed ({type(error).__name__}: {error})")
    try:
        ranked = rank_findings(findings)
    except (TypeError, KeyError, AttributeError):
        ranked = findings
    return FindingsResult(findings=tuple(ranked))


def finding_location(finding: Finding) -> tuple[str, int] | None:
    """The source line a finding points at: its own, or its first piece of evidence with one."""
    if finding.file and finding.line:
        return finding.file, finding.line
    for evidence in finding.evidence:
        if evidence.file and evidence.line:
            return evidence.file, evidence.line
    return None

