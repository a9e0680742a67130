"""Tensor constants of `torch.export.export` on tpu (strict and non-strict): a tpu tensor that is
neither a parameter nor a buffer (a plain tensor attribute, or `torch.tensor(data, device=x.device)`
inside forward) becomes a lifted tensor constant of the program, as a CPU tensor does.

Export traces with make_fx in pre-dispatch mode. Its proxy mode takes a real tensor it has not
seen as a constant of the graph only if it is a plain tensor; for a tensor subclass it returns
NotImplemented, so that the subclass's `__torch_dispatch__` runs first. At the pre-dispatch key
nothing runs after a mode, and the NotImplemented reached the caller ("Unable to cast
NotImplemented to Tensor"). So a pre-dispatch proxy mode first gives each real tpu tensor of an op
a constant node (as `make_fx_tracing` does for make_fx's other traces); export then lifts it into
the program's constants, and under the fake mode the op reads a fake stand-in of it.
"""

from __future__ import annotations

import functools
from typing import Any

from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode

from tputrace.backend.core.tensor import TpuTensor
from tputrace.backend.integrations.make_fx_tracing import track_constants

_installed = False


def _tracking_tpu_constants(torch_dispatch: Any) -> Any:
    @functools.wraps(torch_dispatch)
    def dispatch(mode: ProxyTorchDispatchMode, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if mode.pre_dispatch and TpuTensor in types:
            track_constants(mode.tracer, TpuTensor, args, kwargs or {})
        return torch_dispatch(mode, func, types, args, kwargs)

    return dispatch


def install() -> None:
    """Wrap the proxy mode's `__torch_dispatch__` (idempotent)."""
    global _installed
    if _installed:
        return
    ProxyTorchDispatchMode.__torch_dispatch__ = _tracking_tpu_constants(ProxyTorchDispatchMode.__torch_dispatch__)
    _installed = True
