"""A `torch.compile`d function whose compile failed, so that it runs eagerly, op by op (an imported capture).

A `TORCH_TRACE` log's `compilation_metrics` record says when a frame compile failed (`fail_type`, `fail_reason`:
`BackendCompilerFailed`, `backend='inductor' raised: LoweringException: ...`); with Dynamo's errors suppressed
(`torch._dynamo.config.suppress_errors`) or a fallback the script catches the error with, the script goes on and the
function runs as written, which nothing else in the run says. The finding says it runs eagerly where the capture
shows the script went on (the profile's calls of it, or another failed compile of it); else that it does unless the
error stopped the run. One warning per compiled function whose compiles all failed: its name,
its `def` line, the error's first line and the line Dynamo could not trace (`fail_user_frame_*`, with the change that
lets it compile, as `compile_errors` gives it), and, where a torch.profiler capture of the same process records the
function's Python calls (`with_stack=True`), the time it ran eagerly per step, measured. Failures that another
finding tells are left to it: Dynamo's recompile limit (`recompile_limit`), a graph break inside the compile
(`graph_breaks` says the function runs eagerly), and a recording's caught error (`compile_errors`)."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass

from tputrace.analysis.compile_errors import CompileError, SourceLine, compile_error_suggestion
from tputrace.analysis.context import AnalysisContext, detail_object
from tputrace.analysis.findings import MEASURED_ON_HOST, Evidence, Finding
from tputrace.wording import format_ns, plural

RUN_END_SLACK_NS = 1_000_000  # a record this close to the capture's end is its last one


@dataclass(frozen=True)
class FailedCompile:
    """A compiled function whose every compile in the trace failed."""

    function: str
    file: str | None
    line: int | None
    fail_type: str
    reason: str  # the error's first line (`backend='x' raised: RuntimeError: ...`)
    failed_at: tuple[str, int] | None  # the user's line Dynamo could not trace (`fail_user_frame_*`), where it says
    attempts: int
    compile_ns: int
    hints: tuple[str, ...] = ()  # the failure's own advice (`You marked L['x'].size()[0] as dynamic but ...`)
    ended_run: bool = False  # the capture ends with this failed compile: the error stopped the run
    compiled_before: bool = False  # an earlier compile of the function succeeded: this one was a recompile


def failed_compiles(context: AnalysisContext) -> list[FailedCompile]:
    """The rank's Dynamo frame compiles that failed, one per function, where no compile of the function succeeded."""
    if not context.trace.has_table("compiles"):
        return []
    rows = context.trace.sql(
        "SELECT c.name_sid, f.file_sid, f.line, c.start_ns, c.dur_ns, c.detail FROM compiles c "
        "LEFT JOIN frames f ON f.id = c.frame_id WHERE c.rank = ? AND c.kind = 'dynamo_frame' ORDER BY c.start_ns",
        (context.rank,),
    )
    breaks = _graph_break_times(context)
    # The capture's last record: a failed compile ending there is the error that stopped the run (raised, not caught).
    run_end_ns = context.trace.run.end_ns if context.trace.run is not None else None
    by_function: dict[tuple[str, str | None, int | None], list[tuple[int, int, dict[str, object]]]] = defaultdict(list)
    for name_sid, file_sid, line, start_ns, dur_ns, detail_text in rows:
        key = (context.trace.string(name_sid) or "?", context.trace.string(file_sid), line)
        by_function[key].append((int(start_ns or 0), int(dur_ns or 0), detail_object(detail_text)))
    found: list[FailedCompile] = []
    last_end_ns = max((start + dur for compiles in by_function.values() for start, dur, _ in compiles), default=0)
    for (function, file, line), compiles in by_function.items():
        last_start, last_dur, last = compiles[-1]
        failed = [item for item in compiles if item[2].get("fail_type")]
        # Only a failed recompile: a first compile that failed leaves its function eager, and a log alone records
        # none of the eager calls that may follow it, so a capture ending there does not tell that the run stopped.
        ended_run = bool(last.get("fail_type")) and "limit" not in last and last_start + last_dur >= last_end_ns \
            and run_end_ns is not None and last_start + last_dur >= run_end_ns - RUN_END_SLACK_NS \
            and len(failed) < len(compiles)
        if not ended_run:
            if len(failed) < len(compiles):
                continue  # compiled at least once: what runs eagerly is only what a failed recompile was for
            if any("failure" in detail or "limit" in detail for _, _, detail in compiles):
                continue
            if any(start <= t_ns <= start + dur for start, dur, _ in compiles for t_ns in breaks):
                continue
        hints = last.get("fail_hints")
        found.append(FailedCompile(
            function, file, line, str(last.get("fail_type")), str(last.get("fail_reason") or last.get("fail_type")),
            _place(last.get("fail_at")), len(failed), sum(dur for _, dur, _ in failed),
            tuple(str(hint) for hint in hints) if isinstance(hints, list) else (), ended_run, len(failed) < len(compiles)))
    return found


