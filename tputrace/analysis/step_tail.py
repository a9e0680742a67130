"""Work at the end of a step that ran in the next step's graph: DeferAndFuse flushes after `optimizer.step()`, so
device work the loop does after it (a metric, a greedy decode's last tokens) that nothing reads in that step stays
pending and runs at the start of the next step's graph. The first step's graph had nothing before it, so the second
step's graph is another program, compiled again once.

Such a recompile is a fused one in step 1 whose diff says that ops were added at op 0 (see `docs/trace-format.md`,
compiles), at a line that records ops in every step: the loop's own work. A line recording ops only in the first
step is set-up (`set_up_work`). One finding per tail line, costed at the compiles it caused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Finding
from tputrace.analysis.set_up_work import LOCATION, StepOneRecompile, runs_after_first_step, step_one_evidence, step_one_recompiles_by_line
from tputrace.wording import format_ns, plural

NAME = "step_tail"
# "structure change at op 0 (train.py:22): 4 ops, aten.argmax.default to aten.mean.default (train.py:22) added (78 ops -> 82 ops)"
_ADDED_FIRST = re.compile(r"^structure change at op 0(?: \((?P<run>[^()]*)\))?: (?P<ops>.+?) added(?:;| \()")
# "structure change at op 0 (train.py:17): aten.zero_.default (train.py:7) -> 4 ops, aten.argmax.default to
# aten.add_.Tensor (train.py:17) (17 ops -> 20 ops)": set-up work began the first step's graph, the tail the second's.
_REPLACED_FIRST = re.compile(r"^structure change at op 0(?: \((?P<run>[^()]*)\))?: (?P<before>.+?\)) -> (?P<ops>.+?)"
                             r"(?:;| \(\d+ ops -> \d+ ops\))")


@dataclass(frozen=True)
class TailLine:
    """A line whose work ran at the start of the next step's graph, and the recompiles it caused."""

    where: str
    recompiles: int
    compile_ns: int


@dataclass(frozen=True)
class StepTailData:
    tail_lines: tuple[TailLine, ...] = ()


# The tail's work is `GradScaler.update()` (its `_amp_update_scale_`).
SCALER_UPDATE = (" This work is `GradScaler.update()`: a TPU autocasts to `torch.bfloat16`, which needs no loss scaling, "
                 "so dropping the GradScaler removes it, and the scaler's read in its `step`, with it.")


def analyze(context: AnalysisContext) -> AnalysisResult[StepTailData]:
    def located(diff: str) -> tuple[str, int, str] | None:
        match = _ADDED_FIRST.match(diff)
        if match is None:
            match = _REPLACED_FIRST.match(diff)
            set_up = LOCATION.search(match["before"]) if match else None
            if match is None or set_up is None or runs_after_first_step(context, set_up["file"], int(set_up["line"])):
                return None
        where = LOCATION.search(match["ops"]) or LOCATION.search(f"({match['run'] or ''})")
        if where is None or not runs_after_first_step(context, where["file"], int(where["line"])):
            return None
        return where["file"], int(where["line"]), LOCATION.sub("", match["ops"]).strip()

    by_line = step_one_recompiles_by_line(context, located)
    findings = tuple(_finding(context, file_name, line, recompiles) for (file_name, line), recompiles in by_line.items())
    lines = tuple(
        TailLine(f"{file_name}:{line}", len(recompiles), sum(row[2] for row in recompiles))
        for (file_name, line), recompiles in by_line.items()
    )
    return AnalysisResult(NAME, StepTailData(lines), findings)


def _finding(context: AnalysisContext, file_name: str, line: int, recompiles: list[StepOneRecompile]) -> Finding:
    total_ns = sum(dur_ns for _, _, dur_ns, _, _ in recompiles)
    share = context.share_of_wall(total_ns)
    ops = recompiles[0][3]
    programs = ", ".join(sorted({name for name, *_ in recompiles}))
    graphs = sorted({context.where(frame_id) for _, frame_id, *_ in recompiles})
    evidence = step_one_evidence(context, recompiles)
    tail_frame = context.frame_at_line(file_name, line)
    replaced = _REPLACED_FIRST.match(recompiles[0][4])
    set_up = LOCATION.search(replaced["before"]) if replaced else None
    set_up_where = f"{set_up['file']}:{set_up['line']}" if set_up else None
    first_graph = (
        f"The first step's graph began with set-up work instead, made before the loop at {set_up_where} "
        f"({LOCATION.sub('', replaced['before']).strip()}) and still pending when the step began"
        if replaced and set_up_where else "The first step's graph had nothing before it"
    )
    set_up_fix = (
        f" Run the set-up at {set_up_where} before the loop too (`torch.tpu.synchronize()` or `tputrace.step()` after "
        "it), or both graphs still differ." if set_up_where else ""
    )
    return Finding(
        analyzer=NAME,
        # Paid once: its share of a short traced run says little of a long one's, so it is never critical.
        severity="info" if context.severity(share) == "info" else "warning",
        title=(
            f"Work at {file_name}:{line} after the step's last flush ran in the next step's graph: "
            f"{plural(len(recompiles), 'program')} compiled again in step 1"
        ),
        explanation=(
            f"The loop's work at {file_name}:{line} ({ops}) comes after the step's last flush (`optimizer.step()`) and "
            "nothing reads it in that step, so DeferAndFuse keeps it pending and runs it at the start of the next "
            f"step's graph (flushed at {', '.join(graphs)}). {first_graph}, so the "
            f"second step's graph is another program ({programs}), compiled again: {format_ns(total_ns)} of compiling "
            f"({share:.0%} of the run), paid once. Later steps run the second step's program."
        ),
        suggestion=(
            f"Run it in its own step: `tputrace.step()` at the end of each iteration, after {file_name}:{line}, runs the "
            "pending work as a program of its own without waiting for the chip (and marks the step there), so every "
            "step's graphs are the first step's and compile once. Work that does not need the updated weights (a "
            "metric of this step's outputs) can instead move before `optimizer.step()`, into the step's graph."
            + set_up_fix + (SCALER_UPDATE if "aten._amp_update_scale_" in ops else "")
        ),
        cost_total_ns=float(total_ns),
        cost_per_step_ns=None,
        evidence=evidence,
        **context.location_fields(tail_frame),
    )
