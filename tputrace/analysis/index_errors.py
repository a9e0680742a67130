"""Indices out of range: index ops whose indices were outside the tensor, and ops given values their
CPU kernel refuses (multinomial, bernoulli, binary_cross_entropy), as the backend's checks found them.

The backend records each such error as an annotation of origin `index_check` whose name is the
error's message: `index out of range in <op> at <file>:<line> (...)` or `invalid values in <op> at
<file>:<line> (...)`. In the default eager modes the
chip check raises at the next host sync, so the annotation's own line is the syncing line and the
message's line is the op's; `--mode blocking` checks at the op, so the two are the same line. An
error is critical whatever its time: the run stopped there, or (if the script caught the error) went
on with results that were never computed, so its cost is the whole run, as for a run that would not
fit in memory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding
from tputrace.derived.run_endings import raised_line
from tputrace.store.records import SourceLocation
from tputrace.wording import plural

NAME = "index_errors"
ORIGIN = "index_check"
BLOCKING_MODE = "DEFER_NEVER_AND_LAUNCH_BLOCKING"  # `--mode blocking`: indices checked on the host, at the op
# The start of every `index_check` annotation's name: the op, and the op's line unless it was outside the user's code.
_MESSAGE = re.compile(r"(?P<what>index out of range|invalid values) in (?P<op>\S+) at (?:(?P<file>[^\s:]+):(?P<line>\d+) )?")


@dataclass(frozen=True)
class CheckedError:
    """One error the backend's index or value checks found: the op, its line, the line that raised it."""

    op: str
    op_line: str | None
    raised_at: str
    count: int
    stopped_the_run: bool
    message: str
    kind: str  # "index" or "invalid values"


@dataclass(frozen=True)
class IndexErrorsData:
    errors: tuple[CheckedError, ...] = ()


def analyze(context: AnalysisContext) -> AnalysisResult[IndexErrorsData]:
    trace = context.trace
    findings: list[Finding] = []
    rows = trace.sql(
        "SELECT name_sid, frame_id, COUNT(*), MIN(step) FROM annotations WHERE rank = ? AND source = ? "
        "GROUP BY name_sid, frame_id ORDER BY MIN(start_ns)",
        (context.rank, ORIGIN),
    )
    run = context.rank_run
    final_error = _final_error_line(run.error if run is not None else None)
    blocking = run is not None and run.eager_mode == BLOCKING_MODE
    errors: list[CheckedError] = []
    for name_sid, frame_id, count, first_step in rows:
        message = trace.string(name_sid) or ""
        parsed = _MESSAGE.match(message)
        op = parsed["op"] if parsed else "an index op"
        invalid_values = parsed is not None and parsed["what"] == "invalid values"
        raised_at = context.location(frame_id)
        op_at = _op_location(context, parsed, raised_at)
        stopped = final_error is not None and (final_error in message or message in final_error)
        errors.append(CheckedError(op, _short(op_at), context.where(frame_id), count, stopped, message,
                                   "invalid values" if invalid_values else "index"))
        findings.append(
            _finding(context, op, op_at, raised_at, count, first_step, stopped, message, blocking, invalid_values)
        )
    return AnalysisResult(NAME, IndexErrorsData(tuple(errors)), tuple(findings))


