"""Which loop a line's read of a value reads the elements of, from the syntax tree of the run's copy of the source: a
read (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `float(...)`, `int(...)`, `bool(...)`) of a loop's variable, in a
comprehension (`[s.item() for s in scores]`, `{k: v.item() for k, v in metrics.items()}`) or a `for` statement
(`for x in losses:` then `total += x.item()`), or of a tensor indexed by a loop over a range (`t[i].item()`). Names,
containers and layout are the script's own: nothing here matches one script's spelling."""

from __future__ import annotations

import ast
import copy
import functools
from dataclasses import dataclass
from typing import Literal

from tputrace.analysis.call_sites import parsed_source

_READ_METHODS = frozenset({"item", "tolist", "cpu", "numpy"})
_READ_CALLS = frozenset({"float", "int", "bool"})
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)
Container = Literal["tensor", "sequence", "dict"]
VALUES = "{values}"  # in a host loop, where the values read once go


@dataclass(frozen=True)
class ElementLoop:
    """A read, `read` (`.item()`, `float(...)`), of each element of `source` in turn.

    `container` is `tensor` where the elements are taken by index from a tensor, `dict` for a dict's values, else
    `sequence` (a list of tensors, or a tensor iterated by rows: the ops the trace records at `header_lines` tell).
    `element` is the value read, in terms of `variable` (`t`, `t.mean()`); `header_lines` the lines of the `for`
    statement's header or of the comprehension, whose ops take the elements out; `loop_line` the `for` statement's
    line, None for a comprehension; `loop` the loop's clauses as written (`for i in range(n)`, with a comprehension's
    other `for` and `if` clauses, whose presence `filtered` says); `sums`: the reads are added up (`total += x.item()`,
    `sum(x.item() for ...)`), where `element` is what is added with the reads left out (`x * y` of `total +=
    x.item() * y.item()`); `unpacked`: the loop unpacks each element of `source` into its variables (`for x, y in
    pairs`), so `variable` holds a part of one; `host_loop` a `for` statement's header with `source` read once in its
    place (`for i, row in enumerate({values})`), None for a comprehension."""

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
    unpacked: bool = False
    host_loop: str | None = None


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
    names = ([root.slice.id] if isinstance(root, ast.Subscript) and isinstance(root.slice, ast.Name) else
             [root.id] if isinstance(root, ast.Name) else
             # arithmetic on the loop's variables: `(a * b).sum()`, not a call such as `model(x)`
             list(dict.fromkeys(node.id for node in ast.walk(root) if isinstance(node, ast.Name)))
             if isinstance(root, (ast.BinOp, ast.UnaryOp)) and not any(isinstance(node, ast.Call) for node in ast.walk(root))
             else [])
    read = _read_name(call)
    if not names or read is None:
        return None
    node: ast.AST = call
    while not isinstance(node, _SCOPES) and node in parents:
        holder = parents[node]
        for target, iterable, header in _bindings(holder, node):
            binding = next(((name, found) for name in names if (found := _bound(target, iterable, name)) is not None),
                           None)
            if binding is None:
                continue
            name, (bound, unpacked) = binding
            header_lines = range(header.lineno, (header.end_lineno or header.lineno) + 1)
            is_for = isinstance(holder, (ast.For, ast.AsyncFor))
            loop_line = holder.lineno if isinstance(holder, (ast.For, ast.AsyncFor)) else None
            added = _added(call, holder, parents)
            element = ast.unparse(_without_reads(added)) if added is not None and not indexed else ast.unparse(value)
            clauses = holder.generators if isinstance(holder, _COMPREHENSIONS) else []
            filtered = len(clauses) > 1 or any(clause.ifs for clause in clauses)
            loop = (" ".join(ast.unparse(clause).strip() for clause in clauses) if filtered
                    else f"for {_target_text(target)} in {ast.unparse(iterable)}")
            if indexed is not None:
                if not (isinstance(bound, ast.Call) and isinstance(bound.func, ast.Name) and bound.func.id == "range"):
                    return None
                return ElementLoop(ast.unparse(indexed), read, "tensor", ast.unparse(value), name, header_lines,
                                   loop_line, loop, filtered, added is not None)
            container, source = _container(bound)
            host_loop = _host_loop(target, iterable, bound) if is_for else None
            return ElementLoop(source, read, container, element, name, header_lines, loop_line, loop, filtered,
                               added is not None, unpacked, host_loop)
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


