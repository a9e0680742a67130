"""A recompile after warm-up that no storm explains: one step of the loop compiled again, once, and that compile
took a large share of the run, as when a loop's last batch is smaller than the others (a dataset whose size the
batch size does not divide) and every program it reaches is compiled again for it.

The storms of the `recompiles` family need a site compiled again and again; this finds the step in which a few
recompiles happened once, after the warm-up step, in a loop of three steps or more, and that no other finding
explains, in a step where no other finding names a recompile (a storm whose last size that step took names
the change). A first compile (a function first called after warm-up, an evaluation pass) is set-up, not a recompile,
and is left out with the recompiles of its step (that work's other programs, compiled again for its inputs), as are recompiles of a program that ran other ops (a structure change: set-up work or a step's
tail run in the next step's graph, an evaluation pass; `set_up_work`, `step_tail` and structure storms name those)
and the Dynamo recompiles of a function `guard_recompiles` names (it recompiled again and again).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputrace.analysis import guard_recompiles
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import MEASURED_ON_HOST, Finding
from tputrace.analysis.imported import context_import_facts
from tputrace.analysis.set_up_work import LOCATION
from tputrace.analysis.storms import NAME
from tputrace.wording import format_ns, plural

MIN_WALL_SHARE = 0.05  # of the run's wall: a large share, not one a long run would not notice
MAX_STEPS = 2  # steps with such recompiles: more is a storm, the other analyzers' to name
_SIZE_CHANGE = re.compile(r"dim (?P<dim>\d+): (?P<before>\d+) -> (?P<after>\d+)|index (?P<index>\d+)\. expected "
                          r"(?P<expected>\d+), actual (?P<actual>\d+)")
_STRUCTURE = "structure change"


@dataclass(frozen=True)
class LateRecompile:
    """One steady step's recompiles: its number, where, their count and time (each instant once), the step's time
    against the median step's, and the size that changed (`before`, `after`; 0 when no size did)."""

    step: int
    where: str
    recompiles: int
    compile_ns: int
    step_ns: int
    median_step_ns: int
    last_step: bool
    dim: int
    before: int
    after: int


@dataclass(frozen=True)
class _Row:
    compile_id: int
    step: int
    kind: str
    name: str
    diff: str
    start_ns: int
    dur_ns: int
    frame_id: int | None


def findings(context: AnalysisContext, explained: set[int], not_evicted: str,
             evicted: list[int]) -> list[tuple[Finding, LateRecompile, set[int]]]:
    """The finding of each steady step whose recompiles no other finding explains and that cost a large share of the
    run, with its data and the compiles it explains."""
    first_steady, loop = context.first_steady_after_warm_up, context.loop_range
    median = context.median_step_ns
    if first_steady is None or loop is None or not median:
        return []
    rows = [_Row(*row) for row in context.trace.sql(
        "SELECT c.id, c.step, c.kind, COALESCE(n.text, '?'), COALESCE(d.text, ''), c.start_ns, COALESCE(c.dur_ns, 0), "
        "c.frame_id FROM compiles c LEFT JOIN strings n ON n.id = c.name_sid LEFT JOIN strings d ON d.id = c.diff_sid "
        f"WHERE c.rank = ? AND c.reason IN ('recompile', 'guard_failure') AND c.step BETWEEN ? AND ? AND {not_evicted} "
        "ORDER BY c.start_ns",
        (context.rank, first_steady, loop[1], *evicted))]
    storming = _guard_storms(context)
    by_step: dict[int, list[_Row]] = {}
    named = set()  # steps in which another finding names recompiles: it names the change too (a storm's last size)
    for row in rows:
        if row.compile_id in explained or (row.kind == "dynamo_frame" and (row.frame_id, row.name) in storming):
            named.add(row.step)
            continue
        if row.diff.startswith(_STRUCTURE):
            continue  # other ops, not other inputs: set-up work, a step's tail, an evaluation (their own analyzers)
        by_step.setdefault(row.step, []).append(row)
    # A step that compiled programs for the first time ran work the loop had not run before (an evaluation pass on
    # held-out data, a checkpoint): its recompiles are part of that one-time work.
    new_work = {step for (step,) in context.trace.sql(
        "SELECT DISTINCT step FROM compiles WHERE rank = ? AND reason = 'first' AND step BETWEEN ? AND ?",
        (context.rank, first_steady, loop[1]))}
    for step in named | new_work:
        by_step.pop(step, None)
    if len(by_step) > MAX_STEPS:
        return []
    durations = {step.step: step.dur_ns or 0 for step in context.loop_steps}
    found = []
    for step, step_rows in by_step.items():
        compile_ns = _union_ns(step_rows)
        if compile_ns < median or context.share_of_wall(compile_ns) < MIN_WALL_SHARE:
            continue
        dim, before, after = _size_change(step_rows)
        frame_id = _entered_at(context, step_rows)
        late = LateRecompile(step, context.where(frame_id), len(step_rows), compile_ns, durations.get(step, 0),
                             int(median), step == loop[1], dim, before, after)
        found.append((_finding(context, late, step_rows, frame_id), late, {row.compile_id for row in step_rows}))
    return found