def _finding(context: AnalysisContext, op: str, op_at: SourceLocation | None, raised_at: SourceLocation | None,
             count: int, first_step: int, stopped: bool, message: str, blocking: bool, invalid_values: bool) -> Finding:
    where = _lines_text(op_at, raised_at)
    in_step = f", first in step {first_step}" if context.steps else ""
    outcome = (
        "The run stopped with this error." if stopped else
        f"The script went on after the error ({plural(count, 'time')}{in_step}): whatever it computed from this op "
        f"is not a result."
    )
    checked_values = "values" if invalid_values else "indices"
    checked = (
        f"--mode blocking checked the {checked_values} on the host at the op" if blocking else
        f"tputrace checked the {checked_values} on the chip and raised at the next host read"
    )
    if invalid_values:
        explanation = (
            f"{op} was given values its CPU kernel refuses (a probability outside [0, 1], a negative or nan weight, a "
            f"distribution summing to 0). torch on the CPU refuses them, CUDA raises a device-side assert, and XLA would "
            f"go on with a meaningless sample or loss; {checked}. {outcome}"
        )
        fix = f"Fix the values given to {op} (nan or inf from an overflow upstream, logits passed where probabilities are expected)."
    else:
        explanation = (
            f"{op} was given an index outside the tensor it indexes. torch on the CPU refuses it, CUDA raises a device-side "
            f"assert, and XLA would clamp it (or drop the write) and go on with a wrong value; {checked}. {outcome}"
        )
        fix = f"Fix the index given to {op} (a vocabulary or class count smaller than the ids, an off-by-one, a negative id)."
    modes = "" if blocking else (
        f" `tputrace run --mode blocking` checks the {checked_values} at each op and stops there; TPUTRACE_INDEX_CHECKS=0 "
        "turns the checks off, as on a TPU without tputrace."
    )
    location = op_at or raised_at
    evidence: tuple[Evidence, ...] = (Evidence(message, table="annotations"),)
    if op_at is not None and raised_at is not None and (op_at.file, op_at.line) != (raised_at.file, raised_at.line):
        evidence += (
            Evidence(f"the index op {op}", file=op_at.file, line=op_at.line, table="ops"),
            Evidence("raised by this sync, the first host read after the op", file=raised_at.file, line=raised_at.line,
                     table="annotations"),
        )
    return Finding(
        analyzer=NAME,
        severity="critical",
        title=f"{'Invalid values' if invalid_values else 'Index out of range'} in {op} {where}",
        explanation=explanation,
        suggestion=f"{fix}{modes}",
        cost_total_ns=float(context.wall_ns),
        evidence=evidence,
        file=location.file if location else None,
        line=location.line if location else None,
    )


def _op_location(context: AnalysisContext, parsed: re.Match[str] | None, raised_at: SourceLocation | None) -> SourceLocation | None:
    """The op's line as the message names it (`file.py:5`), as a recorded frame at that line in a file of that
    name (the syncing line's file first); from the syncing line's file when no frame was recorded there."""
    if parsed is None or parsed["file"] is None:
        return None
    basename, line = parsed["file"], int(parsed["line"])
    candidates = list(dict.fromkeys(  # a line's frame and its calls' frames are one location
        location for (frame_id,) in context.trace.sql("SELECT id FROM frames WHERE line = ? ORDER BY id", (line,))
        if (location := context.location(frame_id)) is not None and os.path.basename(location.file) == basename
    ))
    same_file = [location for location in candidates if raised_at is not None and location.file == raised_at.file]
    if same_file or len(candidates) == 1:
        return (same_file or candidates)[0]
    if raised_at is not None and os.path.basename(raised_at.file) == basename:
        return SourceLocation(raised_at.file, line, "")
    return None


def _lines_text(op_at: SourceLocation | None, raised_at: SourceLocation | None) -> str:
    """`at train.py:5`, or `at train.py:5, raised at train.py:9 by the sync` when the two lines differ."""
    if op_at is None:
        return f"raised at {_short(raised_at)} by the sync" if raised_at else "at an unknown line"
    if raised_at is None or (op_at.file, op_at.line) == (raised_at.file, raised_at.line):
        return f"at {_short(op_at)}"
    return f"at {_short(op_at)}, raised at {_short(raised_at)} by the sync"


def _short(location: SourceLocation | None) -> str | None:
    return location.short if location is not None else None


def _final_error_line(error: str | None) -> str | None:
    """The exception's own line of the script's formatted traceback (`RuntimeError: ...`, not a note after it), None
    if it raised nothing."""
    return raised_line(error) or None if error else None
