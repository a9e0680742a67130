"""Helpers shared by the backend tests: load the device once, switch eager modes safely."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

import tputrace.backend  # noqa: F401 - registers the tpu device
from tputrace.backend.device_module import EagerMode, eager_mode, set_eager_mode


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
