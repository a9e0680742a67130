"""torch.compile graph breaks: lines where Dynamo stopped capturing a graph, ran Python instead, and
compiled the rest of the function as another graph.

A break is recorded once per compile of the function (with Dynamo's reason); it then happens on every
call. What it costs is what the trace shows at its line: the host syncs there (a `print` or `.item()`
that broke the graph reads the value on every call), and the frames Dynamo compiled to resume after
it (`torch_dynamo_resume_in_<function>_at_<line>`), each an extra graph to compile and launch. The
syncs at a break's line are this analyzer's, not the syncs analyzer's.

What the function runs as is read from its compiles (the one the break was recorded in, the function's
and its resumed frames'): the number of its code objects that compiled a graph with ops, or, where none
did and Dynamo failed on the frame, that it runs eagerly.

A break in another file than the user's line that reached it (a helper module's, a library's) names both
(`break_sites`); one in torch.optim's code under a compiled optimizer step is told by what happened to the step
(`optimizer_breaks`).

A run that stopped on one of Dynamo's errors (a graph break under `fullgraph=True`) is a finding too
(`compile_errors`), read from the run's exception.
"""

from __future__ import annotations

import linecache
import re
from collections import defaultdict
from dataclasses import dataclass

from tputrace.analysis.compile_errors import compile_error_findings
from tputrace.analysis import break_sites, disabled_calls, optimizer_breaks
from tputrace.analysis.context import MIN_LISTED_COST_NS, AnalysisContext, Cost, detail_object
from tputrace.analysis.failed_compiles import failed_compile_findings
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding, Severity
from tputrace.analysis.syncs import HOST_OUTPUTS_OF_NUMBERS, STALL, SUGGESTIONS, host_outputs_advice
from tputrace.frame_files import is_library_file
from tputrace.store.aggregates import merged_ns
from tputrace.store.records import SourceLocation
from tputrace.wording import format_ns, plural

NAME = "graph_breaks"
RESUME_PREFIX = "torch_dynamo_resume_in_"
SUGGESTION = (
    "Keep the compiled function free of Python that needs a value: return the tensor and print, log or "
    "branch on it outside the compiled function (every N steps), or use a traceable op; "
    "`torch._dynamo.explain(fn)(*args)` lists every break."
)
# What a host read at a break reads, where the loop's advice (accumulate the loss, read every N steps) does not
# apply: the read is inside the function, on every call.
_READ_ADVICE = {
    "item": "`.item()`, `float(t)` and `int(t)` of a tensor in the compiled function read it on the host at every "
            "call: use the 0-d tensor itself in the ops after it (`h / h.abs().max()`, not `h / h.abs().max().item()`).",
}
# Dynamo's own advice in a break's reason (`- hint: Change `torch._dynamo.config.trace_autograd_ops` to `True`.`).
_HINT = re.compile(r"hint: (.+?)(?= - |$)", re.DOTALL)
_RESUMED = re.compile(r"^torch_dynamo_resume_in_(.+)_at_\d+$")
_LIBRARY_FILE = re.compile(r" \([^()/ ]+\.py\)$")


@dataclass(frozen=True)
class LineSyncs:
    """Host syncs at a line in the loop (count, kinds, stall) and in the steady steps."""

    syncs: int
    kinds: tuple[str, ...]
    stall_ns: int
    steady_syncs: int
    steady_stall_ns: int


@dataclass(frozen=True)
class GraphBreak:
    """The graph breaks at one line: Dynamo's reasons, the graphs compiled to resume after them, and the host
    syncs at the line."""

    where: str
    reasons: tuple[str, ...]
    breaks: int
    resumed_graphs: int
    resume_compiles: int
    resume_compile_ns: int
    syncs: int
    kinds: tuple[str, ...]
    stall_ns: int
    steady_syncs: int
    steady_stall_ns: int


@dataclass(frozen=True)
class Outcome:
    """What the function that broke runs as: its name, the graphs of its code objects, and whether Dynamo failed
    on it without any graph (it runs eagerly)."""

    function: str
    graphs: int
    eager: bool
    file: str | None = None


@dataclass(frozen=True)
class GraphBreaksData:
    breaks: tuple[GraphBreak, ...] = ()


