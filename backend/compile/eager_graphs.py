"""Graphs XLA cannot compile as one program: a size that depends on values (what Dynamo captures of
`x[mask]`, `nonzero` or `.item()` sizes under `capture_dynamic_output_shape_ops`/`capture_scalar_outputs`).

Such a graph runs op by op on the chip instead, as AOTAutograd's `aot_eager` backend runs it: its ops
are the tpu's eager ops (deferred and fused between the syncs their sizes need, in DEFER_AND_FUSE),
recorded as eager ops are. The graph's compile record says it runs eagerly and why.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils._pytree import tree_leaves

from tputrace import sourceloc
from tputrace.backend.core.tensor import TpuData
from tputrace.recording.interface import Recording


def data_dependent_cause(gm: torch.fx.GraphModule) -> str | None:
    """Why `gm` cannot be one XLA program (`aten.nonzero.default gives a shape that depends on values`),
    or None when every tensor's shape is known from the inputs' shapes. A value read in the graph
    (`.item()`) that only enters arithmetic keeps the graph one program."""
    origin: torch.fx.Node | None = None  # the first input or node whose value is not known before it runs
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "call_function"):
            continue
        value = node.meta.get("val")
        if origin is None and free_unbacked_symbols(value):
            origin = node
        if node.op != "call_function":
            continue
        if any(isinstance(leaf, torch.Tensor) and free_unbacked_symbols(leaf.shape) for leaf in tree_leaves(value)):
            if origin is None or origin is node:
                return f"{node.target} gives a shape that depends on values"
            source = f"input {origin.name}" if origin.op == "placeholder" else str(origin.target)
            return f"{node.target} takes a size from {source}, which depends on values"
    return None


class EagerGraph:
    """Runs one AOTAutograd graph with the tpu's eager ops (the callable handed back to AOTAutograd).
    While recording, each op is recorded at the user's line it was traced from (the node's stack)."""

    bucketing = None
    bucket_refusal = None

    def __init__(self, gm: torch.fx.GraphModule, name: str, cause: str, events: Any) -> None:
        # AOTAutograd calls it with one list of arguments (an instance attribute: its wrappers copy __dict__).
        self._boxed_call = True
        self.gm = gm
        self.events = events
        self.n_ops = sum(1 for node in gm.graph.nodes if node.op == "call_function")
        self.locations = {node: sourceloc.last_user_location(node.stack_trace) for node in gm.graph.nodes if node.op == "call_function"}
        warnings.warn(f"tputrace: {name} runs op by op on the tpu, not as one XLA program: {cause}", RuntimeWarning, stacklevel=2)

    def __call__(self, *call_args: Any) -> Any:
        boxed = len(call_args) == 1 and type(call_args[0]) is list
        args = [_eager(value) for value in (call_args[0] if boxed else call_args)]
        if boxed:
            call_args[0].clear()  # the boxed convention: the caller's list no longer holds the inputs
        recorder = self.events.recorder()
        if recorder is None:
            return self.gm(*args)
        return _AtTracedLines(self.gm, recorder, self.locations).run(*args)


class _AtTracedLines(torch.fx.Interpreter):
    """Runs a graph's nodes, each with the recorder's line set to the one the node was traced from."""

    def __init__(self, gm: torch.fx.GraphModule, recorder: Recording, locations: dict[torch.fx.Node, tuple[str, int, str] | None]) -> None:
        super().__init__(gm)
        self.recorder = recorder
        self.locations = locations

    def run_node(self, node: torch.fx.Node) -> Any:
        with self.recorder.recording_at(self.locations.get(node)):
            return super().run_node(node)


def _eager(value: Any) -> Any:
    """An input as eager ops take it: a handle (what a TpuTensor flattens to for torch.compile) becomes a
    TpuTensor over the same buffer, so that writes into it reach the caller's tensor and every output is a
    TpuTensor, as a compiled graph's are."""
    return value.tensor() if type(value) is TpuData else value
