"""Helpers shared by the backend tests: load the device once, switch eager modes safely."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tputrace.backend  # noqa: F401 - registers the tpu device
from tputrace.backend.device_module import EagerMode, eager_mode, set_eager_mode

_FALLBACK_WARNING = re.compile(r"tputrace: (\S+) runs on the host CPU")


@contextlib.contextmanager
def eager(mode: EagerMode) -> Iterator[None]:
    """Run a block in one eager mode and restore the previous one (flushing pending work)."""
    previous = eager_mode()
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(previous)


def host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu")


@contextlib.contextmanager
def recorded_fallbacks() -> Iterator[list[str]]:
    """The names of the ops that run on the host CPU inside the block, one per call (an op whose
    lowering fails is named twice), taken from the dispatcher's fallback warning as it is made; the
    dispatcher otherwise warns once per op and process, and caches routes, so no method wrapper
    would see every call."""
    from tputrace.backend.dispatch import dispatcher

    names: list[str] = []
    warn_once = dispatcher._warn_once

    def warn_and_record(key: str, message: str) -> None:
        match = _FALLBACK_WARNING.match(message)
        if match:
            names.append(match.group(1))
        warn_once(key, message)

    dispatcher._warn_once = warn_and_record
    try:
        yield names
    finally:
        del dispatcher._warn_once


@contextlib.contextmanager
def recorded_host_reads() -> Iterator[list[str]]:
    """The sync kinds of the dispatcher's host reads inside the block."""
    from tputrace.backend.dispatch import dispatcher

    kinds: list[str] = []
    to_host = dispatcher.to_host

    def counted(tensor: torch.Tensor, sync_kind: str) -> torch.Tensor:
        kinds.append(sync_kind)
        return to_host(tensor, sync_kind)

    dispatcher.to_host = counted
    try:
        yield kinds
    finally:
        del dispatcher.to_host


class OpNames(TorchDispatchMode):
    """The ATen ops that reach dispatch inside the block, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.names.append(func.name())
        return func(*args, **(kwargs or {}))
