"""Set-up work that ran in the first step's graph: device work left pending before the loop (a
`torch.zeros(..., device="tpu")` accumulator made after the optimizer) goes into DeferAndFuse's first
graph, so that graph is never seen again and the second step compiles its own.

Such a recompile is a fused one in step 1 whose diff says that ops were left out at op 0 (see
`docs/trace-format.md`, compiles): the ops and the line that made them are in the diff. A line that
also records ops in a later step is the loop's own work, which something in step 1 flushed apart from
the step's graph (a collective DDP makes once in its second forward), not set-up: it is left out. One
finding per set-up line, costed at the compiles it caused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext, in_list
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding
from tputrace.wording import format_ns, plural

NAME = "set_up_work"
# "structure change at op 0 (train.py:30): aten.zero_.default (train.py:26) left out (21 ops -> 20 ops)"
_LEFT_OUT_FIRST = re.compile(r"^structure change at op 0(?: \([^()]*\))?: (?P<ops>.+?) left out(?:;| \()")
LOCATION = re.compile(r"\((?P<file>[^()]+):(?P<line>\d+)\)")


@dataclass(frozen=True)
class SetUpLine:
    """A set-up line whose work ran in the first step's graph, and the recompiles it caused."""

    where: str
    recompiles: int
    compile_ns: int


@dataclass(frozen=True)
class SetUpWorkData:
    set_up_lines: tuple[SetUpLine, ...] = ()


# One recompile of step 1: its program's name, the frame that flushed it, its compile ns, the ops and the diff.
StepOneRecompile = tuple[str, int | None, int, str, str]


def step_one_recompiles_by_line(
    context: AnalysisContext, located: Callable[[str], tuple[str, int, str] | None]
) -> dict[tuple[str, int], list[StepOneRecompile]]:
    """Step 1's fused recompiles with a diff, by the (file, line) `located` reads from each diff, with the ops text
    it gives; a diff it gives None is left out."""
    trace = context.trace
    rows = trace.sql(
        "SELECT name_sid, frame_id, COALESCE(dur_ns, 0), diff_sid FROM compiles "
        "WHERE rank = ? AND kind = 'fused' AND reason = 'recompile' AND step = 1 AND diff_sid IS NOT NULL ORDER BY start_ns",
        (context.rank,),
    )
    by_line: dict[tuple[str, int], list[StepOneRecompile]] = {}
    for name_sid, frame_id, dur_ns, diff_sid in rows:
        diff = trace.string(diff_sid) or ""
        found = located(diff)
        if found is not None:
            file_name, line, ops = found
            by_line.setdefault((file_name, line), []).append((trace.string(name_sid) or "?", frame_id, dur_ns, ops, diff))
    return by_line


def step_one_evidence(context: AnalysisContext, recompiles: list[StepOneRecompile]) -> tuple[Evidence, ...]:
    """Each recompile's program, compile time and diff, at the frame that flushed it."""
    return tuple(
        context.evidence_at(f"{name}: compiled again in step 1, {format_ns(dur_ns)}: {diff}", frame_id, table="compiles")
        for name, frame_id, dur_ns, _, diff in recompiles
    )


def analyze(context: AnalysisContext) -> AnalysisResult[SetUpWorkData]:
    def located(diff: str) -> tuple[str, int, str] | None:
        match = _LEFT_OUT_FIRST.match(diff)
        where = LOCATION.search(match["ops"]) if match else None
        if match is None or where is None or runs_after_first_step(context, where["file"], int(where["line"])):
            return None
        return where["file"], int(where["line"]), match["ops"]

    by_line = step_one_recompiles_by_line(context, located)
    findings = tuple(_finding(context, file_name, line, recompiles) for (file_name, line), recompiles in by_line.items())
    lines = tuple(
        SetUpLine(f"{file_name}:{line}", len(recompiles), sum(row[2] for row in recompiles))
        for (file_name, line), recompiles in by_line.items()
    )
    return AnalysisResult(NAME, SetUpWorkData(lines), findings)


def runs_after_first_step(context: AnalysisContext, file_name: str, line: int) -> bool:
    """Whether ops were recorded at `file_name:line` (as a recompile's diff names it) in a step after the first."""
    frames = context.frames_at_line(file_name, line)
    rows = context.trace.sql(
        f"SELECT 1 FROM ops WHERE rank = ? AND step >= 1 AND frame_id IN {in_list(frames)} LIMIT 1",
        (context.rank, *frames),
    ) if frames else []
    return bool(rows)


def _finding(context: AnalysisContext, file_name: str, line: int, recompiles: list[StepOneRecompile]) -> Finding:
    total_ns = sum(dur_ns for _, _, dur_ns, _, _ in recompiles)
    share = context.share_of_wall(total_ns)
    ops = recompiles[0][3]
    programs = ", ".join(sorted({name for name, *_ in recompiles}))
    first_graphs = sorted({context.where(frame_id) for _, frame_id, *_ in recompiles})
    evidence = step_one_evidence(context, recompiles)
    set_up_frame = context.frame_at_line(file_name, line)
    return Finding(
        analyzer=NAME,
        # Paid once: its share of a short traced run says little of a long one's, so it is never critical.
        severity="info" if context.severity(share) == "info" else "warning",
        title=f"Set-up work at {file_name}:{line} ran in the first step's graph: {plural(len(recompiles), 'program')} compiled again in step 1",
        explanation=(
            f"The set-up work ({ops}) was still pending on the chip when the first step began, so DeferAndFuse ran it "
            "inside that "
            f"step's graph (flushed at {', '.join(first_graphs)}). The second step's graph, without it, is another "
            f"program ({programs}), compiled again: {format_ns(total_ns)} of compiling ({share:.0%} of the run). "
            "Later steps run the second step's program; the first step's ran once."
        ),
        suggestion=(
            f"Run the set-up before the loop: call `torch.tpu.synchronize()` (or `tputrace.step()`) after {file_name}:{line}, "
            "or make the value where the loop first uses it, so the first step's graph is the one every later step runs."
        ),
        cost_total_ns=float(total_ns),
        cost_per_step_ns=None,
        evidence=evidence,
        **context.location_fields(set_up_frame),
    )

