"""A chip tensor indexed with a Python int that changes from step to step: a program compiled again for each value.

`losses[step] = loss.detach()` or `out[:, i] = token` selects the element at a Python number, which the program takes
as a constant: the recompile's diff names the view and its index (`op 0 view_write (train.py:14): view
aten.select.int: index 3 -> 4`; in strict mode, a view's own program, `view aten.select.int: index 3 -> 4`), with the
same input shapes. A position that moves on every step makes a new program
every step. No bucketing fixes it: the position must be a tensor on the chip (`index_copy_`, `torch.where`). One
finding per program site (the line the diffs name, else the line that flushed the program), with at least
`MIN_RECOMPILES` such recompiles over `MIN_POSITIONS` positions, `MIN_STEADY_STEPS` of them in steady steps.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import MEASURED_ON_HOST, Finding
from tputrace.analysis.storms import NAME
from tputrace.wording import format_ns, plural

MIN_RECOMPILES = 3
MIN_POSITIONS = 3
MIN_STEADY_STEPS = 2
MAX_LISTED_DIFFS = 3
# `op 0 view_write (train.py:14): view aten.select.int: index 3 -> 4`, `op 10 view_write: view aten.select.int: ...`;
# strict mode's program of one view names no op (`view aten.select.int, aten.unsqueeze.default: index 0 -> 1`).
# A chain of views names each (`view aten.select.int, aten.expand.default: index 3 -> 2` for `table[t].expand(8, 1)`).
_INDEX_CHANGE = re.compile(r"^(?:op \d+ \S+(?: \((?P<file>[^()]+?):(?P<line>\d+)\))?: )?view (?P<view>aten\.[\w.]+)"
                           r"(?:, aten\.[\w.]+)*: "
                           r"index (?P<before>-?\d+) -> (?P<after>-?\d+)$")


@dataclass(frozen=True)
class IndexStorm:
    """The recompiles of one site for new Python-int positions of a view: where, which view, the positions, steps."""

    where: str
    view: str
    programs: tuple[str, ...]
    recompiles: int
    recompile_ns: int
    positions: tuple[int, ...]
    steps: tuple[int, ...]


@dataclass(frozen=True)
class _Recompile:
    compile_id: int
    name: str
    dur_ns: int
    step: int
    diff: str
    view: str
    positions: tuple[int, int]


def findings(context: AnalysisContext, leave_out: set[int], not_evicted: str,
             evicted: list[int]) -> list[tuple[Finding, IndexStorm, set[int]]]:
    """One finding per site whose recompiles, that no other finding explains (`leave_out`), changed only a view's
    index, over enough positions and steps."""
    trace = context.trace
    steady = context.steady_range if context.steps else None
    warm_up = context.warm_up_in_steady
    by_site: dict[int | None, list[_Recompile]] = {}
    for compile_id, name_sid, dur_ns, step, diff_sid, frame_id in trace.sql(
        "SELECT id, name_sid, COALESCE(dur_ns, 0), COALESCE(step, 0), diff_sid, frame_id FROM compiles WHERE rank = ? "
        f"AND reason = 'recompile' AND diff_sid IS NOT NULL AND {not_evicted} ORDER BY start_ns",
        (context.rank, *evicted),
    ):
        diff = trace.string(diff_sid) or ""
        match = _INDEX_CHANGE.match(diff)
        if compile_id in leave_out or match is None:
            continue
        site = context.frame_at_line(match["file"], int(match["line"])) if match["line"] else None
        by_site.setdefault(site if site is not None else frame_id, []).append(_Recompile(
            compile_id, trace.string(name_sid) or "?", dur_ns, step, diff, match["view"],
            (int(match["before"]), int(match["after"]))))
    found = []
    for site, recompiles in by_site.items():
        positions = sorted({position for recompile in recompiles for position in recompile.positions})
        steady_steps = {recompile.step for recompile in recompiles
                        if steady is not None and steady[0] <= recompile.step <= steady[1] and recompile.step != warm_up}
        # a loop after the training loop (sampling over timesteps, a decode) recompiles in the run's `end` step only
        after_loop = context.end_step is not None and all(recompile.step == context.end_step for recompile in recompiles)
        if len(recompiles) < MIN_RECOMPILES or len(positions) < MIN_POSITIONS or (
                steady is not None and len(steady_steps) < MIN_STEADY_STEPS and not after_loop):
            continue
        found.append(_finding(context, site, recompiles, positions, after_loop=after_loop))
    return found


def _finding(context: AnalysisContext, site: int | None, recompiles: list[_Recompile],
             positions: list[int], *, after_loop: bool = False) -> tuple[Finding, IndexStorm, set[int]]:
    where = context.where(site)
    view = Counter(recompile.view for recompile in recompiles).most_common(1)[0][0]
    names = tuple(dict.fromkeys(recompile.name for recompile in recompiles))
    programs = names[0] if len(names) == 1 else f"{len(names)} programs"
    steps = tuple(sorted({recompile.step for recompile in recompiles}))
    total_ns = sum(recompile.dur_ns for recompile in recompiles)
    share = context.share_of_wall(total_ns)
    own_programs = all(recompile.diff.startswith("view ") for recompile in recompiles)  # strict mode's view programs
    shown = ", ".join(str(position) for position in positions[:8]) + (", ..." if len(positions) > 8 else "")
    in_steps = (" after the loop" if after_loop else
                f" in {len(steps)} of {context.step_count} steps" if context.steps else "")
    when = " after the loop" if after_loop else " in step {step}" if context.steps else ""
    evidence = [context.evidence_at(f"{recompile.name} compiled again{when.format(step=recompile.step)}, "
                                    f"{format_ns(recompile.dur_ns)}: {recompile.diff}", site, table="compiles")
                for recompile in recompiles[:MAX_LISTED_DIFFS]]
    finding = Finding(
        analyzer=NAME,
        severity=context.severity(share),
        title=(f"Recompilation storm: {programs} compiled {plural(len(recompiles), 'time')}{in_steps} as a Python int "
               f"indexing a tensor changes ({len(positions)} positions), recorded at {where}"),
        explanation=(
            f"The programs' inputs kept their shapes; what changed is the position of an `{view}` view, a Python number "
            f"the program takes as a constant ({shown}): indexing a chip tensor with a loop counter (`losses[step] = "
            f"loss.detach()`, `out[:, i] = token`, or a read `x[:, i]`) makes a new program for each value: "
            f"{plural(len(recompiles), 'recompile')}, {format_ns(total_ns)} ({share:.0%} of the run). "
            + (f"The view is a program of its own, compiled where its value is first taken ({where}): the indexing line is "
               "that one or one before it." if own_programs else
               f"DeferAndFuse records a write into a view where the program is flushed, so the indexing line is {where} "
               "or one the program ran before it.")
            + (" The indexing runs after the training loop's last step (sampling over timesteps, a decode or an "
               "evaluation after training): every run of the script pays these compiles once, at its end."
               if after_loop else "")
        ),
        suggestion=(
            "Index with a tensor on the chip, so the position is an input of one program: keep it as a chip tensor "
            "(`pos = torch.zeros(1, dtype=torch.long, device=...)` before the loop, `pos += 1` each step) and write with "
            "`buf.index_copy_(0, pos, value.view(1))` (read with `buf.index_select(0, pos)`), or collect the values in a "
            "Python list and `torch.stack` them after the loop."
        ),
        cost_total_ns=float(total_ns),
        cost_per_step_ns=None if after_loop else context.per_step(total_ns),
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(evidence),
        **context.location_fields(site),
    )
    storm = IndexStorm(where, view, names, len(recompiles), total_ns, tuple(positions), steps)
    return finding, storm, {recompile.compile_id for recompile in recompiles}
