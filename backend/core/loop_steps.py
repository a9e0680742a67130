"""Whether an optimizer that has not stepped yet is stepped later in a loop around the current `optimizer.step()` call.

An iteration of a WGAN's loop steps the critic's optimizer several times in an inner loop, then the generator's once.
In the first iteration, before the generator's optimizer has ever stepped, its `opt_g.step()` (or
`scaler.step(opt_g)`) is found in the source of the caller's function, inside a loop that encloses the critic's step:
the critic's repeated steps are then the iteration's inner loop, not a new training phase. The names in the call are
resolved in the caller's frame (plain names and attribute chains, as `self.opt_g`); nothing is evaluated.
"""

from __future__ import annotations

import ast
import functools
import linecache
import sys
import types
from collections.abc import Iterable
from typing import Any

from tputrace import sourceloc

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def stepped_later_in_loop(waiting: Iterable[Any]) -> bool:
    """Whether one of the `waiting` optimizers is stepped in a loop around the user's current line, outside the
    innermost loop around it (there it would have stepped already, as a head's optimizer stepping alone for some
    epochs before a backbone's joins it in the same loop): by a step call naming it, or by a call given it (a
    `train_generator(G, opt_g)`). A step made in a helper function is looked for from the line calling the helper."""
    waiting_ids = {id(optimizer) for optimizer in waiting}
    if not waiting_ids:
        return False
    for frame in _user_frames():
        loops = _enclosing_loops(frame.f_code.co_filename, frame.f_lineno)
        if len(loops) < 2:
            continue
        innermost = loops[-1]
        return any(
            not _spans(innermost, call.lineno) and any(id(value) in waiting_ids for value in _resolved(call, frame))
            for loop in loops[:-1] for call in _calls(loop)
        )
    return False


def stepped_in_inner_loop(waiting: Iterable[Any]) -> bool:
    """Whether one of the `waiting` optimizers is stepped (or given to a call) in a loop nested inside the innermost
    loop around the user's current line: a generator's step before its critic's inner loop."""
    waiting_ids = {id(optimizer) for optimizer in waiting}
    if not waiting_ids:
        return False
    for frame in _user_frames():
        loops = _enclosing_loops(frame.f_code.co_filename, frame.f_lineno)
        if not loops:
            continue
        inner_loops = [node for node in ast.walk(loops[-1]) if isinstance(node, _LOOPS) and node is not loops[-1]]
        return any(any(id(value) in waiting_ids for value in _resolved(call, frame))
                   for loop in inner_loops for call in _calls(loop))
    return False


def stepped_conditionally(waiting: Iterable[Any]) -> bool:
    """Whether the `waiting` optimizers are stepped, in the innermost loop around the user's current line, only under
    an `if` that does not hold that line (`if step % 2 == 0: opt_body.step()`): they step in some iterations only, so
    the iteration does not wait for them."""
    waiting_ids = {id(optimizer) for optimizer in waiting}
    if not waiting_ids:
        return False
    for frame in _user_frames():
        line = frame.f_lineno
        loops = _enclosing_loops(frame.f_code.co_filename, line)
        if not loops:
            continue
        naming = [(call, ancestors) for call, ancestors in _calls_with_ancestors(loops[-1])
                  if any(id(value) in waiting_ids for value in _resolved(call, frame))]
        return bool(naming) and all(
            any(isinstance(node, ast.If) and not _spans(node, line) for node in ancestors) for _, ancestors in naming)
    return False


def stepped_in_other_loops(waiting: Iterable[Any]) -> bool:
    """Whether the `waiting` optimizers are stepped only where the loops around the user's current line do not reach:
    each call stepping them (or given them) in the line's function is outside those loops, or inside a loop of its
    own that does not hold the line (a warm-up loop stepping one optimizer, then a loop stepping another). Nothing is
    concluded from a function that names them nowhere (a helper stepping a global optimizer)."""
    waiting_ids = {id(optimizer) for optimizer in waiting}
    if not waiting_ids:
        return False
    for frame in _user_frames():
        line = frame.f_lineno
        scope, loops = _scope_and_loops(frame.f_code.co_filename, line)
        if scope is None or not loops:
            continue
        naming = [(call, ancestors) for call, ancestors in _calls_with_ancestors(scope)
                  if any(id(value) in waiting_ids for value in _resolved(call, frame))]
        if not naming:
            continue
        return all(
            not _spans(loops[-1], call.lineno)
            and (not _spans(loops[0], call.lineno)
                 or any(isinstance(node, _LOOPS) and not _spans(node, line) for node in ancestors))
            for call, ancestors in naming)
    return False