def failed_compile_findings(context: AnalysisContext, analyzer: str) -> list[Finding]:
    """A warning per function whose compiles all failed, costed by its measured eager time where the capture has it;
    one per function whose compiles a torch.profiler capture shows leaving no code that ran."""
    return [_finding(context, analyzer, failed) for failed in failed_compiles(context)] + \
        [_unran_finding(context, analyzer, failed, backend) for failed, backend in unran_compiles(context)]


def unran_compiles(context: AnalysisContext) -> list[tuple[FailedCompile, bool]]:
    """The frame compiles a torch.profiler capture shows ending without compiled code that ran (no
    `Torch-Compiled Region` of their compile id after them, no guards built), one per function where no compile of it
    left code, and whether Dynamo handed the backend a graph. The capture records no error: TORCH_TRACE does."""
    if not context.trace.has_table("compiles"):
        return []
    rows = context.trace.sql(
        "SELECT fn.text, fs.text, f.line, c.dur_ns, c.detail FROM compiles c LEFT JOIN frames f ON f.id = c.frame_id "
        "LEFT JOIN strings fn ON fn.id = f.function_sid LEFT JOIN strings fs ON fs.id = f.file_sid "
        "WHERE c.rank = ? AND c.kind = 'dynamo_frame' ORDER BY c.start_ns", (context.rank,))
    details = [(function, file, line, dur_ns, detail_object(detail_text))
               for function, file, line, dur_ns, detail_text in rows]
    # A frame whose other compile left code that ran runs eagerly only for what a failed recompile was for.
    ran = {str(detail.get("compile_id")).partition("/")[0] for *_, detail in details if detail.get("region_ran")}
    by_function: dict[tuple[str, str | None, int | None], list[tuple[int, dict[str, object]]]] = defaultdict(list)
    for function, file, line, dur_ns, detail in details:
        if "region_ran" in detail and str(detail.get("compile_id")).partition("/")[0] not in ran:
            by_function[(str(function or detail.get("compile_id") or "?"), file, line)].append((int(dur_ns or 0), detail))
    return [(FailedCompile(function, file, line, "", "", None, len(compiles), sum(dur for dur, _ in compiles)),
             any(detail.get("backend_called") for _, detail in compiles))
            for (function, file, line), compiles in by_function.items()
            if all(detail.get("region_ran") is False and not detail.get("guards_built") for _, detail in compiles)]


