"""Errors raised on autograd's worker thread reach the user's thread, as on the CPU.

Backward through tpu tensors runs on torch's C++ worker thread for the device. A Python exception
leaving Python code there (a tensor hook, a module backward hook, an op) unwinds through torch's
device guard while Python's error indicator is still set, and the process aborts. So code the
backend runs there keeps its exception instead: the dispatcher does it for ops
(`Dispatcher.dispatch_on_worker`), and `worker_safe` does it for hooks. The backward (or
`autograd.grad`) that ran them raises the first kept error when it returns, on the user's thread.

Hooks are wrapped where tpu code registers them: `TpuTensor.register_hook` and
`register_post_accumulate_grad_hook`, and module full backward (pre-)hooks, whose `BackwardHook`
registers them on autograd nodes (`WorkerSafeBackwardHook`). A hook registered directly on a node
(`grad_fn.register_hook`) is not wrapped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.autograd
import torch.nn.modules.module
import torch.utils.hooks

from tputrace.backend.core import routing

_installed = False


def worker_safe(hook: Callable[..., Any]) -> Callable[..., Any]:
    """`hook`, keeping an exception it raises on the autograd worker (it then changes no gradient)."""
    from tputrace.backend.core.thread_state import on_autograd_worker

    @functools.wraps(hook)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - raised on the user's thread by raise_after
            if not on_autograd_worker():
                raise
            routing.active().worker_errors.append(error)
            return None

    return run


class _SafeNodeHooks:
    """An autograd node as `BackwardHook` sees it: hooks registered through it are `worker_safe`."""

    def __init__(self, node: Any) -> None:
        self._node = node

    def register_hook(self, hook: Callable[..., Any]) -> Any:
        return self._node.register_hook(worker_safe(hook))

    def register_prehook(self, hook: Callable[..., Any]) -> Any:
        return self._node.register_prehook(worker_safe(hook))


class WorkerSafeBackwardHook(torch.utils.hooks.BackwardHook):
    """torch's `BackwardHook` (module full backward hooks and pre-hooks) with worker-safe hooks."""

    def _apply_on_tensors(self, fn: Callable[[Any], None], args: Sequence[Any]) -> Any:
        return super()._apply_on_tensors(lambda node: fn(_SafeNodeHooks(node)), args)


# What reads the failure an error from the engine stands for, else None (`distributed.register` adds the
# failed collective's).
FAILURE_READERS: list[Callable[[RuntimeError], BaseException | None]] = []


def _raising_after(run: Callable[..., Any]) -> Callable[..., Any]:
    """The autograd engine's entry, raising what the worker kept once it returns."""

    @functools.wraps(run)
    def call(*args: Any, **kwargs: Any) -> Any:
        dispatcher = routing.active()
        dispatcher.raise_worker_errors()
        try:
            result = run(*args, **kwargs)
        except RuntimeError as error:
            for failure_of in FAILURE_READERS:
                failure = failure_of(error)
                if failure is not None:
                    raise failure from None  # e.g. a peer's failure, as the collective words it
            raise
        dispatcher.raise_worker_errors()
        return result

    return call


def install() -> None:
    """Route module backward hooks through `WorkerSafeBackwardHook`; raise kept errors when the
    engine call behind `torch.autograd.backward` and `torch.autograd.grad` returns (once)."""
    global _installed
    if _installed:
        return
    torch.utils.hooks.BackwardHook = torch.nn.modules.module.BackwardHook = WorkerSafeBackwardHook
    torch.autograd._engine_run_backward = _raising_after(torch.autograd._engine_run_backward)
    _installed = True