def _entered_at(context: AnalysisContext, rows: list[_Row]) -> int | None:
    """Where the change entered: the line the costliest recompile's diff names (the op that first took the new
    input, `op 0 aten.addmm.default (train.py:8): arg 1 dim 0: 32 -> 5`), else where that program was compiled."""
    top = max(rows, key=lambda row: row.dur_ns)
    named = LOCATION.search(top.diff)
    frame_id = context.frame_at_line(named["file"], int(named["line"])) if named is not None else None
    return frame_id if frame_id is not None else top.frame_id


def _guard_storms(context: AnalysisContext) -> set[tuple[int | None, str]]:
    """The compiled functions `guard_recompiles` names: Dynamo recompiled them again and again."""
    return {(frame_id, name or "?") for frame_id, name, count in context.trace.sql(
        "SELECT c.frame_id, n.text, COUNT(*) FROM compiles c LEFT JOIN strings n ON n.id = c.name_sid "
        "WHERE c.rank = ? AND c.kind = 'dynamo_frame' AND c.reason = 'recompile' AND c.signature_sid IS NULL "
        "GROUP BY c.frame_id, c.name_sid", (context.rank,)) if count >= guard_recompiles.MIN_RECOMPILES}


def _union_ns(rows: list[_Row]) -> int:
    """The time the compiles took, an instant they overlap once (a graph's XLA compile inside Dynamo's)."""
    total, reached = 0, None
    for start, end in sorted((row.start_ns, row.start_ns + row.dur_ns) for row in rows):
        if reached is None or start >= reached:
            total += end - start
            reached = end
        elif end > reached:
            total += end - reached
            reached = end
    return total


def _size_change(rows: list[_Row]) -> tuple[int, int, int]:
    """The first size a recompile's diff says changed: (dim, before, after); (0, 0, 0) where none did."""
    for row in rows:
        match = _SIZE_CHANGE.search(row.diff)
        if match is not None:
            if match["dim"] is not None:
                return int(match["dim"]), int(match["before"]), int(match["after"])
            return int(match["index"]), int(match["expected"]), int(match["actual"])
    return 0, 0, 0


def _finding(context: AnalysisContext, late: LateRecompile, rows: list[_Row], frame_id: int | None) -> Finding:
    share = context.share_of_wall(late.compile_ns)
    smaller = 0 < late.after < late.before
    spent = f"{format_ns(late.compile_ns)}, {share:.0%} of the run"
    if smaller and late.last_step:
        title = f"The last batch, smaller ({late.after} rows, not {late.before}), compiled again in step {late.step}: {spent}"
    elif late.before:
        title = f"A size change ({late.before} -> {late.after}) compiled again in step {late.step}: {spent}"
    else:
        title = f"A recompile after warm-up in step {late.step}: {spent}"
    names = ", ".join(sorted({row.name for row in rows})[:4])
    explanation = (
        f"Step {late.step} took {format_ns(late.step_ns)} against a median step of {format_ns(late.median_step_ns)}: "
        f"{plural(late.recompiles, 'recompile')} of {names} after the warm-up step, each a program the loop had "
        f"compiled already, compiled again because its inputs changed ({rows[0].diff or 'no diff recorded'}). "
        "It is paid once a run (or an epoch, where the compiled programs are not kept), not every step.")
    dynamo = any(row.kind == "dynamo_frame" for row in rows)
    imported = context_import_facts(context) is not None
    if late.before:
        fix = ("Give every batch the size the loop compiled for: `DataLoader(..., drop_last=True)`, or pad the last batch "
               "to the full batch size and mask the padded rows out of the loss" if smaller and late.last_step else
               f"Keep dim {late.dim} of the input at the size the loop compiled for (pad it, and mask the padding)")
        if dynamo and imported:
            fix += (f", or mark the dim dynamic before the first call (`torch._dynamo.mark_dynamic(x, {late.dim})`), so that "
                    "one graph serves every size")
        elif not imported:
            fix += " (the tpu backend compiles one program per size, so marking the dim dynamic does not save it)"
        suggestion = fix + "."
    else:
        suggestion = ("Keep what the diff says changed the same as in the steps before it (an input's dtype or layout, a "
                      "Python value the program was specialised on), or do that work outside the loop.")
    return Finding(
        analyzer=NAME,
        # Paid once: its share of a short traced run says more than of a long one's, so it is never critical.
        severity="warning" if share >= 0.05 else "info",
        title=title,
        explanation=explanation,
        suggestion=suggestion,
        cost_total_ns=float(late.compile_ns),
        cost_per_step_ns=None,
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(context.evidence_at(f"{row.name} ({row.kind}) in step {row.step}, {format_ns(row.dur_ns)}: "
                                           f"{row.diff or 'no diff recorded'}", row.frame_id, table="compiles")
                       for row in sorted(rows, key=lambda row: -row.dur_ns)[:6]),
        **context.location_fields(frame_id),
    )
