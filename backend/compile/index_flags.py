"""Index checks inside a `torch.compile(backend="tpu")` program, as eager mode makes them (`index_checks`).

Each checked op of the graph (`embedding`, `gather`, `x[idx]`, the scatters, `nll_loss`'s target, ...)
folds "an index is out of range" into one int32 that the program returns beside its outputs: 0, or
the site of the first such op, named by the op and the line the node was traced from. The graph's
caller hands it to `index_checks.note_flag`, so the next host read raises that site's error, as it
does for an eager op. A check's ranges come from the program's concrete shapes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import torch
import torch.fx

from tputrace import sourceloc
from tputrace.backend.indexing import index_checks


class CheckedNode(NamedTuple):
    """A graph node whose values are checked: its rule, op name and traced user line."""

    rule: index_checks.Rule
    op_name: str
    filename: str | None
    line: int


class _Traced:
    """A traced array as a check's rule reads an argument: shape, `dim()`, `numel()` and torch dtype."""

    __slots__ = ("value", "shape", "dtype")

    def __init__(self, value: Any, dtype: torch.dtype) -> None:
        self.value = value
        self.shape = tuple(value.shape)
        self.dtype = dtype

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


def checked_nodes(nodes: list[torch.fx.Node]) -> dict[torch.fx.Node, CheckedNode]:
    """The nodes whose indices or values are checked (none when `TPUTRACE_INDEX_CHECKS=0`)."""
    if not index_checks.enabled:
        return {}
    checked = {}
    for node in nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        rule = index_checks.rule_of(node.target)
        if rule is None:
            continue
        location = sourceloc.last_user_location(node.stack_trace)
        filename, line = (location[0], location[1]) if location is not None else (None, 0)
        checked[node] = CheckedNode(rule, str(node.target.overloadpacket), filename, line)
    return checked


def fold(flag: Any, check: CheckedNode, node: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> Any:
    """`flag` (a traced int32, or None before the first check) with this node's site folded in where
    one of its checked values fails; None still when the call checks nothing (an empty index)."""
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda arg: _argument(arg, env))
    bounded = [(value, rule) for value, rule in check.rule(args, kwargs) if type(value) is _Traced and value.numel()]
    if not bounded:
        return flag
    site = index_checks.site_at(check.op_name, check.filename, check.line, tuple(rule for _, rule in bounded))
    outside = jnp.zeros((), jnp.bool_)
    for value, rule in bounded:
        outside = outside | index_checks.refused(value.value, rule)
    return index_checks.folded(jnp.zeros((), jnp.int32) if flag is None else flag, outside, site)


def _argument(node: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> Any:
    value = env.get(node)
    fake = node.meta.get("val")
    if isinstance(fake, torch.Tensor) and hasattr(value, "shape"):
        return _Traced(value, fake.dtype)
    return value
