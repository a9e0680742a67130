"""Which loop a line's read of a value reads the elements of, from the syntax tree of the run's copy of the source: a
read (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `float(...)`, `int(...)`, `bool(...)`) of a loop's variable, in a
comprehension (`[s.item() for s in scores]`, `{k: v.item() for k, v in metrics.items()}`) or a `for` statement
(`for x in losses:` then `total += x.item()`), or of a tensor indexed by a loop over a range (`t[i].item()`). Names,
containers and layout are the script's own: nothing here matches one script's spelling."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from typing import Literal

from tputrace.analysis.call_sites import parsed_source

_READ_METHODS = frozenset({"item", "tolist", "cpu", "numpy"})
_READ_CALLS = frozenset({"float", "int", "bool"})
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)
Container = Literal["tensor", "sequence", "dict"]


@dataclass(frozen=True)
class ElementLoop:
    """A read, `read` (`.item()`, `float(...)`), of each element of `source` in turn.

    `container` is `tensor` where the elements are taken by index from a tensor, `dict` for a dict's values, else
    `sequence` (a list of tensors, or a tensor iterated by rows: the ops the trace records at `header_lines` tell).
    `element` is the value read, in terms of `variable` (`t`, `t.mean()`); `header_lines` the lines of the `for`
    statement's header or of the comprehension, whose ops take the elements out; `loop_line` the `for` statement's
    line, None for a comprehension; `loop` the loop's clauses as written (`for i in range(n)`, with a comprehension's
    other `for` and `if` clauses, whose presence `filtered` says); `sums`: the reads are added up (`total += x.item()`,
    `sum(x.item() for ...)`)."""

    source: str
    read: str
    container: Container
    element: str
    variable: str
    header_lines: range
    loop_line: int | None
    loop: str
    filtered: bool
    sums: bool


def element_loop(path: str, line: int) -> ElementLoop | None:
    """The loop whose elements the reads at `line` of the file copy at `path` read one at a time, else None."""
    parsed = parsed_source(path)
    if parsed is None:
        return None
    parents = _parents(path)
    reads = [node for node in parents if isinstance(node, ast.Call) and _read_name(node) is not None
             and node.lineno <= line <= (node.end_lineno or node.lineno)]
    reads.sort(key=lambda node: (node.lineno != line, node.col_offset))
    return next((found for node in reads if (found := _loop_of(node, parents)) is not None), None)


@functools.lru_cache(maxsize=16)
def _parents(path: str) -> dict[ast.AST, ast.AST]:
    """Each node of the file's syntax tree, and the node that holds it."""
    parsed = parsed_source(path)
    if parsed is None:
        return {}
    return {child: node for node in ast.walk(parsed[0]) for child in ast.iter_child_nodes(node)}


def _read_name(call: ast.Call) -> str | None:
    """`.item()`, `float(...)`: how `call` reads a value to the host, None for another call."""
    if isinstance(call.func, ast.Attribute) and call.func.attr in _READ_METHODS and not call.args:
        return f".{call.func.attr}()"
    if isinstance(call.func, ast.Name) and call.func.id in _READ_CALLS and len(call.args) == 1 and not call.keywords:
        return f"{call.func.id}(...)"
    return None


def _read_value(call: ast.Call) -> ast.expr:
    """The value a read call reads: `x` of `x.item()` and of `float(x)`."""
    return call.func.value if isinstance(call.func, ast.Attribute) else call.args[0]


def _root(value: ast.expr) -> ast.expr:
    """What a chain of attributes and method calls starts from: `t` for `t.float().mean()`."""
    while True:
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
            value = value.func.value
        elif isinstance(value, ast.Attribute):
            value = value.value
        else:
            return value


