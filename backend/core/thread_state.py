"""Which thread an op is dispatched on, which kind of host sync a user's call is making, and whether a
TorchScript call is running on the thread.

Ops arrive on the main thread, on user threads, on tputrace's own threads and on autograd's C++
worker threads, which the tensor's dispatch treats apart; a host read inside `tolist`, `print` or
`bool` is recorded as a sync of that kind.
"""

from __future__ import annotations

import threading

import torch

_local = threading.local()

_thread_kind = threading.local()


def on_autograd_worker() -> bool:
    """True on a thread that PyTorch's C++ autograd engine started (Python sees a dummy thread);
    worked out once per thread."""
    try:
        return _thread_kind.autograd_worker
    except AttributeError:
        worker = _thread_kind.autograd_worker = isinstance(threading.current_thread(), threading._DummyThread)
        return worker


def on_own_thread() -> bool:
    """True on a thread tputrace started (`tputrace-*`: the collectives' completion thread finishes
    collectives whose peers it waits for, and must not hold the user threads' dispatch lock)."""
    try:
        return _thread_kind.own
    except AttributeError:
        own = _thread_kind.own = threading.current_thread().name.startswith("tputrace-")
        return own


def sync_hint() -> str | None:
    """The kind of host sync the user's call is making (set around tolist/numpy/print/bool)."""
    return getattr(_local, "sync_kind", None)


class SyncKind:
    """Marks the host syncs inside a block as being of one kind (e.g. 'print')."""

    __slots__ = ("kind", "previous")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.previous: str | None = None

    def __enter__(self) -> None:
        self.previous = getattr(_local, "sync_kind", None)
        if self.previous is None:
            _local.sync_kind = self.kind

    def __exit__(self, *exc: object) -> None:
        _local.sync_kind = self.previous


class _InterpreterState(threading.local):
    """The TorchScript calls running on this thread (`integrations.torchscript`): the interpreter drops the
    message of an exception the device raises, so the dispatcher keeps it here."""

    calls_running = 0
    dispatch_error: BaseException | None = None
    saving: dict[int, torch.Tensor] | None = None  # the tensors of the module being saved, by C++ storage


interpreter_state = _InterpreterState()


def keep_interpreter_error(error: BaseException) -> None:
    """Keep an exception the device raised while a scripted module or function runs (its message would be lost)."""
    if interpreter_state.calls_running:
        interpreter_state.dispatch_error = error
