"""Dynamo's errors (`torch._dynamo.exc.*`), most often a graph break in a function compiled with `fullgraph=True`,
which Dynamo raises instead of breaking the graph.

A run that such an error stopped: the trace keeps the run's formatted exception; Dynamo's text names what it could
not trace (its reason, explanation and hints) and the user's line (`from user code:`), and the traceback names the
line that called the compiled function. One critical finding, at the line Dynamo names, costing the run (it stopped
there), with the change that lets the function compile. A script that catches the error (a `try`/`except` falling
back to the uncompiled function) goes on: the frame compile that raised keeps the error (`detail.failure`), and one
warning at the line Dynamo names says the function never compiled, with the same change. Part of the `graph_breaks`
analyzer's findings."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext, detail_object
from tputrace.analysis.findings import Evidence, Finding
from tputrace.frame_files import is_library_file, is_own_file

DYNAMO_ERRORS = ("torch._dynamo.exc.", "torch._inductor.exc.")
# Dynamo's text for an error it handled itself, skipping the frame (it runs uncompiled), which no script sees.
_FRAME_SKIPPED = "Skipping the frame and falling back to eager"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')


@dataclass(frozen=True)
class SourceLine:
    file: str
    line: int
    function: str
    code: str | None = None

    @property
    def short(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"


@dataclass(frozen=True)
class CompileError:
    """What the trace's exception text says of a Dynamo error."""

    kind: str  # the exception's class, `torch._dynamo.exc.Unsupported`
    reason: str  # the message's first line, `Data-dependent branching`
    explanation: str | None
    hints: tuple[str, ...]
    user_line: SourceLine | None  # the line Dynamo could not trace
    call_line: SourceLine | None  # the script's line that called the compiled function
    skipped_frame: bool = False  # Dynamo handled it itself, running the frame uncompiled (a graph break in a loop)

    @property
    def graph_break(self) -> bool:
        """A graph break raised as an error (fullgraph=True), rather than a failure of the traced code."""
        return self.kind.endswith(".Unsupported")


def parse_compile_error(error: str | None) -> CompileError | None:
    """The Dynamo error of a run's formatted exception; None for any other exception (or none)."""
    lines = (error or "").splitlines()
    starts = [index for index, text in enumerate(lines) if text.startswith("Traceback (most recent call last)")]
    if not starts:
        return None
    frames: list[SourceLine] = []
    index = starts[-1] + 1
    while index < len(lines) and (not lines[index].strip() or lines[index][0].isspace()):
        match = _FRAME.match(lines[index])
        if match:
            frames.append(SourceLine(match["file"], int(match["line"]), match["function"].strip()))
        index += 1
    if index >= len(lines) or not lines[index].startswith(DYNAMO_ERRORS):
        return None
    kind, _, reason = lines[index].partition(": ")
    rest = lines[index + 1:]
    explanation = next((text.strip().removeprefix("Explanation:").strip() for text in rest
                        if text.strip().startswith("Explanation:")), None)
    hints = tuple(text.strip().removeprefix("Hint:").strip() for text in rest if text.strip().startswith("Hint:"))
    return CompileError(kind, reason.strip(), explanation, hints, _user_line(rest), _innermost_own(frames))


def _user_line(rest: list[str]) -> SourceLine | None:
    """The line Dynamo names after `from user code:`: the innermost outside libraries (else the innermost)."""
    if "from user code:" not in (text.strip() for text in rest):
        return None
    start = [text.strip() for text in rest].index("from user code:")
    frames: list[SourceLine] = []
    for offset, text in enumerate(rest[start + 1:], start + 1):
        match = _FRAME.match(text)
        if match:
            code = rest[offset + 1].strip() if offset + 1 < len(rest) else None
            frames.append(SourceLine(match["file"], int(match["line"]), match["function"].strip(), code or None))
        elif text.strip() and not text[0].isspace():
            break
    return _innermost_own(frames)


def _innermost_own(frames: list[SourceLine]) -> SourceLine | None:
    own = [frame for frame in frames if not frame.file.startswith("<") and not is_library_file(frame.file)]
    chosen = own or frames
    return chosen[-1] if chosen else None


def compile_error_findings(context: AnalysisContext, analyzer: str) -> list[Finding]:
    """The critical finding of a run that raised a Dynamo error, and a warning per Dynamo error the script caught."""
    run = context.rank_run
    parsed = parse_compile_error(run.error if run is not None else None)
    findings = [] if parsed is None else [_finding(context, analyzer, parsed, caught=False, cost_ns=context.wall_ns)]
    raised = {_key(parsed)} if parsed is not None else set()
    run_error = run.error if run is not None and run.error else ""
    for caught, dur_ns in caught_compile_errors(context):
        if _key(caught) not in raised:
            raised.add(_key(caught))
            # An error of Dynamo's tracing that is no `torch._dynamo.exc` class (a guard on a data-dependent size)
            # and that the run ended with: the script did not catch it.
            stopped = parsed is None and _ended_run(caught, run_error)
            findings.append(_finding(context, analyzer, caught, caught=not stopped,
                                     cost_ns=context.wall_ns if stopped else dur_ns))
    return findings


