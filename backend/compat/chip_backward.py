"""Backward through tensors on several chips in one process (`TPUTRACE_CHIPS=N`, N > 1): a model
split over `tpu:0` and `tpu:1`, or `nn.DataParallel` training on both.

torch's autograd engine runs a node on the ready queue of its gradients' device: one queue and worker
thread per device index, as many as the largest device count of a registered device guard. The
guard torch registers for a device written in Python (`torch._C._acc.DeviceGuard`) reports one
device, so a gradient on `tpu:1` fails an internal assert ("device_ready_queues_"). With autograd's
multithreading turned off, the engine runs every node on the ready queue of the thread that called
`backward()`, whatever its device (engine.cpp, `Engine::ready_queue`). So in a process with more
than one chip every backward runs that way: the wrapper below turns it off around the engine's one
Python entry, `torch.autograd.graph._engine_run_backward`, which `Tensor.backward`,
`torch.autograd.backward` and `torch.autograd.grad` all call. The chips still run their programs
asynchronously; only the host-side walk of the graph stays on one thread, as the deferred
executor's flushes need anyway. A one-chip process keeps torch's worker thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.autograd.graph as autograd_graph

from tputrace.backend.core import chips

_installed = False


def _on_calling_thread(run_backward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(run_backward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.autograd.set_multithreading_enabled(False):
            return run_backward(*args, **kwargs)

    return run


def install() -> None:
    """In a process of several chips, wrap the engine's entry in `torch.autograd.graph` and the
    name `torch.autograd` imported, which the backward boundary (`hooks.install`, installed first)
    already wraps and so keeps (idempotent)."""
    global _installed
    if _installed or chips.requested_chip_count() < 2:
        return
    autograd_graph._engine_run_backward = _on_calling_thread(autograd_graph._engine_run_backward)
    torch.autograd._engine_run_backward = _on_calling_thread(torch.autograd._engine_run_backward)
    _installed = True
