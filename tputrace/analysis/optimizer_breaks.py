"""A graph break inside an optimizer's step (torch.optim's code), under a compiled `optimizer.step()`: told by what
happened to the step, not as a library line that "runs in Python".

Two kinds:
- torch.optim's own break: every `Optimizer.step` calls `torch._dynamo.graph_break()` before and after the update
  (`_use_grad_for_differentiable`), so that AOTAutograd sees the update as a graph free of autograd. The update then
  compiles as a graph of its own (a Dynamo frame `Adam.step` with ops): the step falls out of the calling function's
  graph but is compiled; nothing in the script causes or can remove the break.
- a break in the update itself (LBFGS's `.item()` and branches on the loss, a library optimizer's Python): the step
  falls out of the graph there, partly or wholly uncompiled; the fix is to leave the step eager, outside the compiled
  function, or to use an optimizer whose step Dynamo traces.
A break in the step of an optimizer that is not torch.optim's (the script's own subclass, a library's) is told by
`custom_optimizers`, naming its class.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputrace.analysis.break_sites import IN_LIBRARY, CallingLine, user_function
from tputrace.analysis.context import AnalysisContext, detail_object
from tputrace.analysis.custom_optimizers import custom_step, custom_step_wording
from tputrace.store.records import SourceLocation
from tputrace.wording import plural

_OPTIM_FOLDER = "/torch/optim/"
_TORCH_OWN_BREAK = "torch._dynamo.graph_break()"
_WRAPPER_FILE = "/torch/optim/optimizer.py"
# Dynamo's reason for a step torch wrapped with `torch.compiler.disable` (LBFGS's: "optimizer ... step not supported").
_DISABLED_STEP = re.compile(r"<function (?P<owner>\w+)\.step\b.*?`torch\.compiler\.disable` \(reason: (?P<why>[^()]*)\)",
                            re.DOTALL)
_OPTIM_MODULES = {"adam", "adamw", "adamax", "adagrad", "adadelta", "asgd", "lbfgs", "nadam", "radam", "rmsprop", "rprop",
                  "sgd", "sparse_adam", "_muon", "muon"}


@dataclass(frozen=True)
class StepBreak:
    """What a break in an optimizer's step did: the title's and explanation's words and the advice."""

    title: str
    explanation: str
    suggestion: str


@dataclass(frozen=True)
class StepGraphs:
    """The Dynamo frames of optimizer steps (`Adam.step`) in the run: those that compiled a graph with ops (their
    names and ops), and the failure of one that did not."""

    names: tuple[str, ...]
    ops: int
    failure: str | None


def is_optimizer_break(location: SourceLocation | None) -> bool:
    """Whether a break's line is in torch.optim's code (an optimizer's step, or torch's wrapper around it)."""
    return location is not None and _OPTIM_FOLDER in location.file.replace("\\", "/")


def module_file(location: SourceLocation | None) -> str | None:
    """The file of a break in an optimizer's own module (`torch/optim/lbfgs.py`), not torch's wrapper around steps."""
    if not is_optimizer_break(location) or location is None:
        return None
    return None if location.file.replace("\\", "/").endswith(_WRAPPER_FILE) else location.file


def is_optimizer_file(name: str, function: str) -> bool:
    """Whether a library frame an import names by its file's base name (`(in optimizer.py:79, _use_grad)`) is
    torch.optim's: its wrapper module, or an optimizer's step in one of its modules."""
    return name == "optimizer.py" or (name.removesuffix(".py") in _OPTIM_MODULES and user_function(function) == "step")


def step_break_at(context: AnalysisContext, location: SourceLocation | None, where: str, what: str, reason: str,
                  caller: CallingLine | None, eager: bool) -> StepBreak | None:
    """The step's wording for a break at `location` in torch.optim, or for an import's break at the user's line whose
    reason names torch.optim's file, or in the step of an optimizer class that is not torch.optim's (`custom_step`);
    None for any other break."""
    in_library = IN_LIBRARY.search(reason)
    if in_library is not None and location is not None and is_optimizer_file(in_library["file"], in_library["function"]):
        return step_break(context, f"{in_library['file']}:{in_library['line']}", what, IN_LIBRARY.sub("", reason),
                          CallingLine(location.file, location.line, location.function, True), eager, None)
    if not is_optimizer_break(location):
        custom = custom_step(context, location)
        if custom is None or location is None:
            return None
        return StepBreak(*custom_step_wording(custom, location, where, what, reason, eager))
    return step_break(context, where, what, reason, caller, eager, module_file(location))


