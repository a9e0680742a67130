"""The difference between two runs: each figure before and after, recompiles and findings new, fixed or
changed (matched by source line, see `sites.SiteKey`), and the headline: the most important regression.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from tputrace.analysis.findings import Finding
from tputrace.compare.figures import Recompile, RunFigures
from tputrace.compare.programs import ProgramChange, program_changes
from tputrace.wording import format_bytes, format_ns

# A step-time change counts when it exceeds this many times the two runs' combined spread.
NOISE_SPREADS = 3.0
# How many lines and modules with the largest change in op time a comparison keeps.
TOP_OP_CHANGES = 3
# ... and how large a change must be, as a share of the larger run's total op time, to be kept.
OP_TIME_SHARE = 0.02


@dataclass(frozen=True)
class FigureChange:
    """One figure in both runs; `worse` when B's value is a regression (beyond noise for step time). A run that
    does not record the figure (an import whose capture lacks it) has None and its reason in `not_recorded`
    ("A"/"B" -> why); such a figure is no change either way."""

    name: str
    before: float | None
    after: float | None
    worse: bool
    text: str
    not_recorded: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RecompileChange:
    status: str  # "new" or "fixed"
    recompile: Recompile
    count: int


@dataclass(frozen=True)
class FindingChange:
    status: str  # "new", "fixed" or "changed"
    title: str
    site: str | None
    before_ns: float
    after_ns: float


@dataclass(frozen=True)
class OpTimeChange:
    """Host op time at one source line or in one module, before and after."""

    by: str  # "line" or "module"
    label: str
    before_ns: int
    after_ns: int


@dataclass(frozen=True)
class RunDiff:
    before: RunFigures
    after: RunFigures
    figures: tuple[FigureChange, ...]
    recompiles: tuple[RecompileChange, ...]
    findings: tuple[FindingChange, ...]
    programs: tuple[ProgramChange, ...]
    op_time: tuple[OpTimeChange, ...]
    headline: str
    note: str | None = None  # why few lines match, where that is so (`unmatched_files_note`)

    @property
    def regressed(self) -> bool:
        return self.headline != NO_REGRESSION

    def events(self) -> list[tuple[str, str, str | None, str]]:
        """Recompiles, findings and programs new, fixed or changed, as (status, what, file:line, detail) rows."""
        rows: list[tuple[str, str, str | None, str]] = [
            (change.status, "recompile", change.recompile.site,
             f"{change.recompile.name or '?'} x{change.count}: {change.recompile.diff or change.recompile.reason or ''}")
            for change in self.recompiles
        ]
        rows += [(change.status, "finding", change.site, change.title) for change in self.findings]
        rows += [(change.status, "program", change.family.site, f"{change.family.label}: {change.detail}")
                 for change in self.programs]
        return rows


NO_REGRESSION = "no regression"
NOT_RECORDED = "not recorded"


def compare(before: RunFigures, after: RunFigures) -> RunDiff:
    """How `after` differs from `before`."""
    figures = _figure_changes(before, after)
    both_record = before.records("recompiles after warm-up") and after.records("recompiles after warm-up")
    recompiles = _recompile_changes(before, after) if both_record else ()
    findings = _finding_changes(before, after)
    programs = (program_changes(before.program_families, after.program_families)
                if before.records("program runs") and after.records("program runs") else ())
    site_labels = {**before.site_labels, **after.site_labels}
    op_time = (_op_time_changes("line", before.ops_by_site, after.ops_by_site, site_labels)
               + _op_time_changes("module", before.ops_by_module, after.ops_by_module, {}))
    return RunDiff(before, after, figures, recompiles, findings, programs, op_time,
                   _headline(figures, recompiles, findings), unmatched_files_note(before, after))


def unmatched_files_note(before: RunFigures, after: RunFigures) -> str | None:
    """A note where the two runs share no source file (two different scripts, or one script run from another
    folder): no line of one matches a line of the other, so every line's recompiles and findings are new or fixed."""
    if not before.source_files or not after.source_files or before.source_files & after.source_files:
        return None
    scripts = [os.path.basename(run.script) if run.script else "?" for run in (before, after)]
    return (f"the runs share no source file (before: {scripts[0]}, after: {scripts[1]}), so no line of one matches a"
            " line of the other: each line's recompiles, findings and programs are listed as new or fixed")


def _op_time_changes(by: str, before: dict[str, int], after: dict[str, int],
                     labels: dict[str, str]) -> tuple[OpTimeChange, ...]:
    """The keys whose op time changed most (by absolute change, at least `OP_TIME_SHARE` of the larger
    run's total), largest first, named by `labels` (or themselves)."""
    floor = OP_TIME_SHARE * max(sum(before.values()), sum(after.values()))
    changes = [OpTimeChange(by, labels.get(key, key), before.get(key, 0), after.get(key, 0))
               for key in set(before) | set(after)
               if abs(before.get(key, 0) - after.get(key, 0)) > floor and not key.startswith("(no ")]
    changes.sort(key=lambda change: (-abs(change.after_ns - change.before_ns), change.label))
    return tuple(changes[:TOP_OP_CHANGES])


