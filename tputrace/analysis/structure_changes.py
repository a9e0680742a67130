"""Programs whose ops change from step to step: a program compiled again in the steady steps because the step ran
other ops (`structure change at op 57 (train.py:30): ...`), not because an input's shape changed.

Python control flow that picks other ops in each step (a random teacher-forcing choice per time step, a layer skipped
at random, a loop whose trip count follows the data) records another graph each step, and DeferAndFuse compiles each
new one. No bucketing fixes it: the step must run the same ops every time, choosing on the chip (`torch.where`).
The finding is at the line where the recompiles' diffs most often say the ops first differ, a forward's line before a
line calling a backward (which runs the changed ops' gradients, where nothing can change); where a `bool` read in those
steps comes before that line in its function (`if mask.any():`), at that read: the branch that picks the ops.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from tputrace.analysis.backward_reads import BACKWARD_CALL
from tputrace.analysis.call_sites import line_text
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import MEASURED_ON_HOST, Finding
from tputrace.analysis.storms import NAME
from tputrace.wording import format_ns, plural

MIN_RECOMPILES = 2  # structure recompiles in the steady steps, in as many steps at least
MAX_LISTED_DIFFS = 3
RANDOM_CHOICE_FIX = (
    "Run the same ops every step and choose on the chip: compute both sides and select with "
    "`torch.where(torch.rand((), device=x.device) < p, a, b)` instead of `if random.random() < p:`, keep "
    "loop counts fixed, and mask work instead of skipping it. Then the step compiles once; a few fixed "
    "variants would each compile once and be reused, but a choice per time step makes a new one almost "
    "every step."
)
BRANCH_FIX = (
    "Run both sides of the branch at {where} every step and choose on the chip: select the result with "
    "`torch.where(condition, a, b)`, or weight a masked term by the mask (`(loss * mask).sum() / mask.sum().clamp(min=1)` "
    "adds 0 where nothing is selected) in place of `if mask.any():`. Then the step runs the same ops, compiles once, "
    "and the host reads nothing."
)
_POSITION = re.compile(r"^structure change at op \d+ \((?P<file>[^()]+?):(?P<line>\d+)\)")


@dataclass(frozen=True)
class StructureStorm:
    """The recompiles of one call site whose ops changed from step to step: where they first differ most often,
    the programs, and the steady steps that compiled."""

    where: str
    programs: tuple[str, ...]
    recompiles: int
    recompile_ns: int
    steps: tuple[int, ...]


@dataclass(frozen=True)
class _Recompile:
    compile_id: int
    name: str
    dur_ns: int
    step: int
    diff: str
    position: tuple[str, int] | None  # (file, line) of the op where the structure first differs


def findings(context: AnalysisContext, leave_out: set[int], not_evicted: str,
             evicted: list[int]) -> list[tuple[Finding, StructureStorm]]:
    """One finding per call site whose programs compiled again in two steady steps or more, the last in the later
    half of them, because the step's ops changed (`leave_out`: compile ids another finding explains)."""
    steady = context.steady_range
    if not context.steps or steady is None:
        return []
    warm_up = context.warm_up_in_steady
    trace = context.trace
    by_site: dict[int | None, list[_Recompile]] = {}
    for compile_id, name_sid, dur_ns, diff_sid, step, frame_id in trace.sql(
        "SELECT id, name_sid, COALESCE(dur_ns, 0), diff_sid, step, frame_id FROM compiles WHERE rank = ? AND "
        f"reason = 'recompile' AND diff_sid IS NOT NULL AND step BETWEEN ? AND ? AND {not_evicted} ORDER BY start_ns",
        (context.rank, *steady, *evicted),
    ):
        diff = trace.string(diff_sid) or ""
        if compile_id in leave_out or step == warm_up or not diff.startswith("structure change"):
            continue
        position = _POSITION.match(diff)
        by_site.setdefault(frame_id, []).append(_Recompile(
            compile_id, trace.string(name_sid) or "?", dur_ns, step, diff,
            None if position is None else (position.group("file"), int(position.group("line"))),
        ))
    middle = (steady[0] + steady[1]) / 2
    return [_finding(context, frame_id, recompiles) for frame_id, recompiles in by_site.items()
            if len({recompile.step for recompile in recompiles}) >= MIN_RECOMPILES
            and recompiles[-1].step >= middle]  # still compiling in the later steps: variants that settle are no storm


