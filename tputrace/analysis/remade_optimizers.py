"""An optimizer made inside the training loop: `opt = torch.optim.Adam(...)` in the epoch loop around `opt.step()`.

Each iteration of that loop makes a new optimizer, whose state (Adam's moments and step count, SGD's momentum
buffers) starts again from zero, as at the start of training, and whose first step makes that state again in a program
of its own. The optimizer's steps are known by torch.optim's `Optimizer.step#...` ranges (at the line calling it);
the constructor by the run's copy of the file: an assignment to the name the step is called on (`opt.step()`,
`scaler.step(opt)`), in a loop around that call, before it, or in the function around that loop (a `train_epoch`
called once per epoch). In DeferAndFuse the state made again is recorded (flushes
`optimizer_state` at the step's line in several steps) and must be; in strict mode, which records none, the
assignment must be in the loop and run on every iteration (not under an `if`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from tputrace.analysis.call_sites import parsed_source
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding
from tputrace.wording import format_ns, plural

NAME = "remade_optimizers"
_STEP_RANGE = "Optimizer.step#%"
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@dataclass(frozen=True)
class RemadeOptimizer:
    """An optimizer made at `made_at` in the loop at `loop_at` (or the function, named in backquotes, whose loop steps
    it) around its step at `stepped_at`."""

    made_at: str
    stepped_at: str
    loop_at: str
    optimizer: str
    state_made_steps: tuple[int, ...]
    cost_ns: int


@dataclass(frozen=True)
class RemadeOptimizersData:
    remade: tuple[RemadeOptimizer, ...] = ()


@dataclass(frozen=True)
class _Constructor:
    line: int
    loop_line: int | None  # None: made in the function around the step's loop, once per call of it
    name: str
    conditional: bool
    function: str = ""


def analyze(context: AnalysisContext) -> AnalysisResult[RemadeOptimizersData]:
    findings: list[Finding] = []
    remade: list[RemadeOptimizer] = []
    for frame_id, optimizer, steps in _step_lines(context):
        location = context.location(frame_id)
        copy = None if location is None else context.trace.source_copy(location.file)
        if location is None or copy is None:
            continue
        constructor = _constructor(copy, location.line, optimizer)
        if constructor is None:
            continue
        state_steps, state_ns = _state_made(context, frame_id)
        strict = not _records_state(context)
        # A constructor under an `if` may switch optimizers once, on purpose (a second phase): made again at least twice.
        # One in the function around the loop is made again only if the function ran again: strict mode cannot tell.
        if ((strict and (constructor.conditional or constructor.loop_line is None))
                or (not strict and len(state_steps) < (3 if constructor.conditional else 2))):
            continue
        compile_ns = _compiles_after(context, frame_id, state_steps[0] if state_steps else min(steps))
        short = location.short.rsplit(":", 1)[0]
        loop_at = f"{short}:{constructor.loop_line}" if constructor.loop_line is not None else f"`{constructor.function}`"
        record = RemadeOptimizer(f"{short}:{constructor.line}", location.short, loop_at, optimizer, tuple(state_steps),
                                 state_ns + compile_ns)
        remade.append(record)
        findings.append(_finding(context, location.file, record, constructor, frame_id, compile_ns))
    return AnalysisResult(NAME, RemadeOptimizersData(tuple(remade)), tuple(findings))


def _step_lines(context: AnalysisContext) -> list[tuple[int, str, list[int]]]:
    """(frame id, optimizer class, steps) of each line calling an optimizer's step in the loop."""
    loop = context.loop_range
    if loop is None or not context.trace.has_table("annotations"):
        return []
    by_frame: dict[tuple[int, str], list[int]] = {}
    for frame_id, name, step in context.trace.sql(
        "SELECT a.frame_id, s.text, a.step FROM annotations a JOIN strings s ON s.id = a.name_sid WHERE a.rank = ? "
        "AND s.text LIKE ? AND a.step BETWEEN ? AND ? AND a.frame_id IS NOT NULL",
        (context.rank, _STEP_RANGE, *loop),
    ):
        optimizer = str(name).split("#", 1)[1].split(".", 1)[0]
        by_frame.setdefault((int(frame_id), optimizer), []).append(int(step))
    return [(frame_id, optimizer, steps) for (frame_id, optimizer), steps in by_frame.items() if len(steps) >= 2]