def _unran_finding(context: AnalysisContext, analyzer: str, failed: FailedCompile, backend_called: bool) -> Finding:
    where = f"{os.path.basename(failed.file)}:{failed.line}" if failed.file and failed.line else failed.function
    how = ("its backend failed on the graph Dynamo handed it (Dynamo built no guards)" if backend_called else
           "Dynamo handed its backend no graph (the compile failed while tracing, or Dynamo skips the frame)")
    title = f"torch.compile of {failed.function} ({where}) left no compiled code that ran: {how}; it runs eagerly"
    calls, steady_calls, total_ns, steady_ns = _eager_calls(context, failed)
    explanation = (
        f"The capture has Dynamo's {plural(failed.attempts, 'compile')} of {failed.function} "
        f"({format_ns(failed.compile_ns)}) and, after it, no `Torch-Compiled Region` range of that compile: the "
        f"compile left no code, and the function then ran as written, op by op ("
        + ("the compile failed and the script went on: Dynamo's errors suppressed, or a fallback" if backend_called
           else "where the frame holds tensor work, its compile failed while tracing and the script went on") +
        "). A torch.profiler capture does not record a compile's error; the process's TORCH_TRACE log "
        "(`TORCH_TRACE=DIR`), imported with this capture, names it and the line")
    cost_total, cost_per_step = 0.0, None
    evidence = [Evidence(f"{plural(failed.attempts, 'compile')} without a compiled region after it",
                         file=failed.file, line=failed.line, table="compiles")]
    if calls:
        cost = context.loop_cost(steady_ns, total_ns) if steady_calls else {
            "cost_total_ns": float(total_ns), "cost_per_step_ns": context.per_step(total_ns)}
        cost_total, cost_per_step = cost["cost_total_ns"], cost["cost_per_step_ns"]
        explanation += f". The profile has {plural(calls, 'eager call')} of it, {format_ns(total_ns)} in all"
        evidence.append(Evidence(f"{plural(calls, 'call')} run eagerly, {format_ns(total_ns)}", table="annotations"))
    return Finding(
        analyzer=analyzer,
        severity="warning" if backend_called else "info",
        title=title,
        explanation=explanation + ".",
        suggestion=("Capture the process's TORCH_TRACE log beside the profile (or run with "
                    "`torch._dynamo.config.suppress_errors = False`) to see why the compile failed, and fix that; "
                    f"until it compiles, {failed.function} gains nothing from `torch.compile`."),
        cost_total_ns=cost_total,
        cost_per_step_ns=cost_per_step,
        evidence=tuple(evidence),
        file=failed.file,
        line=failed.line,
        cost_basis=MEASURED_ON_HOST if calls else "estimate",
    )


def _finding(context: AnalysisContext, analyzer: str, failed: FailedCompile) -> Finding:
    where = f"{os.path.basename(failed.file)}:{failed.line}" if failed.file and failed.line else failed.function
    at = f" at {os.path.basename(failed.failed_at[0])}:{failed.failed_at[1]}" if failed.failed_at else ""
    calls, steady_calls, total_ns, steady_ns = _eager_calls(context, failed)
    reason = _reason_text(failed.reason)
    title = f"torch.compile of {failed.function} ({where}) failed{at}: {reason}"
    explanation = (
        f"Dynamo's {plural(failed.attempts, 'compile')} of {failed.function} (defined at {where}) failed with "
        f"{failed.fail_type}{at} ({reason}), after {format_ns(failed.compile_ns)} of compiling. ")
    if failed.ended_run:
        title += "; the error stopped the run"
        explanation += ("Nothing in the capture follows it: the error was raised at the call and ended the run"
                        + (" (the function had compiled before: this was a recompile, for a call its compiled code's guards "
                           "rejected)" if failed.compiled_before else ""))
        if failed.hints:
            explanation += f". Dynamo says: {failed.hints[0].rstrip('.')}"
    elif calls or failed.attempts > 1:
        title += "; it runs eagerly"
        explanation += ("The script went on (Dynamo's errors suppressed, or a fallback to the uncompiled function), "
                        "so the function runs as written, op by op, on every call: none of the compile's fusion or "
                        "graph capture applies, and nothing but this log says so")
    else:
        explanation += ("Where Dynamo's errors are suppressed (`torch._dynamo.config.suppress_errors`) or the script "
                        "falls back to the uncompiled function, it goes on and the function runs as written, op by op, "
                        "on every call; else the error stopped the run there")
    evidence = [Evidence(f"{failed.fail_type}: {failed.reason}", file=failed.file, line=failed.line)]
    if failed.failed_at:
        evidence.append(Evidence("the line Dynamo could not trace", file=failed.failed_at[0], line=failed.failed_at[1]))
    cost_total, cost_per_step = 0.0, None
    if calls:
        cost = context.loop_cost(steady_ns, total_ns) if steady_calls else {
            "cost_total_ns": float(total_ns), "cost_per_step_ns": context.per_step(total_ns)}
        cost_total, cost_per_step = cost["cost_total_ns"], cost["cost_per_step_ns"]
        per_step = f", {format_ns(cost_per_step)} per step" if cost_per_step is not None else ""
        explanation += (f". The profile has {plural(calls, 'eager call')} of it, {format_ns(total_ns)} in all"
                        f"{per_step} (the time at stake: what it would take compiled is not measured)")
        evidence.append(Evidence(f"{plural(calls, 'call')} run eagerly, {format_ns(total_ns)}", table="annotations"))
    elif not failed.ended_run:
        explanation += (". The capture does not time the function's calls: a torch.profiler capture of the same "
                        "process with `with_stack=True` imported with this log gives its eager time per step")
    explanation += "."
    return Finding(
        analyzer=analyzer,
        severity="critical" if failed.ended_run else "warning",
        title=title,
        explanation=explanation,
        suggestion=_suggestion(failed),
        cost_total_ns=cost_total,
        cost_per_step_ns=cost_per_step,
        evidence=tuple(evidence),
        # where the run stopped: the line Dynamo was tracing, where the log names it
        file=failed.failed_at[0] if failed.ended_run and failed.failed_at else failed.file,
        line=failed.failed_at[1] if failed.ended_run and failed.failed_at else failed.line,
        cost_basis=MEASURED_ON_HOST if calls else "estimate",
    )


