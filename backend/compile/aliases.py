"""Graph outputs that are views: handed back as views of their base, as eager torch hands them back.

An XLA program returns each output as a fresh array. An output that the graph computes as a view
(`y.view(-1)`, `x[::2]`, `y.t()`) must still see its base: AOTAutograd regenerates an alias of an
input from the strides and storage offset of the output it gets (`gen_alias_from_base`), and for
tpu tensors (a tensor subclass) it leaves outputs that alias each other to the backend. So each such
output is rebuilt at run time by replaying its view ops on its base: the runtime input, another
output, or the base's value returned as an extra result of the program. Outputs the user never sees
(activations saved for the backward, gradients) stay fresh arrays: no view ops to replay per call.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

OpOverload = torch._ops.OpOverload


@dataclass(frozen=True)
class ViewChain:
    """Output `output` is `steps` (view nodes, base first) applied to `root`."""

    output: int
    root: torch.fx.Node
    steps: tuple[torch.fx.Node, ...]


@dataclass(frozen=True)
class OutputAlias:
    """How to rebuild one output at run time: replay `steps` ((op, args, kwargs) with concrete
    arguments after the tensor) on the base: runtime input `index` (`kind` "input"), output `index`
    ("output"), or program result `index` ("result", the base's value as an extra result)."""

    kind: str
    index: int
    steps: tuple[tuple[Any, tuple, dict], ...]


def _is_view_step(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if isinstance(node.target, OpOverload):
        return node.target.is_view
    # One result of a multi-output view (`split`, `unbind`).
    return node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) and _is_view_step(node.args[0])


# AOTAutograd's descriptions of graph outputs that only the backward or autograd reads.
_INTERNAL_OUTPUTS = frozenset({"SavedForBackwardsAOTOutput", "SavedForBackwardsNoVcCheckAOTOutput", "GradAOTOutput"})


def _user_visible(desc: Any) -> bool:
    while type(desc).__name__ == "SubclassGetAttrAOTOutput":
        desc = desc.base
    return desc is None or type(desc).__name__ not in _INTERNAL_OUTPUTS


def view_chains(output_args: Sequence[Any], descs: Sequence[Any] | None = None) -> list[ViewChain]:
    """The user-visible outputs computed as views, each with the chain of view nodes back to its
    base; `descs` are AOTAutograd's descriptions of the outputs (the output node's `desc`)."""
    chains = []
    for index, output in enumerate(output_args):
        if not isinstance(output, torch.fx.Node) or not _is_view_step(output):
            continue
        if descs is not None and index < len(descs) and not _user_visible(descs[index]):
            continue
        steps = []
        node = output
        while _is_view_step(node):
            steps.append(node)
            node = node.args[0]
        if not isinstance(node, torch.fx.Node):
            continue
        chains.append(ViewChain(index, node, tuple(reversed(steps))))
    return chains


def concrete_steps(chain: ViewChain, env: dict[torch.fx.Node, Any]) -> tuple[tuple[Any, tuple, dict], ...] | None:
    """The chain's ops with their non-tensor arguments as traced for this program (sizes are Python
    ints then); None when an argument is not a plain value."""
    steps = []
    for node in chain.steps:
        rest = torch.fx.node.map_arg(node.args[1:], env.__getitem__)
        kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
        if not _plain((rest, kwargs)):
            return None
        steps.append((node.target, tuple(rest), dict(kwargs)))
    return tuple(steps)


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(_plain(item) for item in value.values())
    return value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, torch.memory_format, torch.layout))


def replay(base: torch.Tensor, steps: Sequence[tuple[Any, tuple, dict]]) -> torch.Tensor:
    """The view of `base` the steps describe (a real view: writes through either reach the other)."""
    value: Any = base
    for op, args, kwargs in steps:
        value = op(value, *args, **kwargs)
    return value