def _ended_run(error: CompileError, run_error: str) -> bool:
    """Whether the run's exception (its formatted traceback and message) is `error`."""
    return bool(error.reason) and error.reason in run_error


def _key(parsed: CompileError | None) -> tuple[str, str, int, str]:
    at = None if parsed is None else parsed.user_line or parsed.call_line
    return (os.path.basename(at.file) if at else "", "" if parsed is None else parsed.reason, at.line if at else 0,
            "" if parsed is None else parsed.kind.rpartition(".")[2])


def caught_compile_errors(context: AnalysisContext) -> list[tuple[CompileError, int]]:
    """The Dynamo errors of the run's frame compiles that raised (`detail.failure`), with the time each compile took,
    in the order they ran; an error the script did not catch is also the run's."""
    if not context.trace.has_table("compiles"):
        return []
    errors: list[tuple[CompileError, int]] = []
    for detail_text, dur_ns in context.trace.sql(
        "SELECT detail, dur_ns FROM compiles WHERE rank = ? AND kind = 'dynamo_frame' AND detail LIKE '%\"failure\"%' "
        "ORDER BY start_ns", (context.rank,),
    ):
        failure = detail_object(detail_text).get("failure")
        # Dynamo tracing tputrace's own code (the optimizer step's hook, in torch's step wrapper that calls it) ran
        # that frame uncompiled: nothing in the script to change.
        if isinstance(failure, dict) and not (isinstance(failure.get("file"), str) and is_own_file(failure["file"])):
            errors.append((_recorded_error(context, failure), int(dur_ns or 0)))
    return errors


def _recorded_error(context: AnalysisContext, failure: dict[str, object]) -> CompileError:
    """A recorded failure (`kind`, `text`, `file`, `line`, `call_frame_id`) read as the exception's text would be."""
    kind = str(failure.get("kind") or "Error")
    kind = kind if "." in kind else f"torch._dynamo.exc.{kind}"
    text = str(failure.get("text") or "").splitlines()
    explanation = next((line.strip().removeprefix("Explanation:").strip() for line in text if line.strip().startswith("Explanation:")), None)
    hints = tuple(line.strip().removeprefix("Hint:").strip() for line in text if line.strip().startswith("Hint:"))
    file, line = failure.get("file"), failure.get("line")
    user_line = SourceLine(file, line, "") if isinstance(file, str) and isinstance(line, int) and line > 0 else None
    call_frame_id = failure.get("call_frame_id")
    call = context.location(call_frame_id) if isinstance(call_frame_id, int) else None
    call_line = SourceLine(call.file, call.line, call.function or "") if call is not None else None
    return CompileError(kind, text[0].strip() if text else kind, explanation, hints, user_line, call_line,
                        skipped_frame=_FRAME_SKIPPED in str(failure.get("text") or ""))


