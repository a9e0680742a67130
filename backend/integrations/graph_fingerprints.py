"""A hashable fingerprint of an FX GraphModule's computation: equal fingerprints, same results.

torch builds the backward of `torch.cond` and `torch.while_loop` as new GraphModules on every call,
so a cache keyed by the branch functions' identity misses on every backward. The fingerprint holds
what a run of the graph depends on: each node's op, target and arguments (literals with their type,
so `1`, `1.0` and `True` differ, and `-0.0` differs from `0.0`), the pytree layout of its inputs and
outputs, the contents of the small host tensors it keeps as attributes (a captured constant), and
the fingerprints of the graphs it calls as submodules. A graph holding anything else as an
attribute or argument (a tpu tensor, a large tensor, an arbitrary object) has no fingerprint.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

MAX_CONSTANT_ELEMENTS = 1 << 16  # a larger captured tensor is not hashed on every call
_LITERAL_TYPES = (bool, int, float, complex, str, type(None))
_TORCH_ATOMS = (torch.dtype, torch.device, torch.layout, torch.memory_format)


class _NoFingerprint(Exception):
    """The graph holds something whose value the fingerprint cannot hold."""


def fingerprint(graph_module: Any) -> Hashable | None:
    """The fingerprint of `graph_module`; None if it is not a GraphModule or holds a value that has none."""
    if not isinstance(graph_module, torch.fx.GraphModule):
        return None
    try:
        return _graph_key(graph_module)
    except _NoFingerprint:
        return None


def fingerprints(functions: Sequence[Any]) -> tuple[Hashable, ...] | None:
    """The fingerprints of all `functions`; None unless each has one."""
    keys = []
    for function in functions:
        key = fingerprint(function)
        if key is None:
            return None
        keys.append(key)
    return tuple(keys)


def _graph_key(graph_module: torch.fx.GraphModule) -> tuple:
    numbers: dict[torch.fx.Node, int] = {}
    nodes = []
    for number, node in enumerate(graph_module.graph.nodes):
        numbers[node] = number
        nodes.append((node.op, _target_key(graph_module, node), _value_key(node.args, numbers), _value_key(node.kwargs, numbers)))
    return (_layout_key(graph_module.graph), tuple(nodes))


def _layout_key(graph: torch.fx.Graph) -> Hashable:
    """How the graph's forward takes and returns its values (a pytree codegen flattens them)."""
    info = getattr(graph._codegen, "pytree_info", None)
    if info is None:
        return type(graph._codegen).__qualname__
    return (type(graph._codegen).__qualname__, tuple(info.orig_args), str(info.in_spec), str(info.out_spec))


def _target_key(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> Hashable:
    if node.op == "call_function":
        try:
            hash(node.target)
        except TypeError:
            raise _NoFingerprint from None
        return node.target
    if node.op in ("get_attr", "call_module"):
        return (node.target, _attribute_key(_attribute(graph_module, str(node.target))))
    return str(node.target)


def _attribute(graph_module: torch.fx.GraphModule, path: str) -> Any:
    value: Any = graph_module
    for name in path.split("."):
        value = getattr(value, name)
    return value


def _attribute_key(value: Any) -> Hashable:
    if isinstance(value, torch.fx.GraphModule):
        return ("graph", _graph_key(value))
    if isinstance(value, torch.Tensor):
        return _constant_key(value)
    raise _NoFingerprint


def _constant_key(tensor: torch.Tensor) -> Hashable:
    """A small host tensor by its metadata and bytes."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.device.type != "cpu" or tensor.numel() > MAX_CONSTANT_ELEMENTS:
        raise _NoFingerprint
    if tensor.is_quantized or tensor.is_sparse or tensor.layout != torch.strided:
        raise _NoFingerprint
    contents = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return ("tensor", tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()), tensor.requires_grad, contents)


def _value_key(value: Any, numbers: dict[torch.fx.Node, int]) -> Hashable:
    if isinstance(value, torch.fx.Node):
        return ("node", numbers[value])
    if isinstance(value, _LITERAL_TYPES):
        return (type(value).__name__, repr(value))
    if isinstance(value, _TORCH_ATOMS):
        return value
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_value_key(item, numbers) for item in value))
    if isinstance(value, dict):
        return ("dict", tuple((name, _value_key(item, numbers)) for name, item in value.items()))
    if isinstance(value, slice):
        return ("slice", _value_key(value.start, numbers), _value_key(value.stop, numbers), _value_key(value.step, numbers))
    if value is Ellipsis:
        return "..."
    raise _NoFingerprint