def step_break(context: AnalysisContext, where: str, what: str, reason: str, caller: CallingLine | None,
               eager: bool, step_file: str | None) -> StepBreak:
    """The title, explanation and advice for a break in torch.optim at `where` (`what`: a short name of what broke
    the graph; `eager`: Dynamo gave up on the frame and runs it uncompiled; `step_file`: the break's file where it is
    an optimizer's module, whose frames are that optimizer's step)."""
    graphs = _step_graphs(context, step_file, caller)
    owners = [name.rpartition(".")[0] for name in graphs.names if "." in name]
    optimizer = owners[0] if owners else "the optimizer"
    at = f" at {caller.short}" if caller is not None else ""
    around = (f" {user_function(caller.function)}()'s"
              if caller is not None and caller.inside_compiled and not caller.function.startswith("<") else " the")
    if _TORCH_OWN_BREAK in what:
        compiled = (f"compiles as a graph of its own ({', '.join(graphs.names)}, {plural(graphs.ops, 'op')})"
                    if graphs.names else "falls out of" + around + " graph")
        title = (f"The optimizer step{at} {compiled}: torch.optim breaks the graph around every step "
                 f"(`{what}` at {where})")
        explanation = (
            f"torch.optim calls `{what}` before and after every optimizer step, so Dynamo ends{around} graph before "
            "the step and compiles the update as a graph of its own (an inference graph free of autograd), then "
            "resumes after it. "
            + (f"The step is compiled ({', '.join(graphs.names)}); what the break costs is the step's own launch and "
               "the graphs before and after it. " if graphs.names else
               "The trace records no compile of the update itself. "))
        suggestion = (
            "Nothing in the script causes the break and it need not be removed: torch.optim compiles the update on its "
            "own. Keep the step in the compiled function (or compile a function that calls `opt.step()`), with the "
            "optimizer's default `foreach` implementation so the update is a few ops over all parameters, and, for "
            "Adam or AdamW, `capturable=True` so that its step counts stay on the chip.")
        return StepBreak(title, explanation, suggestion)
    disabled = _DISABLED_STEP.search(reason)
    if disabled is not None:  # torch itself keeps this optimizer's step out of Dynamo
        owner, why = disabled["owner"], disabled["why"].strip()
        title = (f"The optimizer step{at} is not compiled: torch runs {owner}.step eagerly "
                 f"(`torch.compiler.disable`: {why})")
        explanation = (f"torch wraps {owner}'s step with `torch.compiler.disable` ({why}), so Dynamo skips the call at "
                       f"{where}: the step runs eagerly, op by op, on every call, and the code around it compiles as "
                       "graphs of their own. ")
        suggestion = (f"Dynamo does not compile {owner}'s step: call `opt.step()` outside the compiled function "
                      "(compile the forward and backward, a function that returns the loss), or use an optimizer whose "
                      "step Dynamo compiles (Adam, AdamW, SGD), through a compiled function that calls `opt.step()`.")
        return StepBreak(title, explanation, suggestion)
    falls = "is not compiled" if eager or not graphs.names else "falls out of the graph"
    title = f"The optimizer step{at} {falls}: Dynamo cannot trace {optimizer}'s step at {where} ({what})"
    explanation = (
        f"Dynamo broke the graph inside {optimizer}'s step at {where}: "
        + ("a Python branch on a tensor's value, which only the chip knows. " if reason.startswith("generic_jump")
           else f"{reason.rstrip('.')}. ")
        + ("It gave up on the step's frame, so the step runs eagerly, op by op, with no graph. "
           if eager or not graphs.names else
           f"The rest of the step runs in Python and in the graphs Dynamo compiled around the break "
           f"({', '.join(graphs.names)}: {plural(graphs.ops, 'op')}). ")
        + (f"Dynamo's failure on a step frame: {graphs.failure}. " if graphs.failure else ""))
    suggestion = (
        f"{optimizer}'s step is Python that Dynamo cannot trace at {where}, and only torch's authors can change it. "
        "Leave the step eager: compile the forward and backward (a function that returns the loss) and call "
        "`opt.step()` outside the compiled function (with `foreach=True` where the optimizer takes it, so each update op "
        "runs over all parameters at once); or use an optimizer whose step Dynamo traces (Adam, AdamW, SGD with their default `foreach`), compiled "
        "through a function that calls `opt.step()`.")
    return StepBreak(title, explanation, suggestion)


def _step_graphs(context: AnalysisContext, step_file: str | None, caller: CallingLine | None) -> StepGraphs:
    """The frames Dynamo compiled in an optimizer's module (not torch's wrapper in `optimizer.py`), named
    `Adam.step`, `LBFGS._add_grad` (a resumed frame by the method it resumes): those in `step_file` where given, else
    those the caller's line called (all where none has that call site)."""
    rows = [row for row in _optimizer_frames(context) if step_file is None or row[1] == step_file]
    if caller is not None and step_file is None:
        rows = [row for row in rows if detail_object(row[3]).get("call_site") == caller.short]
    names: list[str] = []
    ops = 0
    failure = None
    for name, _, program_ops, detail in rows:
        parsed = detail_object(detail)
        graph_ops = parsed.get("n_ops", program_ops)
        owner, _, method = (name or "").rpartition(".")
        shown = f"{owner}.{user_function(method)}" if owner else user_function(method)
        if isinstance(graph_ops, int) and graph_ops > 0:
            ops += graph_ops
            if shown not in names:
                names.append(shown)
        elif failure is None and isinstance(parsed.get("failed"), str):
            failure = str(parsed["failed"])
    return StepGraphs(tuple(names), ops, failure)


def _optimizer_frames(context: AnalysisContext) -> list[tuple[str, str, int | None, str | None]]:
    """(name, file, program ops, detail) of the Dynamo frames compiled in torch.optim's optimizer modules."""
    rows = context.trace.sql(
        "SELECT s.text, fs.text, p.n_ops, c.detail FROM compiles c JOIN strings s ON s.id = c.name_sid "
        "JOIN frames f ON f.id = c.frame_id JOIN strings fs ON fs.id = f.file_sid "
        "LEFT JOIN programs p ON p.id = c.program_id WHERE c.rank = ? AND c.kind = 'dynamo_frame' ORDER BY c.start_ns",
        (context.rank,),
    )
    return [(name or "", file, ops, detail) for name, file, ops, detail in rows
            if _OPTIM_FOLDER in (file or "").replace("\\", "/") and not (file or "").replace("\\", "/").endswith(_WRAPPER_FILE)]