def _records_state(context: AnalysisContext) -> bool:
    """Whether the run recorded the making of optimizer state (DeferAndFuse flushes it apart)."""
    return context.trace.has_table("flushes") and bool(context.trace.sql(
        "SELECT 1 FROM flushes WHERE rank = ? AND trigger = 'optimizer_state' LIMIT 1", (context.rank,)))


def _state_made(context: AnalysisContext, frame_id: int) -> tuple[list[int], int]:
    """The steps in which the optimizer stepped at `frame_id` made its state, and the time of all but the first."""
    if not context.trace.has_table("flushes"):
        return [], 0
    rows = context.trace.sql(
        "SELECT step, dur_ns FROM flushes WHERE rank = ? AND frame_id = ? AND trigger = 'optimizer_state' ORDER BY start_ns",
        (context.rank, frame_id),
    )
    steps = sorted({int(step) for step, _ in rows})
    return steps, sum(int(dur_ns) for _, dur_ns in rows[1:])


def _compiles_after(context: AnalysisContext, frame_id: int, first_step: int) -> int:
    """Compile time at the step's line after the step in which the first optimizer made its state."""
    if not context.trace.has_table("compiles"):
        return 0
    (total,) = context.trace.sql(
        "SELECT COALESCE(SUM(dur_ns), 0) FROM compiles WHERE rank = ? AND frame_id = ? AND step > ?",
        (context.rank, frame_id, first_step),
    )[0]
    return int(total)


def _constructor(copy: str, step_line: int, optimizer: str) -> _Constructor | None:
    """The assignment that makes the optimizer stepped at `step_line` in a loop around that call, before it."""
    parsed = parsed_source(copy)
    if parsed is None:
        return None
    tree = parsed[0]
    function, loops = _enclosing_loops(tree, step_line)
    call = next((node for loop in loops[-1:] for node in ast.walk(loop) if isinstance(node, ast.Call)
                 and getattr(node, "lineno", 0) <= step_line <= getattr(node, "end_lineno", 0)
                 and isinstance(node.func, ast.Attribute) and node.func.attr == "step"), None)
    if call is None or not isinstance(call.func, ast.Attribute):
        return None
    names = {ast.unparse(call.func.value), *(ast.unparse(arg) for arg in call.args[:1])}
    scopes: list[ast.AST] = [*loops, *([function] if function is not None else [])]
    for scope in scopes:
        for node, conditional in _statements(scope):
            if node.lineno >= step_line or not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            if not isinstance(value, ast.Call) or not any(ast.unparse(target) in names for target in targets):
                continue
            callee = ast.unparse(value.func)
            if optimizer in callee or "optim" in callee.lower():
                loop_line = scope.lineno if isinstance(scope, _LOOPS) else None
                return _Constructor(node.lineno, loop_line, ast.unparse(targets[0]), conditional,
                                    "" if loop_line is not None else getattr(scope, "name", ""))
    return None


def _enclosing_loops(tree: ast.Module, line: int) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef | None, list[ast.For | ast.AsyncFor | ast.While]]:
    """The function around `line` (None at module level) and the loops around it there, outermost first."""
    loops: list[ast.For | ast.AsyncFor | ast.While] = []
    function: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    node: ast.AST = tree
    while True:
        inner = next((child for child in ast.iter_child_nodes(node)
                      if getattr(child, "lineno", 0) <= line <= (getattr(child, "end_lineno", 0) or 0)), None)
        if inner is None:
            return function, loops
        if isinstance(inner, _SCOPES):
            loops = []
            function = inner if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        elif isinstance(inner, _LOOPS):
            loops.append(inner)
        node = inner


