"""tpu tensors under `make_fx` (what `torch.func.linearize` traces with): a tpu tensor the trace did
not create is a constant of the graph, as a CPU tensor is.

make_fx's proxy mode traces an op only when it knows every tensor argument: a plain tensor (taken
as a constant) or one with a proxy. It passes on an op that reads an untracked tpu tensor (the
primal that linearize's jvp closes over), and the op then ran on the chip out of the graph's sight,
so the graph returned a value computed once at trace time.

Under a fake trace (`make_fx(tracing_mode="fake"|"symbolic")`, `torch.export`) the inputs are fake
tpu tensors but a tensor the function closes over (a module's parameter) is real: an op mixing the
two runs on fake stand-ins of both, and the real one is a constant of the graph.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves

_PROXY_MODE = torch._C._TorchDispatchModeKey.PROXY
_FAKE_MODE = torch._C._TorchDispatchModeKey.FAKE


def track_untraced_constants(tensor_type: type, args: tuple, kwargs: dict) -> bool:
    """Give each real `tensor_type` argument that an active make_fx trace does not know a constant
    node in its graph; False when there is no such trace or nothing to add (the op runs eagerly).
    A traced one (AOTAutograd's wrapper around a fake inner tensor) is not a constant: the trace
    tracks its inner tensor."""
    proxy_mode = torch._C._get_dispatch_mode(_PROXY_MODE)
    if proxy_mode is None:
        return False
    return track_constants(proxy_mode.tracer, tensor_type, args, kwargs)


def track_constants(tracer: Any, tensor_type: type, args: tuple, kwargs: dict) -> bool:
    """Give each real `tensor_type` argument that `tracer` does not know a constant node in its
    graph (a `get_attr` of a tensor the graph module keeps); False when there is none."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, has_proxy_slot, track_tensor_tree

    untracked = [
        value
        for value in tree_leaves((args, kwargs))
        if type(value) is tensor_type and value._traced is None and not has_proxy_slot(value, tracer)
    ]
    with disable_proxy_modes_tracing():
        for tensor in untracked:
            proxy = torch.fx.Proxy(tracer.create_arg(tensor), tracer)
            track_tensor_tree(tensor, proxy, constant=None, tracer=tracer)
    return bool(untracked)


def fake_mode_of(values: list[Any]) -> Any:
    """The fake mode that a fake tensor among `values`, or the traced inner tensor of a tpu tensor
    among them, belongs to, if any."""
    for value in values:
        inner = getattr(value, "_traced", None)
        fake_mode = getattr(value if inner is None else inner, "fake_mode", None)
        if fake_mode is not None:
            return fake_mode
    return None


def fake_of_constant(tensor: torch.Tensor, fake_mode: Any) -> torch.Tensor:
    """The fake inner tensor standing for a real tpu tensor that a fake trace reads (its values are
    a constant of the graph, so its shape stays static). Without it the op reached the real
    tensor's compile handle, which runs nothing ("on a TpuData handle")."""
    return fake_mode.from_tensor(tensor, static_shapes=True)._inner


def fake_of_lifted_constant(tensor: torch.Tensor) -> torch.Tensor | None:
    """What `torch.tensor(data, device="tpu")` gives under an active fake mode (Dynamo computing an
    example value, AOTAutograd tracing): a fake tpu tensor holding the host values as a traced
    constant, as `torch.tensor(data, device="cuda")` gives. None without a fake mode.

    torch builds the value on the host, moves it to the chip with dispatch modes skipped, then lifts
    it; the fake mode passes on lifting a tensor subclass, so the real tpu tensor reached the graph
    ("Expected fake mode of e to be tx.fake_mode", as the sliding-window cache's
    `torch.tensor([-1], device=...)` meets under `generate`'s auto-compile). The copy into a fresh
    tensor keeps the fake mode from running the host-to-chip move for real (its constant
    propagation), which would hand it the tpu tensor again."""
    if torch._C._get_dispatch_mode(_FAKE_MODE) is None:
        return None
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        host = tensor.cpu()
    constant = torch.ops.aten.lift_fresh.default(host)
    return torch.zeros(host.shape, dtype=host.dtype, device=tensor.device).copy_(constant)