def _figure_changes(before: RunFigures, after: RunFigures) -> tuple[FigureChange, ...]:
    changes = []
    if before.median_step_ns is not None and after.median_step_ns is not None:
        noise = NOISE_SPREADS * (before.step_spread_ns + after.step_spread_ns)
        delta = after.median_step_ns - before.median_step_ns
        bounds = f"±{format_ns(int(noise))}"
        changes.append(FigureChange(
            "steady step time", before.median_step_ns, after.median_step_ns, delta > noise,
            f"{format_ns(int(before.median_step_ns))} -> {format_ns(int(after.median_step_ns))} (noise {bounds})"
            + ("" if abs(delta) > noise else ", within noise")))
    elif before.median_step_ns is not None or after.median_step_ns is not None:
        missing = {side: "no steady steps" for side, figures in (("A", before), ("B", after))
                   if figures.median_step_ns is None}
        changes.append(_unrecorded_change("steady step time", int(before.median_step_ns or 0),
                                          int(after.median_step_ns or 0), format_ns, missing))
    counted: tuple[tuple[str, int, int, Callable[[int], str]], ...] = (
        ("compiles", before.compiles, after.compiles, str),
        ("recompiles after warm-up", len(before.recompiles_after_warmup), len(after.recompiles_after_warmup), str),
        ("programs", before.programs, after.programs, str),
        ("host syncs", before.syncs, after.syncs, str),
        ("transfers", before.transfers, after.transfers, str),
        ("CPU fallbacks", before.fallbacks, after.fallbacks, str),
        ("collectives", before.collectives, after.collectives, str),
        ("compile time", before.compile_ns, after.compile_ns, format_ns),
        ("peak memory", before.peak_memory_bytes, after.peak_memory_bytes, format_bytes),
    )
    for name, old, new, shown in counted:
        missing = {side: figures.unrecorded[name] for side, figures in (("A", before), ("B", after))
                   if not figures.records(name)}
        if missing:
            changes.append(_unrecorded_change(name, old, new, shown, missing))
        else:
            # Compile time is listed, never a regression: it follows the compiles, which are.
            changes.append(FigureChange(name, old, new, new > old and name != "compile time", f"{shown(old)} -> {shown(new)}"))
    return tuple(changes)


def _unrecorded_change(name: str, old: int, new: int, shown: Callable[[int], str],
                       missing: dict[str, str]) -> FigureChange:
    """A figure that run A or B (the keys of `missing`) does not record: shown so on that side, no change."""
    before = None if "A" in missing else old
    after = None if "B" in missing else new
    text = (f"{NOT_RECORDED if before is None else shown(old)} -> {NOT_RECORDED if after is None else shown(new)} ("
            + "; ".join(f"{side}: {why}" for side, why in missing.items()) + ")")
    return FigureChange(name, before, after, False, text, missing)


def _recompile_changes(before: RunFigures, after: RunFigures) -> tuple[RecompileChange, ...]:
    """Recompiles matched one to one by cause: their line, reason and what changed (figures blanked out), then, for
    those left, by reason and what changed alone (a recompile whose flush moved to a new sync's line is the same
    one), then by the op whose inputs changed and how (`_op_cause`: a fused program's recompile is the same as the
    single-op program's of a strict run). What is left of B is new, of A fixed, grouped by line, reason and cause."""
    old_left = list(before.recompiles_after_warmup)
    new_left = list(after.recompiles_after_warmup)
    for matching in (lambda recompile: _cause(recompile, True), lambda recompile: _cause(recompile, False), _op_cause):
        unmatched = []
        for recompile in new_left:
            cause = matching(recompile)
            twin = next((index for index, other in enumerate(old_left) if matching(other) == cause), None)
            if twin is None:
                unmatched.append(recompile)
            else:
                del old_left[twin]
        new_left = unmatched
    changes = [RecompileChange("new", group[0], len(group)) for group in _grouped(new_left)]
    changes += [RecompileChange("fixed", group[0], len(group)) for group in _grouped(old_left)]
    return tuple(changes)


def _cause(recompile: Recompile, with_site: bool) -> tuple[object, ...]:
    what = re.sub(r"\d[\d.,]*", "#", recompile.diff or "")
    return (recompile.key, recompile.reason, what) if with_site else (recompile.reason, what)


# A fused program's change at one of its ops: `op 0 aten.addmm.default (train.py:12): arg 1 dim 0: 8 -> 12`.
_FUSED_OP_CHANGE = re.compile(r"op \d+ (\S+) \([^)]*\): (.*)")
_OTHER_REASONS = re.compile(r" \(and \d+ other reasons?\)$")


