"""The line that keeps a value a loop made: `scores.append(score)` after `score = ...` in the same loop body.

A value kept across iterations dispatches no op where it is kept (appending to a list runs no tensor op), so the
trace names only the line that made it. The run's copy of the file (`Trace.source_copy`) tells the rest: the
statement at that line binds a name, and a later statement of the same loop body passes that name to a container
(`.append(...)`, `.extend(...)`, `.add(...)`, `+= [...]`, `history[i] = ...`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from tputrace.analysis.call_sites import SourceCopies, parsed_source

_TO_PYTHON = frozenset({"float", "int", "bool", "str", "repr", "len"})  # calls that keep no tensor
_KEEPING_METHODS = frozenset({"append", "extend", "add", "insert", "appendleft", "put", "setdefault", "update"})
# Methods whose result still holds the value's data on the chip (without its graph, for `detach`).
_SAME_DATA_METHODS = frozenset({"detach", "clone", "contiguous", "float", "half", "bfloat16", "view", "reshape",
                                "flatten", "squeeze", "unsqueeze"})


@dataclass(frozen=True)
class KeepingLine:
    """Where a value made at another line is kept: its line and source text."""

    line: int
    text: str


def keeping_line(copies: SourceCopies, file: str | None, line: int | None, *, data_too: bool = False) -> KeepingLine | None:
    """The first later statement in the loop body around `line` that keeps the name `line` assigns; None when the
    run's copy of `file` is not here, the line assigns no name, or no statement of its loop keeps it. With
    `data_too`, keeping `name.detach()` (or a copy or view of it) counts: it keeps the value's buffer."""
    if file is None or line is None:
        return None
    copy = copies.source_copy(file)
    if copy is None:
        return None
    parsed = parsed_source(copy)
    if parsed is None:
        return None
    tree, source = parsed
    loop = _innermost_loop(tree, line)
    if loop is None:
        return None
    names = _assigned_names(loop, line)
    if not names:
        return None
    for statement in _statements(loop.body):
        if statement.lineno > line and _keeps(statement, names, data_too):
            text = ast.get_source_segment(source, statement) or ""
            return KeepingLine(statement.lineno, " ".join(text.split()))
    return None



def _innermost_loop(tree: ast.AST, line: int) -> ast.For | ast.While | ast.AsyncFor | None:
    found = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)) and node.lineno < line <= (node.end_lineno or node.lineno):
            if found is None or node.lineno > found.lineno:
                found = node
    return found


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of a body and of its `if`/`with`/`try` blocks (not of nested functions), in source order."""
    out: list[ast.stmt] = []
    for statement in body:
        out.append(statement)
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(statement, field, None)
            if isinstance(inner, list) and not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.extend(_statements(inner))
        for handler in getattr(statement, "handlers", []):
            out.extend(_statements(handler.body))
    return sorted(out, key=lambda statement: statement.lineno)


def _assigned_names(loop: ast.AST, line: int) -> set[str]:
    """The plain names the statement at `line` binds (`score = ...`, `a, b = ...`, `x += ...`)."""
    for statement in _statements(getattr(loop, "body", [])):
        if not statement.lineno <= line <= (statement.end_lineno or statement.lineno):
            continue
        targets: list[ast.expr] = []
        if isinstance(statement, ast.Assign):
            targets = list(statement.targets)
        elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
            targets = [statement.target]
        return {node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name)}
    return set()


def _keeps(statement: ast.stmt, names: set[str], data_too: bool = False) -> bool:
    """Whether `statement` puts one of `names` into a container."""
    for node in ast.walk(statement):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _KEEPING_METHODS:
            if _mentions([*node.args, *(keyword.value for keyword in node.keywords)], names, data_too):
                return True
    if isinstance(statement, ast.AugAssign) and isinstance(statement.op, ast.Add) and isinstance(statement.value, (ast.List, ast.Tuple)):
        return _mentions([statement.value], names, data_too)
    if isinstance(statement, ast.Assign) and any(isinstance(target, ast.Subscript) for target in statement.targets):
        return _mentions([statement.value], names, data_too)
    return False


def _mentions(expressions: list[ast.expr], names: set[str], data_too: bool = False) -> bool:
    """Whether a name is used as a whole value (`score`, `(d_loss, score)`), not only read from (`score.item()`)."""
    for expression in expressions:
        parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(expression):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for node in ast.walk(expression):
            if isinstance(node, ast.Name) and node.id in names:
                parent = parents.get(node)
                if data_too and isinstance(parent, ast.Attribute) and parent.attr in _SAME_DATA_METHODS:
                    return True
                if isinstance(parent, ast.Attribute) or (isinstance(parent, ast.Call) and (
                        node is parent.func or (isinstance(parent.func, ast.Name) and parent.func.id in _TO_PYTHON))):
                    continue
                return True
    return False
