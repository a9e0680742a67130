"""Reads whose value a Python branch takes next: `peak = g.abs().max().item()` then `if peak > limit:` a line or two
later. The read is there to decide, so keeping the value on the chip and reading it every N steps does not apply: the
decision itself has to move to the chip (the branch made arithmetic), and then nothing is read. A branch that ends
the loop (an early stop on a validation loss: `break` in it or its `else`) cannot become arithmetic: the check is
made less often instead."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from tputrace.analysis.call_sites import line_text, parsed_source
from tputrace.analysis.context import AnalysisContext
from tputrace.store.records import SourceLocation

LOOK_AHEAD = 3  # lines after the read where the branch on its value may be
_ASSIGNED_READ = re.compile(r"^(?P<name>[A-Za-z_]\w*)\s*=\s*.*\.(?:item|tolist)\(\)$")
_BRANCH = re.compile(r"^(?:if|elif|while)\s+(?P<condition>.*):$")


@dataclass(frozen=True)
class Decision:
    """The branch on a read's value: its line and source text, and the name the read was assigned to."""

    line: int
    text: str
    name: str
    stop_line: int | None = None  # the line in the branch (or its `else`) that ends the loop: `break`, `return`, `raise`
    stop_text: str = ""


def decision_after(context: AnalysisContext, frame_id: int | None) -> Decision | None:
    """The `if`/`while` within `LOOK_AHEAD` lines after a read assigned to a name (`peak = x.item()`) whose condition
    takes that name; None when the line assigns no read or no branch follows."""
    location = context.location(frame_id)
    assigned = _ASSIGNED_READ.match(line_text(location, context.trace) or "")
    if location is None or assigned is None:
        return None
    name = re.compile(rf"(?<![\w.]){re.escape(assigned['name'])}(?!\w)")
    for line in range(location.line + 1, location.line + 1 + LOOK_AHEAD):
        text = line_text(SourceLocation(location.file, line, location.function), context.trace) or ""
        branch = _BRANCH.match(text)
        if branch is not None and name.search(branch["condition"]):
            stop = _loop_exit(context.trace.source_copy(location.file), line)
            return Decision(line, text, assigned["name"], *(stop or (None, "")))
    return None


def decision_fix(where: str, decision: Decision) -> str:
    """Make the branch's decision on the chip, where the read is no longer needed; a decision to end the loop, less
    often."""
    if decision.stop_line is not None:
        stop_at = f"{where.rsplit(':', 1)[0]}:{decision.stop_line}"
        return (f"The value read into `{decision.name}` decides at {where} (`{decision.text}`) whether the loop ends "
                f"(`{decision.stop_text}` at {stop_at}), a decision only the host can take, so the read stays: make "
                f"it less often. Compute the value and check it every N steps (`if step % N == 0:` around the "
                "computation, such as a validation pass, and the check): the loop then stops at most N steps late, "
                "and the host waits once per N steps, not every step.")
    return (f"The value read into `{decision.name}` decides the Python branch at {where} (`{decision.text}`), so the "
            "host waits for it every time: make the decision on the chip, as arithmetic the branch becomes "
            "(`torch.where(condition, a, b)`, `torch.clamp`, or multiplying by the condition as a float), so nothing "
            "is read; or, where the branch must stay in Python, take it every N steps.")


def _loop_exit(copy: str | None, line: int) -> tuple[int, str] | None:
    """The first statement that leaves the loop in the `if` at `line` or in its `elif`/`else` branches (`break`,
    `return`, `raise`, `sys.exit(...)`), not counting loops or functions nested in them; None without one."""
    parsed = parsed_source(copy) if copy else None
    if parsed is None:
        return None
    tree, source = parsed
    branch = next((node for node in ast.walk(tree) if isinstance(node, ast.If) and node.lineno == line), None)
    pending: list[ast.AST] = [*branch.body, *branch.orelse] if branch is not None else []
    # A `return` ends a loop only where the branch is in one in its function (not a custom backward's early return).
    ends = (ast.Break, ast.Return, ast.Raise) if branch is not None and _in_loop(tree, branch) else (ast.Raise,)
    exits: list[ast.stmt] = []
    while pending:
        node = pending.pop()
        if isinstance(node, ends) or (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and _EXITS.match(ast.unparse(node.value.func))):
            exits.append(node)
        elif isinstance(node, ast.stmt) and not isinstance(node, _OWN_SCOPES):
            pending.extend(ast.iter_child_nodes(node))
    first = min(exits, key=lambda node: node.lineno, default=None)
    return None if first is None else (
        first.lineno, (ast.get_source_segment(source, first) or ast.unparse(first)).split("\n", 1)[0])


def _in_loop(tree: ast.Module, branch: ast.If) -> bool:
    """Whether a loop of the branch's own function (or module) holds it."""
    def holds(node: ast.stmt) -> bool:
        return node.lineno < branch.lineno <= (node.end_lineno or node.lineno)

    scopes = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and holds(node)]
    scope: ast.AST = max(scopes, key=lambda node: node.lineno) if scopes else tree
    start = max((node.lineno for node in scopes), default=0)
    return any(isinstance(node, (ast.For, ast.While, ast.AsyncFor)) and holds(node) and node.lineno > start
               for node in ast.walk(scope))


# Statements whose `break` or `return` leaves them, not the loop the read is in.
_OWN_SCOPES = (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


_EXITS = re.compile(r"^(?:sys\.)?exit$|^quit$")