def _op_cause(recompile: Recompile) -> tuple[object, ...]:
    """The recompile's reason with each op whose input changed and how (figures blanked out), alike for a fused
    program's change at one of its ops and a single-op program's change at its own inputs (`input 1 dim 0`)."""
    changes = set()
    for part in _OTHER_REASONS.sub("", recompile.diff or "").split("; "):
        fused = _FUSED_OP_CHANGE.fullmatch(part)
        op, change = (fused.group(1), fused.group(2).replace("arg ", "input ")) if fused else (recompile.name, part)
        changes.add((op, re.sub(r"\d[\d.,]*", "#", change)))
    return (recompile.reason, tuple(sorted(changes, key=str)))


def _grouped(recompiles: list[Recompile]) -> list[list[Recompile]]:
    groups: dict[tuple[object, ...], list[Recompile]] = {}
    for recompile in recompiles:
        groups.setdefault(_cause(recompile, True), []).append(recompile)
    return list(groups.values())


def _finding_changes(before_run: RunFigures, after_run: RunFigures) -> tuple[FindingChange, ...]:
    """Findings new, fixed or changed, of the analyzers that ran on both runs (one that cannot run on an import
    finds nothing there, which is no fix)."""
    skipped = before_run.skipped_analyzers | after_run.skipped_analyzers
    old = {item.key: item.finding for item in before_run.findings if item.finding.analyzer not in skipped}
    new = {item.key: item.finding for item in after_run.findings if item.finding.analyzer not in skipped}
    _pair_lineless(old, new)
    changes = []
    for key, finding in new.items():
        site = f"{finding.file}:{finding.line}" if finding.file else None
        if key not in old:
            changes.append(FindingChange("new", finding.title, site, 0.0, finding.cost_total_ns))
        elif old[key].title != finding.title:
            changes.append(FindingChange("changed", finding.title, site, old[key].cost_total_ns, finding.cost_total_ns))
    for key, finding in old.items():
        if key not in new:
            site = f"{finding.file}:{finding.line}" if finding.file else None
            changes.append(FindingChange("fixed", finding.title, site, finding.cost_total_ns, 0.0))
    order = {"new": 0, "changed": 1, "fixed": 2}
    return tuple(sorted(changes, key=lambda change: (order[change.status], -change.after_ns)))


def _pair_lineless(old: dict[tuple[str, str, str], Finding], new: dict[tuple[str, str, str], Finding]) -> None:
    """Key a finding with no line in B as its A twin when the title's words differ (`the chip ran 0 ns` in one
    run, `the chip would run (target roofline estimate) 18 ns` in the other) but it is the only one of its analyzer
    and module left unmatched on each side: the same finding, changed, not one new and one fixed."""
    def lineless(findings: dict[tuple[str, str, str], Finding], others: dict[tuple[str, str, str], Finding]
                 ) -> dict[tuple[str, str], list[tuple[str, str, str]]]:
        groups: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
        for key, finding in findings.items():
            if finding.file is None and key not in others:
                groups.setdefault((key[0], key[1]), []).append(key)
        return groups

    old_groups, new_groups = lineless(old, new), lineless(new, old)
    for group, new_keys in new_groups.items():
        old_keys = old_groups.get(group, [])
        if len(new_keys) == 1 and len(old_keys) == 1:
            new[old_keys[0]] = new.pop(new_keys[0])


def _headline(figures: tuple[FigureChange, ...], recompiles: tuple[RecompileChange, ...],
              findings: tuple[FindingChange, ...]) -> str:
    new_recompiles = [change for change in recompiles if change.status == "new"]
    if new_recompiles:
        first = new_recompiles[0]  # the earliest: later recompiles are often its consequences
        why = first.recompile.diff or first.recompile.reason or "unknown reason"
        return f"regression: new recompile at {first.recompile.site or 'an unknown line'} ({why})"
    # A new finding that costs this run nothing (the compile cache's suggestion, which comes and goes with the
    # compile's share of a run) is listed, but is no regression.
    new_findings = [change for change in findings if change.status == "new" and change.after_ns > 0]
    if new_findings:
        return f"regression: new finding at {new_findings[0].site or 'no line'}: {new_findings[0].title}"
    worse = [change for change in figures if change.worse]
    if worse:
        return f"regression: {worse[0].name} {worse[0].text}"
    return NO_REGRESSION


def improvements(difference: RunDiff) -> str | None:
    """One line naming what got better beyond noise (step time first), or None when nothing did."""
    better = []
    for change in difference.figures:
        if change.before is None or change.after is None:
            continue
        if change.name == "steady step time":
            noise = NOISE_SPREADS * (difference.before.step_spread_ns + difference.after.step_spread_ns)
            if change.before - change.after > noise and change.after > 0:
                better.append(f"steady step time {change.text.split(' (noise')[0]} ({change.before / change.after:.3g}x faster)")
        elif change.name in ("recompiles after warm-up", "host syncs", "CPU fallbacks", "transfers") and change.after < change.before:
            better.append(f"{change.name} {change.text}")
    fixed = [change for change in difference.findings if change.status == "fixed"]
    if fixed:
        better.append(f"{len(fixed)} finding{'s' if len(fixed) > 1 else ''} fixed")
    return "improved: " + "; ".join(better) if better else None