def _finding(context: AnalysisContext, analyzer: str, parsed: CompileError, *, caught: bool, cost_ns: int) -> Finding:
    at = parsed.user_line or parsed.call_line
    where = at.short if at is not None else "an unknown line"
    code = f" (`{at.code}`)" if at is not None and at.code else ""
    what = (parsed.explanation or parsed.reason).rstrip(".")
    went_on = ("; the script caught it and ran the function uncompiled" if caught else "; the run stopped")
    if parsed.graph_break and caught:
        # A frame compile that failed on a graph break without ending the run: Dynamo skipped the frame itself (no
        # resuming from a break in a loop, or a call it cannot wrap), or a script caught `fullgraph=True`'s error.
        title = f"torch.compile could not compile the function at {where}: {parsed.reason}; it runs uncompiled"
        explanation = f"Dynamo could not trace {where}{code}: {what}. " + (
            "The graph broke inside a loop, which Dynamo does not resume from, so it skipped the whole frame: every "
            "call runs the function as it was written, op by op" if parsed.skipped_frame else
            "The frame's compile failed, so the function runs as it was written, op by op: Dynamo skipped the frame, "
            "or, under `fullgraph=True`, the script caught the error and called the function uncompiled"
        ) + "; only this finding tells that it never compiled."
    elif parsed.graph_break:
        title = f"torch.compile(fullgraph=True) raised at {where}: {parsed.reason}{went_on}"
        explanation = (
            f"Dynamo could not trace {where}{code}: {what}. Without `fullgraph=True` it would break the graph there and "
            "run the line in Python; with it (or with graph breaks made errors) it raises instead, and the run stopped "
            "there."
        )
    else:
        title = f"torch.compile failed at {where}: {parsed.reason}{went_on}"
        explanation = f"Dynamo raised {parsed.kind.rpartition('.')[2]} while compiling {where}{code}: {what}" + (
            ". The script caught the exception and went on, so the function it meant to compile runs as it was written "
            "(a fallback to the uncompiled function runs it op by op); only this finding tells that it never compiled."
            if caught else ". The run stopped there.")
    evidence = [Evidence(f"{parsed.kind}: {parsed.reason}", file=at.file if at else None, line=at.line if at else None)]
    if parsed.call_line is not None and parsed.call_line != at:
        evidence.append(Evidence("the call of the compiled function",
                                 file=parsed.call_line.file, line=parsed.call_line.line))
    evidence += [Evidence(f"Dynamo's hint: {hint}") for hint in parsed.hints[:3]]
    return Finding(
        analyzer=analyzer,
        severity="warning" if caught else "critical",
        title=title,
        explanation=explanation,
        suggestion=compile_error_suggestion(parsed, where, uncompiled=caught),
        cost_total_ns=float(cost_ns),
        evidence=tuple(evidence),
        file=at.file if at else None,
        line=at.line if at else None,
    )


def compile_error_suggestion(parsed: CompileError, where: str, *, uncompiled: bool = False) -> str:
    """The change that lets the function compile; `uncompiled`: the run went on with the function uncompiled, which
    `fullgraph=True` or Dynamo itself may have caused."""
    text = f"{parsed.reason} {parsed.explanation or ''}".lower()
    without_fullgraph = "" if not parsed.graph_break or parsed.skipped_frame else (
        " Where it is compiled with `fullgraph=True`, `fullgraph=False` lets Dynamo break the graph at the line "
        "instead, which then runs in Python on every call (a host read of the value each time, which a traced run "
        "reports)." if uncompiled else
        " Or compile it with `fullgraph=False`: Dynamo then breaks the graph at the line, which runs in Python on every "
        "call (a host read of the value each time, which a traced run reports).")
    if "data-dependent branching" in text or "jump with tensorvariable" in text:
        return (f"Make the branch at {where} a tensor op inside the compiled function: compute both sides and choose "
                "with `torch.where(condition, a, b)` (or `torch.clamp`/`torch.minimum` for a bound), or use "
                "`torch.cond(condition, true_fn, false_fn, operands)` when a side is costly; the function then "
                "compiles as one graph and nothing is read on the host." + without_fullgraph)
    if "data-dependent expression" in text:
        return (f"The code at {where} decides what to trace from a size or value that depends on the tensor's data "
                "(the length of a `unique`, `nonzero` or boolean-mask result, a loop over their `.tolist()`), which one "
                "graph cannot hold: loop over a fixed set instead (every expert, each masked by `choice == index`) and "
                "choose with `torch.where`, so the shapes stay fixed.")
    if "item()" in text or "tolist()" in text or "capture_scalar_outputs" in text:
        return (f"Keep the value at {where} a tensor: return it and read it outside the compiled function (every N "
                "steps), or set `torch._dynamo.config.capture_scalar_outputs = True` to trace the read into the "
                "graph." + without_fullgraph)
    if "dynamic shape operator" in text or "data-dependent output shape" in text or "capture_dynamic_output_shape_ops" in text:
        return (f"The op at {where} has an output whose shape depends on the values: keep the shape fixed "
                "(`torch.where(mask, x, 0)` for `x[mask]`), or set `torch._dynamo.config.capture_dynamic_output_shape_ops "
                "= True`." + without_fullgraph)
    if "`print`" in text or "logging" in text:
        return (f"Move the print or log at {where} out of the compiled function: return the value and print it "
                "outside (every N steps)." + without_fullgraph)
    if "fake tensor" in text:
        return (f"The line at {where} fails on the shapes and dtypes it is given (Dynamo ran it on fake tensors): run "
                "the function without torch.compile (`torch.compiler.set_stance(\"force_eager\")`) to see the op's own "
                "error, and fix the shapes.")
    hint = f" Dynamo's hint: {parsed.hints[0].rstrip('.')}." if parsed.hints else ""
    if parsed.graph_break:
        return f"Change the line at {where} to something Dynamo can trace.{hint}{without_fullgraph}"
    return f"Fix the line at {where}.{hint} `TORCHDYNAMO_VERBOSE=1` shows Dynamo's own stack."