def _bound(target: ast.expr, iterable: ast.expr, name: str) -> tuple[ast.expr, bool] | None:
    """What `name` takes its values from, where a loop binds it by `target` over `iterable` (the iterable itself, the
    second argument of `enumerate`, the dict of `.items()`, or `zip`'s argument in its place, nested as the target
    nests), and whether each of those values is unpacked into the target's names (`for x, y in pairs`, `for first,
    *rest in rows`); else None."""
    if isinstance(target, ast.Name):
        return (iterable, False) if target.id == name else None
    if isinstance(target, ast.Starred):
        return _bound(target.value, iterable, name)
    if not isinstance(target, (ast.Tuple, ast.List)) or not _binds(target, name):
        return None
    parts = target.elts
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and not iterable.keywords:
        if iterable.func.id == "enumerate" and len(parts) == 2 and len(iterable.args) == 1:
            return _bound(parts[1], iterable.args[0], name) if _binds(parts[1], name) else None
        if iterable.func.id == "zip" and len(iterable.args) == len(parts) and not any(
                isinstance(part, ast.Starred) for part in parts):
            return next(_bound(part, arg, name) for part, arg in zip(parts, iterable.args) if _binds(part, name))
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute) and iterable.func.attr == "items" \
            and not iterable.args:
        if len(parts) == 2 and isinstance(parts[1], ast.Name) and parts[1].id == name:
            return iterable, False  # a dict's values, by `.items()`
        return None
    return iterable, True


def _binds(target: ast.expr, name: str) -> bool:
    """Whether the loop target `target` binds `name`."""
    return any(isinstance(node, ast.Name) and node.id == name for node in ast.walk(target))


def _host_loop(target: ast.expr, iterable: ast.expr, source: ast.expr) -> str:
    """The `for` header `for target in iterable`, with `source` (a part of `iterable`) in place of `VALUES`, where the
    values read to the host once go."""
    place = (source.lineno, source.col_offset, source.end_lineno, source.end_col_offset)

    class _ReadOnce(ast.NodeTransformer):
        def visit(self, node: ast.AST) -> ast.AST:
            if (getattr(node, "lineno", None), getattr(node, "col_offset", None), getattr(node, "end_lineno", None),
                    getattr(node, "end_col_offset", None)) == place and isinstance(node, ast.expr):
                return ast.Name(VALUES, ast.Load())
            visited: ast.AST = super().visit(node)
            return visited

    read_once: ast.AST = _ReadOnce().visit(copy.deepcopy(iterable))
    return f"for {_target_text(target)} in {ast.unparse(read_once)}"


def _target_text(target: ast.expr) -> str:
    """A loop target as its `for` statement writes it: `i, (x, y)`."""
    text = ast.unparse(target)
    return text[1:-1] if isinstance(target, ast.Tuple) and text.startswith("(") else text


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


def _added(call: ast.Call, loop: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.expr | None:
    """What the reads add up, where they are added up (the read's statement adds into a total in a `for` loop, or a
    comprehension's values go to `sum(...)`): the value added (`x.item() * y.item()`); else None."""
    if isinstance(loop, _COMPREHENSIONS):
        holder = parents.get(loop)
        summed = isinstance(holder, ast.Call) and isinstance(holder.func, ast.Name) and holder.func.id == "sum"
        return loop.elt if summed and isinstance(loop, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) else None
    node: ast.AST = call
    while not isinstance(node, ast.stmt) and node in parents:
        node = parents[node]
    if isinstance(node, ast.AugAssign):
        return node.value if isinstance(node.op, ast.Add) else None
    if (isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Add)
            and len(node.targets) == 1 and ast.unparse(node.value.left) == ast.unparse(node.targets[0])):
        return node.value.right
    return None


def _without_reads(value: ast.expr) -> ast.expr:
    """`value` with each read in it (`x.item()`, `float(y)`) replaced by what it reads: the value kept on the chip."""

    class _Unread(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.AST:
            self.generic_visit(node)
            return _read_value(node) if _read_name(node) is not None else node

    unread: ast.expr = _Unread().visit(copy.deepcopy(value))
    return unread
