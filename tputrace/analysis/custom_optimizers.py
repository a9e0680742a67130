"""A graph break inside the step of an optimizer that is not torch.optim's own: a `torch.optim.Optimizer` subclass the
script defines, or a library's (a Lion, a Sophia), under a compiled `optimizer.step()`. torch.optim wraps every
subclass's `step` (its `wrapper` in `optimizer.py`), so the Dynamo frames compiled in that file say where the script
called the step; the class is the one whose code holds the break, read from the run's copy of the source, known as an
optimizer by its bases (`Optimizer`, in the file, through other classes there) or, for a base defined elsewhere, by a
`step` method and `self.param_groups` in a run that went through torch.optim's wrapper. Its wording names the class and what the break did:
the step falls out of the graph at that line, or runs eagerly where no graph of it compiled ops."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

from tputrace.analysis.call_sites import parsed_source
from tputrace.analysis.context import AnalysisContext, detail_object
from tputrace.frame_files import is_library_file
from tputrace.store.records import SourceLocation

_WRAPPER_FILE = "/torch/optim/optimizer.py"
_OPTIMIZER_BASE = "Optimizer"


@dataclass(frozen=True)
class CustomStep:
    """An optimizer class's step that broke the graph: the class, whether the script defines it (not a library), the
    lines that called `optimizer.step()` for a compiled function, and the ops of the graphs compiled in torch's
    wrapper around the step (none: the step ran eagerly)."""

    owner: str
    in_script: bool
    called_at: tuple[str, ...]
    wrapper_ops: int


def custom_step(context: AnalysisContext, location: SourceLocation | None) -> CustomStep | None:
    """The optimizer class (not torch.optim's) whose code holds a break at `location`, else None."""
    if location is None:
        return None
    copy = context.trace.source_copy(location.file)
    parsed = parsed_source(copy) if copy is not None else None
    if parsed is None:
        return None
    classes = {node.name: node for node in ast.walk(parsed[0]) if isinstance(node, ast.ClassDef)}
    holder = next((node for node in classes.values()
                   if node.lineno <= location.line <= (node.end_lineno or node.lineno)
                   and not any(inner is not node and isinstance(inner, ast.ClassDef)
                               and inner.lineno <= location.line <= (inner.end_lineno or inner.lineno)
                               for inner in ast.walk(node))), None)
    if holder is None:
        return None
    called_at, wrapper_ops = _wrapper_frames(context)
    has_step = any(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "step"
                   for item in holder.body)
    uses_groups = any(isinstance(node, ast.Attribute) and node.attr == "param_groups" for node in ast.walk(holder))
    if not (_subclasses_optimizer(holder, classes, set()) or (has_step and uses_groups and called_at)):
        return None
    return CustomStep(holder.name, not is_library_file(location.file), called_at, wrapper_ops)


def _subclasses_optimizer(node: ast.ClassDef, classes: dict[str, ast.ClassDef], seen: set[str]) -> bool:
    """Whether a class's bases name `Optimizer` (`torch.optim.Optimizer`, `optim.Optimizer`), directly or through
    other classes of the same file."""
    seen.add(node.name)
    for base in node.bases:
        name = base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else None
        if name == _OPTIMIZER_BASE:
            return True
        if name in classes and name not in seen and _subclasses_optimizer(classes[name], classes, seen):
            return True
    return False


def _wrapper_frames(context: AnalysisContext) -> tuple[tuple[str, ...], int]:
    """The script's lines that called an optimizer's step through torch.optim's wrapper under Dynamo, and the ops of
    the graphs compiled in that wrapper's frames."""
    lines: list[str] = []
    ops = 0
    for file, program_ops, detail in context.trace.sql(
        "SELECT fs.text, p.n_ops, c.detail FROM compiles c JOIN frames f ON f.id = c.frame_id "
        "JOIN strings fs ON fs.id = f.file_sid LEFT JOIN programs p ON p.id = c.program_id "
        "WHERE c.rank = ? AND c.kind = 'dynamo_frame' ORDER BY c.start_ns", (context.rank,),
    ):
        if not (file or "").replace("\\", "/").endswith(_WRAPPER_FILE):
            continue
        parsed = detail_object(detail)
        graph_ops = parsed.get("n_ops", program_ops)
        ops += graph_ops if isinstance(graph_ops, int) else 0
        call_site = parsed.get("call_site")
        if isinstance(call_site, str) and call_site not in lines:
            lines.append(call_site)
    return tuple(lines), ops


def custom_step_wording(step: CustomStep, location: SourceLocation, where: str, what: str, reason: str,
                        eager: bool) -> tuple[str, str, str]:
    """The title, explanation and advice for a break at `where` in `step`'s class's code."""
    at = f" at {', '.join(step.called_at[:2])}" if step.called_at else ""
    runs_eagerly = eager or step.wrapper_ops == 0
    falls = "runs eagerly" if runs_eagerly else "falls out of the graph"
    title = f"The optimizer step{at} {falls}: Dynamo cannot trace {step.owner}.step at {where} ({what})"
    defined = ("the script's own `torch.optim.Optimizer` subclass" if step.in_script else
               f"a library's `torch.optim.Optimizer` subclass ({os.path.basename(location.file)})")
    explanation = (
        f"{step.owner} is {defined}, not one of torch.optim's. Dynamo broke the graph inside its step at {where}: "
        + ("a Python branch on a tensor's value, which only the chip knows. " if reason.startswith("generic_jump")
           else f"{reason.rstrip('.')}. ")
        + ("Dynamo compiled no graph with ops of the step, so it runs eagerly, op by op, on every call. "
           if runs_eagerly else
           "The rest of the step runs in Python and in the graphs Dynamo compiled around the break. "))
    leave_eager = ("or leave the step eager: compile the forward and backward (a function that returns the loss) and "
                   "call `opt.step()` outside the compiled function.")
    if step.in_script:
        suggestion = (f"Make {step.owner}.step traceable at {where}: keep the value there a tensor on the chip and use "
                      "it in tensor ops (`torch.clamp`, `torch.minimum`, `torch.where` in place of Python's `min`, "
                      "`max` or an `if` on it; no `.item()` or `float(...)`), so the whole update compiles as one "
                      f"graph; {leave_eager}")
    else:
        suggestion = (f"{step.owner}'s step is the library's code, which Dynamo cannot trace at {where}: look for its "
                      f"setting that keeps values on the chip, {leave_eager} An optimizer whose step Dynamo traces "
                      "(torch.optim's Adam, AdamW, SGD) compiles inside the function.")
    return title, explanation, suggestion