def _loop_of(call: ast.Call, parents: dict[ast.AST, ast.AST]) -> ElementLoop | None:
    """The loop whose variable the read `call` reads (or indexes a tensor by), within the read's own function."""
    value = _read_value(call)
    root = _root(value)
    indexed = root.value if isinstance(root, ast.Subscript) and isinstance(root.slice, ast.Name) else None
    name = (root.slice.id if isinstance(root, ast.Subscript) and isinstance(root.slice, ast.Name) else
            root.id if isinstance(root, ast.Name) else None)
    read = _read_name(call)
    if name is None or read is None:
        return None
    node: ast.AST = call
    while not isinstance(node, _SCOPES) and node in parents:
        holder = parents[node]
        for target, iterable, header in _bindings(holder, node):
            bound = _bound(target, iterable, name)
            if bound is None:
                continue
            header_lines = range(header.lineno, (header.end_lineno or header.lineno) + 1)
            loop_line = holder.lineno if isinstance(holder, (ast.For, ast.AsyncFor)) else None
            sums = _sums(call, holder, parents)
            names = ", ".join(map(ast.unparse, target.elts)) if isinstance(target, ast.Tuple) else ast.unparse(target)
            clauses = holder.generators if isinstance(holder, _COMPREHENSIONS) else []
            filtered = len(clauses) > 1 or any(clause.ifs for clause in clauses)
            loop = (" ".join(ast.unparse(clause).strip() for clause in clauses) if filtered
                    else f"for {names} in {ast.unparse(iterable)}")
            if indexed is not None:
                if not (isinstance(bound, ast.Call) and isinstance(bound.func, ast.Name) and bound.func.id == "range"):
                    return None
                return ElementLoop(ast.unparse(indexed), read, "tensor", ast.unparse(value), name, header_lines,
                                   loop_line, loop, filtered, sums)
            container, source = _container(bound)
            return ElementLoop(source, read, container, ast.unparse(value), name, header_lines, loop_line, loop,
                               filtered, sums)
        node = holder
    return None


def _bindings(holder: ast.AST, child: ast.AST) -> list[tuple[ast.expr, ast.expr, ast.expr]]:
    """(target, iterable, header) of the loops `holder` runs `child` in: a `for` statement's body, or the
    generators of a comprehension whose element (its key or value) is `child`."""
    if isinstance(holder, (ast.For, ast.AsyncFor)) and child in holder.body:
        return [(holder.target, holder.iter, holder.iter)]
    if isinstance(holder, _COMPREHENSIONS) and not isinstance(child, ast.comprehension):
        return [(generator.target, generator.iter, holder) for generator in holder.generators]
    return []


def _bound(target: ast.expr, iterable: ast.expr, name: str) -> ast.expr | None:
    """What `name` takes its values from, where a loop binds it by `target` over `iterable`: the iterable itself,
    the second argument of `enumerate`, the dict of `.items()`, or `zip`'s argument in its place; else None."""
    if isinstance(target, ast.Name):
        return iterable if target.id == name else None
    if not isinstance(target, (ast.Tuple, ast.List)):
        return None
    names = [element.id if isinstance(element, ast.Name) else None for element in target.elts]
    if name not in names:
        return None
    position = names.index(name)
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name):
        if iterable.func.id == "enumerate" and len(names) == 2 and position == 1 and iterable.args:
            return iterable.args[0]
        if iterable.func.id == "zip" and len(iterable.args) == len(names):
            return iterable.args[position]
    if (isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute) and iterable.func.attr == "items"
            and not iterable.args and len(names) == 2 and position == 1):
        return iterable  # a dict's values, by `.items()`
    return None


def _container(iterable: ast.expr) -> tuple[Container, str]:
    """What the elements come from: a dict's values (`d.items()`, `d.values()`), a tensor's rows (`t.unbind()`),
    else the iterable as written (a list of tensors, or a tensor)."""
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute) and not iterable.args:
        if iterable.func.attr in ("items", "values"):
            return "dict", ast.unparse(iterable.func.value)
    if (isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute) and iterable.func.attr == "unbind"
            and all(isinstance(arg, ast.Constant) and arg.value == 0 for arg in iterable.args)):
        return "tensor", ast.unparse(iterable.func.value)
    return "sequence", ast.unparse(iterable)


def _sums(call: ast.Call, loop: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether the reads are added up: the read's statement adds into a total in a `for` loop, or a comprehension's
    values go to `sum(...)`."""
    if isinstance(loop, _COMPREHENSIONS):
        holder = parents.get(loop)
        return isinstance(holder, ast.Call) and isinstance(holder.func, ast.Name) and holder.func.id == "sum"
    node: ast.AST = call
    while not isinstance(node, ast.stmt) and node in parents:
        node = parents[node]
    if isinstance(node, ast.AugAssign):
        return isinstance(node.op, ast.Add)
    return (isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Add)
            and len(node.targets) == 1 and ast.unparse(node.value.left) == ast.unparse(node.targets[0]))