def analyze(context: AnalysisContext) -> AnalysisResult[GraphBreaksData]:
    trace, rank = context.trace, context.rank
    rows = trace.sql(
        "SELECT f.file_sid, f.line, MIN(g.frame_id), g.reason_sid, COUNT(*), MAX(g.t_ns) FROM graph_breaks g "
        "JOIN frames f ON f.id = g.frame_id WHERE g.rank = ? GROUP BY f.file_sid, f.line, g.reason_sid",
        (rank,),
    )
    breaks_by_line: dict[tuple[int, int], list[tuple[int, str, int]]] = defaultdict(list)
    last_t: dict[tuple[int, int], int] = {}
    for file_sid, line, frame_id, reason_sid, count, t_ns in rows:
        breaks_by_line[(file_sid, line)].append((frame_id, trace.string(reason_sid) or "graph break", count))
        last_t[(file_sid, line)] = max(last_t.get((file_sid, line), t_ns), t_ns)
    found = [_finding(context, file_sid, line, breaks, _outcome(context, last_t[(file_sid, line)], breaks[0][0]),
                      last_t[(file_sid, line)])
             for (file_sid, line), breaks in breaks_by_line.items()]
    findings = [finding for finding, _ in found] + compile_error_findings(context, NAME) + \
        failed_compile_findings(context, NAME)
    return AnalysisResult(NAME, GraphBreaksData(tuple(data for _, data in found)), tuple(findings))


def _finding(context: AnalysisContext, file_sid: int, line: int, breaks: list[tuple[int, str, int]],
             outcome: Outcome | None, t_ns: int) -> tuple[Finding, GraphBreak]:
    frame_id = breaks[0][0]
    location = context.location(frame_id)
    where = context.where(frame_id) if location is None else break_sites.break_where(location)
    count = sum(times for _, _, times in breaks)
    reasons = [disabled_calls.without_addresses(reason) for _, reason, _ in breaks]
    caller = None if location is None else break_sites.calling_line(context, location, t_ns)
    disabled = None if location is None else disabled_calls.disabled_call(
        reasons[0], context.trace.source_copy(location.file), location.file)
    syncs = _syncs(context, file_sid, line)
    graphs, compiles, compile_ns = _resumed_frames(context, file_sid, line)
    data = GraphBreak(where, tuple(reasons), count, graphs, compiles, compile_ns, syncs.syncs, syncs.kinds,
                      syncs.stall_ns, syncs.steady_syncs, syncs.steady_stall_ns)
    cost: Cost = context.loop_cost(syncs.steady_stall_ns, syncs.stall_ns)
    if cost["cost_total_ns"] < MIN_LISTED_COST_NS:
        cost = {"cost_total_ns": 0.0, "cost_per_step_ns": None}  # the resumed graphs' compiles only: a one-time cost
    cost["cost_total_ns"] += compile_ns  # the extra graphs' compiles, once
    share = context.share_of_steps_less_compiles(syncs.steady_stall_ns)
    severity: Severity = "warning" if syncs.steady_syncs else "info"
    if context.severity(share) == "critical":
        severity = "critical"
    what = _what_broke(reasons[0]) if disabled is None else disabled_calls.title_part(disabled)
    shown_at, reached = _shown_at(where, location, caller, reasons[0])
    title = f"Graph break at {shown_at}{reached} ({what}): {_runs_as(outcome, graphs, caller)}"
    called = _called_graphs(context, where, outcome) if outcome is not None and not outcome.graphs else []
    sync_part = (f", {format_ns(syncs.steady_stall_ns / max(context.steady_count, 1))} of host sync per step"
                 if syncs.steady_syncs and context.steps else "")
    title += sync_part
    explanation = (
        f"torch.compile broke the graph at {shown_at}{reached} {plural(count, 'time')} (once per compile of the function): "
        + (f"Dynamo cannot trace a Python branch on a tensor's value, which only the chip knows (`{reasons[0]}`). "
           if reasons[0].startswith("generic_jump") else f"{reasons[0].rstrip('.')}. ")
    )
    if called:  # a call Dynamo would not inline (a skipped function): the callee compiled as a frame of its own
        title += f" ({called[0]}(), called there, compiles as a graph of its own)"
        explanation += (f"Dynamo then compiled {', '.join(called)}, which the line calls, as a frame of its own, so "
                        "that work runs as a compiled graph. ")
    if outcome is not None and outcome.eager:
        explanation += (
            f"Dynamo could not go on after it and gave up on {outcome.function}(): every call of it runs eagerly, op by "
            "op, with no graph."
        )
    else:
        explanation += "The line runs in Python on every call; " + (
            f"Dynamo compiled the code after it {plural(compiles, 'time')} ({plural(graphs, 'graph')} with ops; "
            f"{format_ns(compile_ns)} of compiling, counted in the cost: an estimate, as one graph would compile some "
            "of it too)." if compiles else "Dynamo compiled no graph after it.")
    waited = "" if not syncs.syncs else (
        f" At that line the host waited for the chip {plural(syncs.syncs, 'time')} "
        f"({', '.join(syncs.kinds)}), {format_ns(syncs.stall_ns)} in all ({context.share_text(share)}).")
    explanation += waited
    suggestion = SUGGESTION
    # A graph's CPU outputs at a break are an optimizer's step counts where one was compiled; else what the part
    # after the break reads, which the break's own advice covers.
    read_advice = {**_READ_ADVICE, "host_outputs": "" if host_outputs_advice(context) == HOST_OUTPUTS_OF_NUMBERS
                   else SUGGESTIONS["host_outputs"]}
    kind_advice = [advice for kind in syncs.kinds if (advice := read_advice.get(kind, SUGGESTIONS.get(kind)))]
    if _is_branch(context, frame_id) and {"item", "bool"} & set(syncs.kinds):
        suggestion = (
            f"The value picks a branch at {where}: compute both sides on the chip and choose with "
            "`torch.where(condition, a, b)` inside the compiled function, or, where the sides are costly work of "
            "their own (another layer each), `torch.cond(condition, true_fn, false_fn, (x,))`, which runs as one XLA "
            "conditional, so it stays one graph and nothing is read on the host. " + SUGGESTION
        )
    elif kind_advice:
        suggestion += " " + kind_advice[0]
    hints = _HINT.findall(reasons[0])
    if location is not None and is_library_file(location.file):
        suggestion = _library_break_advice(where, caller)
    elif disabled is not None and location is not None:
        suggestion = disabled_calls.advice(disabled, where, outcome.function if outcome else location.function)
    elif hints and not syncs.syncs:
        suggestion = (f"Dynamo says how: {'; '.join(hint.strip().rstrip('.') for hint in hints[:2])}. Otherwise move the call "
                      f"at {where} out of the compiled function; `torch._dynamo.explain(fn)(*args)` lists every break.")
    step = optimizer_breaks.step_break_at(context, location, where, what, reasons[0], caller,
                                          outcome is not None and outcome.eager)
    if step is not None:
        title = step.title + sync_part
        explanation, suggestion = (step.explanation + waited.lstrip()).rstrip(), step.suggestion
    evidence = [context.evidence_at(f"{plural(times, 'break')}: {disabled_calls.without_addresses(reason)}",
                                    break_frame, table="graph_breaks") for break_frame, reason, times in breaks]
    if caller is not None:
        evidence.append(Evidence(f"reached from {caller.text}", file=caller.file,
                                 line=caller.line, table="compiles"))
    evidence.append(context.evidence_at(
        f"{plural(graphs, 'resumed graph')} after the break, {plural(compiles, 'compile')}, {format_ns(compile_ns)}",
        frame_id, table="compiles"))
    if syncs.syncs:
        evidence.append(context.evidence_at(
            f"{plural(syncs.syncs, 'host sync')} at the break, {format_ns(syncs.stall_ns)} stalled", frame_id,
            table="syncs"))
    finding = Finding(
        analyzer=NAME,
        severity=severity,
        title=title,
        explanation=explanation,
        suggestion=suggestion,
        **cost,
        evidence=tuple(evidence),
        **context.location_fields(frame_id),
    )
    return finding, data