def _user_frames(limit: int = 4) -> list[types.FrameType]:
    """The user's frames around the current call, innermost first (up to `limit`, and none past code with no file)."""
    roots = sourceloc.library_roots()
    frames: list[types.FrameType] = []
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and len(frames) < limit:
        if sourceloc.is_user_file(frame.f_code.co_filename, roots):
            if frame.f_code.co_filename.startswith("<"):
                break
            frames.append(frame)
        frame = frame.f_back
    return frames


@functools.lru_cache(maxsize=64)
def _tree(filename: str) -> ast.Module | None:
    source = "".join(linecache.getlines(filename))
    try:
        return ast.parse(source, filename) if source else None
    except (SyntaxError, ValueError):
        return None


def _enclosing_loops(filename: str, line: int) -> list[ast.AST]:
    """The loops around `line` inside its own function (or the module), outermost first."""
    return _scope_and_loops(filename, line)[1]


def _scope_and_loops(filename: str, line: int) -> tuple[ast.AST | None, list[ast.AST]]:
    """The function (or module) that holds `line`, and the loops around the line inside it, outermost first."""
    tree = _tree(filename)
    if tree is None:
        return None, []
    scope: ast.AST = tree
    loops: list[ast.AST] = []
    node: ast.AST = tree
    while True:
        inner = next((child for child in ast.iter_child_nodes(node) if _spans(child, line)), None)
        if inner is None:
            return scope, loops
        if isinstance(inner, _SCOPES):
            scope, loops = inner, []
        elif isinstance(inner, _LOOPS):
            loops.append(inner)
        node = inner


def _spans(node: ast.AST, line: int) -> bool:
    start = getattr(node, "lineno", None)
    end = getattr(node, "end_lineno", None)
    return start is not None and end is not None and start <= line <= end


def _calls(loop: ast.AST) -> list[ast.Call]:
    """The calls in the loop's body, not inside a function defined there."""
    calls: list[ast.Call] = []
    pending = list(ast.iter_child_nodes(loop))
    while pending:
        node = pending.pop()
        if isinstance(node, _SCOPES):
            continue
        if isinstance(node, ast.Call):
            calls.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return calls


def _calls_with_ancestors(root: ast.AST) -> list[tuple[ast.Call, tuple[ast.AST, ...]]]:
    """The calls under `root`, not inside a function defined there, each with the nodes between `root` and it."""
    found: list[tuple[ast.Call, tuple[ast.AST, ...]]] = []
    pending: list[tuple[ast.AST, tuple[ast.AST, ...]]] = [(child, ()) for child in ast.iter_child_nodes(root)]
    while pending:
        node, ancestors = pending.pop()
        if isinstance(node, _SCOPES):
            continue
        if isinstance(node, ast.Call):
            found.append((node, ancestors))
        pending.extend((child, (*ancestors, node)) for child in ast.iter_child_nodes(node))
    return found


def _resolved(call: ast.Call, frame: types.FrameType) -> list[Any]:
    """The objects a call names as an optimizer: a step's receiver (`opt.step()`) and first argument
    (`scaler.step(opt)`), another call's arguments (`train_generator(G, opt_g)`)."""
    if isinstance(call.func, ast.Attribute) and call.func.attr == "step":
        expressions = [call.func.value, *call.args[:1]]
    else:
        expressions = [*call.args, *(keyword.value for keyword in call.keywords)]
    values = []
    for expression in expressions:
        value = _lookup(expression, frame)
        if value is not None:
            values.append(value)
    return values


def _lookup(expression: ast.expr, frame: types.FrameType) -> Any:
    if isinstance(expression, ast.Name):
        if expression.id in frame.f_locals:
            return frame.f_locals[expression.id]
        return frame.f_globals.get(expression.id)
    if isinstance(expression, ast.Attribute):
        owner = _lookup(expression.value, frame)
        if owner is None:
            return None
        try:
            return getattr(owner, expression.attr, None)
        except Exception:  # a property that raises names nothing
            return None
    return None
