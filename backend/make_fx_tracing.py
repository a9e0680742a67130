"""tpu tensors under `make_fx` (what `torch.func.linearize` traces with): a tpu tensor the trace did
not create is a constant of the graph, as a CPU tensor is.

make_fx's proxy mode traces an op only when it knows every tensor argument: a plain tensor (taken
as a constant) or one with a proxy. It passes on an op that reads an untracked tpu tensor (the
primal that linearize's jvp closes over), and the op then ran on the chip out of the graph's sight,
so the graph returned a value computed once at trace time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves

_PROXY_MODE = torch._C._TorchDispatchModeKey.PROXY


def track_untraced_constants(tensor_type: type, args: tuple, kwargs: dict) -> bool:
    """Give each `tensor_type` argument that an active make_fx trace does not know a constant node
    in its graph; False when there is no such trace or nothing to add (the op runs eagerly)."""
    proxy_mode = torch._C._get_dispatch_mode(_PROXY_MODE)
    if proxy_mode is None:
        return False
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, has_proxy_slot, track_tensor_tree

    tracer = proxy_mode.tracer
    untracked = [value for value in tree_leaves((args, kwargs)) if type(value) is tensor_type and not has_proxy_slot(value, tracer)]
    with disable_proxy_modes_tracing():
        for tensor in untracked:
            proxy = torch.fx.Proxy(tracer.create_arg(tensor), tracer)
            track_tensor_tree(tensor, proxy, constant=None, tracer=tracer)
    return bool(untracked)