def _shown_at(where: str, location: SourceLocation | None, caller: break_sites.CallingLine | None,
              reason: str) -> tuple[str, str]:
    """Where the title says the break is, and the user's line that reached it where that is another file's: a
    recorded break's calling line, or the user's line an import keeps a library's break at (its reason names the
    library's place, `(in distributed.py:1757, _pre_forward)`)."""
    if location is None:
        return where, ""
    if caller is not None:
        return where, f" in {break_sites.user_function(location.function)}(), reached from {caller.text}"
    in_library = break_sites.IN_LIBRARY.search(reason)
    if in_library is None:
        return where, ""
    user_line = break_sites.CallingLine(location.file, location.line, location.function, True)
    return (f"{in_library['file']}:{in_library['line']}",
            f" in {break_sites.user_function(in_library['function'])}(), reached from {user_line.text}")


def _library_break_advice(where: str, caller: break_sites.CallingLine | None) -> str:
    """The advice for a break inside a library's code: Dynamo's hint ("Remove the call") is for the library's
    authors, not the script's."""
    call = (f"the call at {caller.text}" if caller is not None else
            "the script's call that reaches it (`torch._dynamo.explain(fn)(*args)` names it)")
    return (f"The break at {where} is in a library's code, not the script's: Dynamo's hint is for that library's "
            "authors. The code before and after it compiles as graphs of their own; where that library's work need "
            f"not be compiled, move {call} out of the compiled function.")


