"""Higher-order-op nodes of an AOTAutograd graph, replaced by the ATen ops they compute.

AOTAutograd keeps a FlexAttention call as one `flex_attention` (and, in a backward graph, one
`flex_attention_backward`) node whose `score_mod` and `mask_mod` are subgraphs; the lowering knows
only ATen ops. The graph is traced again with those nodes running torch's dense implementations
(`sdpa_dense`, `sdpa_dense_backward`, the code FlexAttention runs on the CPU), functionalized and
with the backend's decompositions, so XLA gets the attention as ATen ops and fuses them.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode
from torch._subclasses.functional_tensor import FunctionalTensorMode
from torch.fx.experimental.proxy_tensor import make_fx


def _hops() -> Any:
    return importlib.import_module("torch._higher_order_ops.flex_attention")


def _dense_forward(node: torch.fx.Node, args: tuple) -> Any:
    return _hops().sdpa_dense(*args)


def _dense_backward(node: torch.fx.Node, args: tuple) -> Any:
    """`sdpa_dense_backward`, told which captured `score_mod` tensors the node gives a gradient for:
    it computes the gradient of those that require one, and a graph's inputs require none."""
    *leading, score_mod_buffers, mask_mod_buffers = args
    score_mod_buffers = tuple(
        buffer.detach().requires_grad_() if isinstance(buffer, torch.Tensor) and grad is not None else buffer
        for buffer, grad in zip(score_mod_buffers, node.meta["val"][3])
    )
    return _hops().sdpa_dense_backward(*leading, score_mod_buffers, mask_mod_buffers)


def _dense_implementations() -> dict[Any, Callable[[torch.fx.Node, tuple], Any]]:
    hops = _hops()
    return {hops.flex_attention: _dense_forward, hops.flex_attention_backward: _dense_backward}


class _DenseInterpreter(torch.fx.Interpreter):
    """Runs a graph, with each higher-order op that has a dense implementation running that."""

    def __init__(self, gm: torch.fx.GraphModule, dense: dict[Any, Callable[[torch.fx.Node, tuple], Any]]) -> None:
        super().__init__(gm)
        self._dense = dense

    def run_node(self, node: torch.fx.Node) -> Any:
        implementation = self._dense.get(node.target) if node.op == "call_function" else None
        if implementation is None:
            return super().run_node(node)
        with self._set_current_node(node):
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            return implementation(node, (*args, *kwargs.values()))


def decompose(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], decompositions: dict) -> torch.fx.GraphModule:
    """`gm` with its FlexAttention nodes replaced by ATen ops (`gm` itself when it has none)."""
    dense = _dense_implementations()
    if not any(node.op == "call_function" and node.target in dense for node in gm.graph.nodes):
        return gm
    from torch._functorch._aot_autograd.functional_utils import from_fun, to_fun

    def run(*args: Any) -> Any:
        with FunctionalTensorMode():
            outputs = _DenseInterpreter(gm, dense).run(*pytree.tree_map(to_fun, args))
        return pytree.tree_map(from_fun, outputs)

    trace = make_fx(run, decomposition_table=decompositions)
    # The dense code makes constants (`torch.tensor(...)`): in the inputs' fake mode, they are fake too.
    with detect_fake_mode(example_inputs) or contextlib.nullcontext():
        return trace(*example_inputs)
