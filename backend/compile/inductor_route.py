"""`torch.compile(model)` with its default backend, Inductor, on tpu tensors: compiled by `"tpu"`.

torch's Inductor has a Pallas code generator for a device named `tpu`, and its generated code imports
TorchTPU's own package (`torch_tpu`), so a graph on tputrace's chips failed at its first call with
`No module named 'torch_tpu'`. A graph that reads or makes a tpu tensor now goes to the `"tpu"`
backend with the call's `mode` (Inductor's own options, such as `triton.*`, do not apply to XLA and
are left out); every other graph goes to Inductor as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

_installed = False


def _on_tpu(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "tpu"


def reads_or_makes_tpu_tensors(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether a Dynamo graph has a tpu tensor among its inputs or the values its nodes compute."""
    if any(_on_tpu(value) for value in example_inputs):
        return True
    return any(_on_tpu(node.meta.get("example_value")) for node in gm.graph.nodes)


def install(tpu_backend: Callable[..., Any]) -> None:
    """Route tpu graphs of torch.compile's Inductor wrapper to `tpu_backend` (once)."""
    global _installed
    if _installed:
        return
    wrapper = torch._TorchCompileInductorWrapper
    original_init, original_call = wrapper.__init__, wrapper.__call__

    @functools.wraps(original_init)
    def __init__(self: Any, mode: str | None, options: dict | None, dynamic: Any, name: str | None = None) -> None:
        original_init(self, mode, options, dynamic, name)
        self.tputrace_mode = mode

    @functools.wraps(original_call)
    def __call__(self: Any, model_: torch.fx.GraphModule, inputs_: Sequence[Any], *, config_patches: dict | None = None) -> Any:
        if reads_or_makes_tpu_tensors(model_, inputs_):
            return tpu_backend(model_, inputs_, mode=getattr(self, "tputrace_mode", None))
        return original_call(self, model_, inputs_, config_patches=config_patches)

    wrapper.__init__ = __init__
    wrapper.__call__ = __call__
    _installed = True