def _called_graphs(context: AnalysisContext, where: str, outcome: Outcome) -> list[str]:
    """The functions called at the break's line that Dynamo compiled as frames of their own, with ops in their graph
    (a skipped `optimizer.step` of a compiled function: its `Adam.step` frame), the first first."""
    called = []
    for name, ops, detail in context.trace.sql(
        "SELECT s.text, p.n_ops, c.detail FROM compiles c LEFT JOIN strings s ON s.id = c.name_sid "
        "LEFT JOIN programs p ON p.id = c.program_id WHERE c.rank = ? AND c.kind = 'dynamo_frame' ORDER BY c.start_ns",
        (context.rank,),
    ):
        parsed = detail_object(detail)
        code = _code_name(name, parsed)
        if (parsed.get("call_site") == where and _function_of(code) != outcome.function
                and (_graph_ops(ops, parsed) or 0) > 0 and name not in called):
            called.append(name or code)
    return called


def _runs_as(outcome: Outcome | None, resumed_graphs: int, caller: break_sites.CallingLine | None) -> str:
    """What the function that broke runs as, for the title; a function outside the file of the line that reached the
    break is named with its file (`print() (rich/__init__.py)`)."""
    if outcome is None:
        return f"the compiled function runs as {plural(resumed_graphs + 1, 'graph')}"
    function = f"{outcome.function}()"
    if outcome.file and caller is not None and outcome.file != caller.file:
        function += f" ({break_sites.file_name(outcome.file)})"
    if outcome.eager:
        return f"Dynamo skipped {function}, which runs eagerly (no graph)"
    if outcome.graphs == 0:
        return f"{function} runs in Python (no graph with ops)"
    return f"{function} runs as {plural(outcome.graphs, 'graph')}"


def _code_name(name: str | None, detail: dict[str, object]) -> str:
    """The code object a Dynamo frame compile compiled (`torch_dynamo_resume_in_f_at_5`, `f`)."""
    code = detail.get("dynamo_frame")
    # An import names a library's function with its file (`helper (contextlib.py)`), whose dot is no qualifier's.
    return code if isinstance(code, str) else _LIBRARY_FILE.sub("", name or "?").rpartition(".")[2]


def _function_of(code: str) -> str:
    """The user's function a code object is part of: a resumed frame's function, or the code itself."""
    while (match := _RESUMED.match(code)) is not None:
        code = match.group(1)
    return code


def _graph_ops(program_ops: int | None, detail: dict[str, object]) -> int | None:
    """The ops in the graph a Dynamo frame compile produced, where the trace says."""
    ops = detail.get("n_ops", program_ops)
    return ops if isinstance(ops, int) else program_ops


def _outcome(context: AnalysisContext, t_ns: int, frame_id: int) -> Outcome | None:
    """What the function that broke runs as: the graphs of its code objects (the function's own and its resumed
    frames') that have ops; eager where none has and the break's compile failed. The function is the one the break's
    line is in where Dynamo compiled it (a break inside a library's code called from it is counted at the user's
    line), else the one whose compile recorded the break at `t_ns`. None where no Dynamo frame compile spans it."""
    rows = [(start, end, file_sid, name, ops, detail_object(detail)) for start, end, file_sid, name, ops, detail in context.trace.sql(
        "SELECT c.start_ns, c.start_ns + COALESCE(c.dur_ns, 0), f.file_sid, s.text, p.n_ops, c.detail FROM compiles c "
        "LEFT JOIN frames f ON f.id = c.frame_id LEFT JOIN strings s ON s.id = c.name_sid "
        "LEFT JOIN programs p ON p.id = c.program_id WHERE c.rank = ? AND c.kind = 'dynamo_frame' ORDER BY c.start_ns",
        (context.rank,),
    )]
    spanning = [row for row in rows if row[0] <= t_ns <= row[1]]
    if not spanning:
        return None
    _, _, file_sid, name, _, detail = spanning[-1]
    function = _function_of(_code_name(name, detail))
    location = context.location(frame_id)
    if location is not None and location.function != function:
        location_file = _file_sid(context, location.file)
        if any(other_file == location_file and _function_of(_code_name(other, other_detail)) == location.function
               for _, _, other_file, other, _, other_detail in rows):
            function, file_sid = location.function, location_file
    with_graph = {_code_name(other, other_detail) for _, _, other_file, other, other_ops, other_detail in rows
                  if other_file == file_sid and _function_of(_code_name(other, other_detail)) == function
                  and (_graph_ops(other_ops, other_detail) or 0) > 0}
    failed = bool(detail.get("fail_type") or detail.get("failed"))
    return Outcome(function, len(with_graph), eager=failed and not with_graph,
                   file=None if file_sid is None else context.trace.string(file_sid))


