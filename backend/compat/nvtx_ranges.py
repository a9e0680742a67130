"""`torch.cuda.nvtx` under `tputrace run --as-cuda`: a CUDA script's NVTX ranges become profiler ranges
(`torch.autograd.profiler.record_function`), which a recording keeps as named ranges, where torch's own functions
raise without a CUDA build. `range_push`/`range_pop` nest as NVTX's do (one stack per thread), `range_start` and
`range_end` pair by the id the first returns, `mark` records nothing, and `nvtx.range` (built on push and pop) follows."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch
import torch.cuda.nvtx

_local = threading.local()
_started: dict[int, Any] = {}
_ids = itertools.count(1)


def _stack() -> list[Any]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def range_push(msg: str) -> int:
    """Open a range named `msg`; its depth, from 0, as NVTX returns."""
    stack = _stack()
    scope = torch.autograd.profiler.record_function(msg)
    scope.__enter__()
    stack.append(scope)
    return len(stack) - 1


def range_pop() -> int:
    """Close the innermost range this thread opened; the depth it had, or -1 with none open."""
    stack = _stack()
    if not stack:
        return -1
    stack.pop().__exit__(None, None, None)
    return len(stack)


def range_start(msg: str) -> int:
    """Open a range that `range_end(id)` closes, from any thread."""
    scope = torch.autograd.profiler.record_function(msg)
    scope.__enter__()
    range_id = next(_ids)
    _started[range_id] = scope
    return range_id


def range_end(range_id: int) -> None:
    scope = _started.pop(range_id, None)
    if scope is not None:
        scope.__exit__(None, None, None)


def mark(msg: str) -> None:
    """An instant marker: nothing to record as a range."""


def install() -> None:
    """Replace `torch.cuda.nvtx`'s functions (`nvtx.range` calls them by module name)."""
    for name, function in (("range_push", range_push), ("range_pop", range_pop), ("range_start", range_start),
                           ("range_end", range_end), ("mark", mark)):
        setattr(torch.cuda.nvtx, name, function)