def _suggestion(failed: FailedCompile) -> str:
    if failed.fail_type == "BackendCompilerFailed":
        change = ("Fix what the backend could not compile (the error names it; run with "
                  "`torch._dynamo.config.suppress_errors = False` to see its whole traceback), or compile with another "
                  "backend (`backend=\"aot_eager\"` tells whether the graph or the backend fails).")
    else:
        place = failed.failed_at or ((failed.file, failed.line) if failed.file and failed.line else None)
        parsed = CompileError(f"torch._dynamo.exc.{failed.fail_type}", failed.reason, None, failed.hints,
                              SourceLine(place[0], place[1], "") if place else None, None)
        where = f"{os.path.basename(place[0])}:{place[1]}" if place else failed.function
        change = compile_error_suggestion(parsed, where)
    # A run the error ended loses the rest of the run, not the compile's speed-up.
    until = (" Until that is fixed, the run stops at this call" + (
        f" (the calls before it ran {failed.function}'s compiled code)" if failed.compiled_before else "") + "."
        if failed.ended_run else f" Until it compiles, {failed.function} gains nothing from `torch.compile`.")
    verbose = "" if "TORCHDYNAMO_VERBOSE" in change else " `TORCHDYNAMO_VERBOSE=1` prints the failure at the call."
    return change + until + verbose


def _reason_text(reason: str) -> str:
    """The error's first line without Dynamo's closing pointer to more logs (`For more information, run with
    TORCH_LOGS="+dynamic".`) and without its closing punctuation, to be quoted inside a sentence."""
    return _MORE_INFORMATION.sub("", reason).rstrip(" .!:;") or reason


_MORE_INFORMATION = re.compile(r"[.!]?\s*For more information\b.*$", re.IGNORECASE)


def _eager_calls(context: AnalysisContext, failed: FailedCompile) -> tuple[int, int, int, int]:
    """The function's calls in the capture's Python ranges (torch.profiler's `with_stack`): calls, steady calls,
    their time, their steady time. A compile's own frames are its calls: it runs eagerly after its compile fails."""
    if not failed.file or not failed.line or not context.trace.has_table("annotations"):
        return 0, 0, 0, 0
    steady_sql, steady_params = context.steady_where("a")
    name = os.path.basename(failed.file)
    rows = context.trace.sql(
        f"SELECT a.dur_ns, ({steady_sql}) FROM annotations a JOIN frames f ON f.id = a.frame_id "
        "JOIN strings s ON s.id = f.file_sid JOIN strings fn ON fn.id = f.function_sid "
        "WHERE a.rank = ? AND a.source = 'python' AND f.line = ? AND fn.text = ? AND (s.text IN (?, ?) OR s.text LIKE ?)",
        (*steady_params, context.rank, failed.line, failed.function, failed.file, name, f"%{os.sep}{name}"),
    ) if name else []
    calls = [(int(dur or 0), bool(steady)) for dur, steady in rows]
    return (len(calls), sum(1 for _, steady in calls if steady), sum(dur for dur, _ in calls),
            sum(dur for dur, steady in calls if steady))


def _graph_break_times(context: AnalysisContext) -> list[int]:
    if not context.trace.has_table("graph_breaks"):
        return []
    return [int(t_ns) for (t_ns,) in context.trace.sql("SELECT t_ns FROM graph_breaks WHERE rank = ?", (context.rank,))]


def _place(text: object) -> tuple[str, int] | None:
    """`file.py:LINE` as (file, line)."""
    file, _, line = str(text or "").rpartition(":")
    return (file, int(line)) if file and line.isdigit() else None