def _file_sid(context: AnalysisContext, file: str) -> int | None:
    """The string id of a file name, where the trace has it."""
    rows = context.trace.sql("SELECT id FROM strings WHERE text = ? LIMIT 1", (file,))
    return int(rows[0][0]) if rows else None



def _what_broke(reason: str) -> str:
    """A short name for what broke the graph: a branch on a tensor (Dynamo's `generic_jump TensorVariable()`), or the
    builtin or function Dynamo names in backquotes, if any."""
    if reason.startswith("generic_jump"):
        return "a Python branch on a tensor's value"
    parts = reason.split("`")
    # Without the library frame an import adds where the break is inside one (`… (in distributed.py:1757, f)`).
    return parts[1] if len(parts) >= 3 and parts[1] else break_sites.IN_LIBRARY.sub("", reason.split(" - ")[0])[:60]


def _syncs(context: AnalysisContext, file_sid: int, line: int) -> LineSyncs:
    """Host syncs at the break's line in the loop: count, kinds, stall; and in the steady steps."""
    trace = context.trace
    on_line = "s.frame_id IN (SELECT id FROM frames WHERE file_sid = ? AND line = ?)"
    where, params = context.loop_line_where("s")
    steady_where, steady_params = context.steady_where("s")
    rows = trace.sql(
        f"SELECT s.kind, COUNT(*), COALESCE(SUM({STALL}), 0) FROM syncs s WHERE {where} AND {on_line} GROUP BY s.kind",
        (*params, file_sid, line),
    )
    (steady_syncs, steady_stall), = trace.sql(
        f"SELECT COUNT(*), COALESCE(SUM({STALL}), 0) FROM syncs s WHERE {steady_where} AND {on_line}",
        (*steady_params, file_sid, line),
    )
    return LineSyncs(
        syncs=int(sum(row[1] for row in rows)), kinds=tuple(sorted(row[0] for row in rows)),
        stall_ns=int(max(0, sum(row[2] for row in rows))), steady_syncs=int(steady_syncs),
        steady_stall_ns=int(max(0, steady_stall)),
    )


def _resumed_frames(context: AnalysisContext, file_sid: int, line: int) -> tuple[int, int, int]:
    """(graphs, compiles, wall ns) of the Dynamo frames compiled to resume after the break at the line;
    their nested AOTAutograd and XLA compiles count each instant once. A frame whose graph has no ops (the
    rest of the function is Python) is a compile but no graph."""
    trace = context.trace
    frames = trace.sql(
        "SELECT c.start_ns, c.start_ns + COALESCE(c.dur_ns, 0), c.detail, p.n_ops, fn.text FROM compiles c "
        "JOIN frames f ON f.id = c.frame_id JOIN strings fn ON fn.id = f.function_sid "
        "LEFT JOIN programs p ON p.id = c.program_id WHERE c.rank = ? AND c.kind = 'dynamo_frame' AND f.file_sid = ? "
        "AND f.line = ? AND fn.text LIKE ?",
        (context.rank, file_sid, line, RESUME_PREFIX + "%"),
    )
    graph_ids: set[int] = set()
    known_ops = False
    with_ops: set[str] = set()
    for _, _, detail, program_ops, function in frames:
        parsed = detail_object(detail)
        ids = parsed.get("graph_ids")
        if isinstance(ids, list):
            graph_ids.update(ids)
        ops = _graph_ops(program_ops, parsed)
        known_ops = known_ops or ops is not None
        if ops:
            with_ops.add(function)
    if graph_ids:
        graphs = len(graph_ids)
    elif known_ops:
        graphs = len(with_ops)
    else:
        graphs = 1 if frames else 0
    return graphs, len(frames), merged_ns((start, end) for start, end, *_ in frames)


def _is_branch(context: AnalysisContext, frame_id: int | None) -> bool:
    """Whether the run's copy of the line (`Trace.source_copy`) is an `if`, `elif` or `while` (False without one)."""
    location = context.location(frame_id)
    copy = None if location is None else context.trace.source_copy(location.file)
    if location is None or copy is None:
        return False
    return linecache.getline(copy, location.line).lstrip().startswith(("if ", "elif ", "while "))
