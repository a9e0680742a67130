"""The difference between two runs: each figure before and after, recompiles and findings new, fixed or
changed (matched by source line, see `figures.SiteKey`), and the headline: the most important regression.
"""

from __future__ import annotations

from dataclasses import dataclass

from tputrace.compare.figures import Recompile, RunFigures, SiteFinding
from tputrace.wording import format_bytes, format_ns

# A step-time change counts when it exceeds this many times the two runs' combined spread.
NOISE_SPREADS = 3.0


@dataclass(frozen=True)
class FigureChange:
    """One figure in both runs; `worse` when B's value is a regression (beyond noise for step time)."""

    name: str
    before: float
    after: float
    worse: bool
    text: str


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
class RunDiff:
    before: RunFigures
    after: RunFigures
    figures: tuple[FigureChange, ...]
    recompiles: tuple[RecompileChange, ...]
    findings: tuple[FindingChange, ...]
    headline: str


def compare(before: RunFigures, after: RunFigures) -> RunDiff:
    """How `after` differs from `before`."""
    figures = _figure_changes(before, after)
    recompiles = _recompile_changes(before, after)
    findings = _finding_changes(before.findings, after.findings)
    return RunDiff(before, after, figures, recompiles, findings, _headline(figures, recompiles, findings))


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
    counted = (
        ("compiles", before.compiles, after.compiles),
        ("recompiles after warm-up", len(before.recompiles_after_warmup), len(after.recompiles_after_warmup)),
        ("programs", before.programs, after.programs),
        ("host syncs", before.syncs, after.syncs),
        ("transfers", before.transfers, after.transfers),
        ("CPU fallbacks", before.fallbacks, after.fallbacks),
        ("collectives", before.collectives, after.collectives),
    )
    for name, old, new in counted:
        changes.append(FigureChange(name, old, new, new > old, f"{old} -> {new}"))
    changes.append(FigureChange("compile time", before.compile_ns, after.compile_ns, False,
                                f"{format_ns(before.compile_ns)} -> {format_ns(after.compile_ns)}"))
    changes.append(FigureChange("peak memory", before.peak_memory_bytes, after.peak_memory_bytes,
                                after.peak_memory_bytes > before.peak_memory_bytes,
                                f"{format_bytes(before.peak_memory_bytes)} -> {format_bytes(after.peak_memory_bytes)}"))
    return tuple(changes)


def _recompile_changes(before: RunFigures, after: RunFigures) -> tuple[RecompileChange, ...]:
    def by_key(figures: RunFigures) -> dict[object, list[Recompile]]:
        groups: dict[object, list[Recompile]] = {}
        for recompile in figures.recompiles_after_warmup:
            groups.setdefault((recompile.key, recompile.reason), []).append(recompile)
        return groups

    old, new = by_key(before), by_key(after)
    changes = [RecompileChange("new", group[0], len(group)) for key, group in new.items() if key not in old]
    changes += [RecompileChange("fixed", group[0], len(group)) for key, group in old.items() if key not in new]
    return tuple(changes)


def _finding_changes(before: tuple[SiteFinding, ...], after: tuple[SiteFinding, ...]) -> tuple[FindingChange, ...]:
    old = {item.key: item.finding for item in before}
    new = {item.key: item.finding for item in after}
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


def _headline(figures: tuple[FigureChange, ...], recompiles: tuple[RecompileChange, ...],
              findings: tuple[FindingChange, ...]) -> str:
    new_recompiles = [change for change in recompiles if change.status == "new"]
    if new_recompiles:
        first = new_recompiles[0]  # the earliest: later recompiles are often its consequences
        why = first.recompile.diff or first.recompile.reason or "unknown reason"
        return f"regression: new recompile at {first.recompile.site or 'an unknown line'} ({why})"
    new_findings = [change for change in findings if change.status == "new"]
    if new_findings:
        return f"regression: new finding at {new_findings[0].site or 'no line'}: {new_findings[0].title}"
    worse = [change for change in figures if change.worse]
    if worse:
        return f"regression: {worse[0].name} {worse[0].text}"
    return "no regression"
