"""What a graph does with each Python int it takes as an input, for the trace: the fix for an int that compiles the
graph again at each value depends on it.

- `length`: the int sets a size in the graph (a slice's end, `torch.arange(n)`, a view's shape): some value in the
  graph has a dim made of it.
- `position`: the int picks where the graph reads or writes (a slice's start, `select`'s index, `narrow`'s start)
  without setting a size.
- `value`: the int is only arithmetic (a step counter in a schedule, a scale).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

# The ops whose int arguments pick a place in a tensor, by the names of those arguments.
_POSITION_ARGS = {"start", "index", "offset", "storage_offset", "dim_index", "indices"}


def int_uses(aot_gm: torch.fx.GraphModule) -> dict[int, str]:
    """Per placeholder index of an int input the graph uses: `length`, `position` or `value`."""
    placeholders = [node for node in aot_gm.graph.nodes if node.op == "placeholder"]
    uses: dict[int, str] = {}
    for index, node in enumerate(placeholders):
        value = node.meta.get("val")
        if not isinstance(value, torch.SymInt) or not node.users:
            continue
        symbols = value.node.expr.free_symbols
        if not symbols:
            continue
        if _sets_a_size(aot_gm, symbols):
            uses[index] = "length"
        elif _picks_a_place(node):
            uses[index] = "position"
        else:
            uses[index] = "value"
    return uses


def _dims(value: Any) -> list[Any]:
    """The sizes of a node's value (a tensor, or tensors in a tuple or list)."""
    if isinstance(value, torch.Tensor):
        return list(value.shape)
    if isinstance(value, (tuple, list)):
        return [size for item in value for size in _dims(item)]
    return []


def _sets_a_size(aot_gm: torch.fx.GraphModule, symbols: set[Any]) -> bool:
    for node in aot_gm.graph.nodes:
        for size in _dims(node.meta.get("val")):
            if isinstance(size, torch.SymInt) and size.node.expr.free_symbols & symbols:
                return True
    return False


def _picks_a_place(node: torch.fx.Node) -> bool:
    """Whether the int, or a sum made of it, is an argument that picks a place (a start, an index) of some op."""
    seen: set[torch.fx.Node] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for user in current.users:
            if user.op != "call_function":
                continue
            schema = getattr(user.target, "_schema", None)
            if schema is None:  # sym arithmetic (operator.add): follow the sum
                pending.append(user)
                continue
            for argument, passed in zip(schema.arguments, user.args):
                if passed is current and argument.name in _POSITION_ARGS:
                    return True
            if any(passed is current and name in _POSITION_ARGS for name, passed in user.kwargs.items()):
                return True
    return False