def _finding(context: AnalysisContext, site: int | None, recompiles: list[_Recompile]) -> tuple[Finding, StructureStorm]:
    named = Counter(recompile.position for recompile in recompiles if recompile.position is not None)
    positions = _forward_positions(context, named)
    anchor = site
    if positions:
        (file, line), _ = positions.most_common(1)[0]
        anchor = context.frame_at_line(file, line) or site
    names = tuple(dict.fromkeys(recompile.name for recompile in recompiles))
    programs = names[0] if len(names) == 1 else f"{len(names)} programs"
    steps = tuple(sorted({recompile.step for recompile in recompiles}))
    branch = _branch_read(context, list(positions), steps)
    anchor = branch if branch is not None else anchor
    where = context.where(anchor)
    total_ns = sum(recompile.dur_ns for recompile in recompiles)
    share = context.share_of_steps(total_ns)
    lines = ", ".join(f"{file.rsplit('/', 1)[-1]}:{line} ({plural(count, 'time')})"
                      for (file, line), count in named.most_common(3))
    evidence = [context.evidence_at(f"step {recompile.step}: {recompile.name} compiled again, "
                                    f"{format_ns(recompile.dur_ns)}: {recompile.diff}", anchor, table="compiles")
                for recompile in recompiles[:MAX_LISTED_DIFFS]]
    evidence.append(context.evidence_at(f"the program is flushed at {context.where(site)}", site, table="compiles"))
    finding = Finding(
        analyzer=NAME,
        severity=context.severity(share),
        title=(f"The step's ops change from step to step: the graph flushed at {context.where(site)} compiled again "
               f"in {len(steps)} of {context.steady_count} steady steps ({programs}), "
               + (f"picked by the branch at {where}" if branch is not None else f"first differing at {where}")),
        explanation=(
            f"The steady steps ran different ops, so DeferAndFuse recorded a new graph and compiled it: "
            f"{plural(len(recompiles), 'recompile')}, {format_ns(total_ns)} ({context.share_text(share)}). No input "
            f"shape changed; the ops did, first at {lines or where}. Python control flow chooses other ops in each "
            f"step: a random choice (teacher forcing decided per time step, a layer skipped at random), a branch on "
            f"a value read from the chip, or a loop whose count follows the data."
            + (f" Here it is the branch at {where}, which reads a chip value (`if mask.any():`) and runs other ops "
               "on each side." if branch is not None else "")
        ),
        suggestion=BRANCH_FIX.format(where=where) if branch is not None else RANDOM_CHOICE_FIX,
        cost_total_ns=float(total_ns),
        cost_per_step_ns=total_ns / context.steady_count if context.steady_count else None,
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(evidence),
        **context.location_fields(anchor),
    )
    return finding, StructureStorm(where, names, len(recompiles), total_ns, steps)


def _forward_positions(context: AnalysisContext, positions: Counter[tuple[str, int]]) -> Counter[tuple[str, int]]:
    """`positions` less those at lines calling a backward (`loss.backward()`: its ops are the gradients of the forward's
    changed ops), unless only those remain."""
    forward = Counter({position: count for position, count in positions.items()
                       if not BACKWARD_CALL.search(_text_at(context, position))})
    return forward or positions


def _text_at(context: AnalysisContext, position: tuple[str, int]) -> str:
    frame_id = context.frame_at_line(*position)
    return (line_text(context.location(frame_id), context.trace) or "") if frame_id is not None else ""


def _branch_read(context: AnalysisContext, positions: list[tuple[str, int]], steps: tuple[int, ...]) -> int | None:
    """The frame of the nearest `bool` read (`if mask.any():`) in `steps` at or before the first of `positions` in its
    function: the branch whose sides run the ops that differ. None when no such read precedes them."""
    locations = [location for position in positions
                 if (location := context.location(context.frame_at_line(*position))) is not None]
    if not locations or not steps:
        return None
    first = min(locations, key=lambda location: location.line)
    marks = ", ".join("?" * len(steps))
    reads = context.trace.sql(f"SELECT DISTINCT frame_id FROM syncs WHERE rank = ? AND kind = 'bool' AND step IN ({marks}) "
                              "AND frame_id IS NOT NULL", (context.rank, *steps))
    preceding = [(location.line, frame_id) for (frame_id,) in reads
                 if (location := context.location(frame_id)) is not None and location.file == first.file
                 and location.function == first.function and location.line <= first.line]
    return max(preceding)[1] if preceding else None