def _statements(loop: ast.AST) -> list[tuple[ast.stmt, bool]]:
    """The statements of a loop's body, not in a function defined there, each with whether an `if` or `try` guards
    it within the loop."""
    found: list[tuple[ast.stmt, bool]] = []
    pending: list[tuple[ast.AST, bool]] = [(child, False) for child in getattr(loop, "body", [])]
    while pending:
        node, conditional = pending.pop()
        if isinstance(node, _SCOPES):
            continue
        if isinstance(node, ast.stmt):
            found.append((node, conditional))
        guarded = conditional or isinstance(node, (ast.If, ast.Try))
        pending.extend((child, guarded) for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
    return found


def _state_of(optimizer: str) -> str:
    """What the optimizer's state holds, in words."""
    if optimizer.startswith(("Adam", "NAdam", "RAdam", "Adamax", "Lamb", "Lion")):
        return "its state (the moment estimates and the step count of its bias correction)"
    if optimizer in ("SGD", "RMSprop"):
        return "its state (the momentum and running averages of the gradients)"
    return "its state"


def _finding(context: AnalysisContext, file: str, remade: RemadeOptimizer, constructor: _Constructor, step_frame: int,
             compile_ns: int) -> Finding:
    made = len(remade.state_made_steps)
    state_text = (
        f" Each new optimizer's first step made its state again, in a program of its own (in steps "
        f"{', '.join(map(str, remade.state_made_steps))}: {format_ns(remade.cost_ns - compile_ns)} after the first)"
        if made else ""
    )
    in_loop = constructor.loop_line is not None
    compiles = f", and {format_ns(compile_ns)} of compiling at {remade.stepped_at} followed" if compile_ns else ""
    cost_text = f"{state_text}{compiles}." if state_text or compiles else ""
    evidence = [context.evidence_at(f"`{remade.optimizer}` stepped at {remade.stepped_at}, in the loop's steps", step_frame)]
    if made:
        step_location = context.location(step_frame)
        evidence.append(Evidence(f"optimizer state made in {plural(made, 'step')}: {', '.join(map(str, remade.state_made_steps))}",
                                 file=file, line=step_location.line if step_location else None, table="flushes"))
    return Finding(
        analyzer=NAME,
        # Restarting the optimizer's state changes the training, whatever the time it costs.
        severity="warning",
        title=(f"Optimizer made inside the loop at {remade.made_at}: a new `{remade.optimizer}` each iteration of the loop at {remade.loop_at}"
               if in_loop else f"Optimizer made inside {remade.loop_at} at {remade.made_at}: a new `{remade.optimizer}` each call"),
        explanation=(
            f"`{constructor.name}` is made at {remade.made_at}, inside "
            + (f"the loop at {remade.loop_at} around its `step()` at {remade.stepped_at}, so every iteration of that loop "
               if in_loop else f"{remade.loop_at}, which steps it at {remade.stepped_at} and ran again, so every call ")
            + f"starts a new `{remade.optimizer}`: "
            f"{_state_of(remade.optimizer)} starts again from zero, as at the start of training, and a learning-rate "
            f"scheduler made for the previous optimizer no longer drives the new one.{cost_text}"
            + ("" if in_loop else " (Where each call trains a new model, as k-fold cross-validation does, a new optimizer "
                                  "is what it needs.)")
        ),
        suggestion=(
            (f"Make the optimizer once, before the loop at {remade.loop_at}, and keep stepping it: to change the "
             if in_loop else f"Make the optimizer once, before the loop that calls {remade.loop_at}, and pass it in: to change the ")
            + 
            "learning rate each epoch, set `group['lr']` for each of `optimizer.param_groups`, or use a "
            "`torch.optim.lr_scheduler` scheduler; its state then carries over and its first step's program is made "
            "once."
        ),
        cost_total_ns=float(remade.cost_ns),
        cost_per_step_ns=None,
        evidence=tuple(evidence),
        file=file,
        line=constructor.line,
    )
