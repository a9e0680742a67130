"""Reads of an asynchronous collective's tensors before the user's code waits on it.

From the call's launch to its first wait (`CollectiveCall.waited`), each tpu tensor the call writes (a whole buffer,
not a view of one) is watched: its buffer's class is switched to a subclass whose `array` records the first read made
on the thread that issued the call, at the user's line running then (an op's input, a copy to the host, a print).
The transport's own reads and the write-back run on other threads and are not reads of the user's. The first such
read is what the call's row keeps (`collectives.read_early_frame_id`); the buffer gets its own class back at the
first read or at the wait, so an op pays nothing once the window has closed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from tputrace.backend.core.buffers import CountedBuffer
from tputrace.backend.core.tensor import TpuTensor
from tputrace.recording.interface import Recording


class CollectiveCall(Protocol):
    """What a watch reads and writes of a call (`tracing.CollectiveCall`)."""

    recorder: Recording
    thread: int
    watched: list[Any] | None
    read_early_frame_id: int | None


_slot = CountedBuffer.array  # the slot's descriptor: what the watched class's property reads and writes
_lock = threading.Lock()
_watchers: dict[int, list[CollectiveCall]] = {}  # id(buffer) -> the calls watching it


def _read(buffer: Any) -> Any:
    calls = _watchers.get(id(buffer))
    if calls:
        _noted(buffer, calls)
    return _slot.__get__(buffer, CountedBuffer)


def _write(buffer: Any, value: Any) -> None:
    _slot.__set__(buffer, value)


class WatchedBuffer(CountedBuffer):
    """A chip buffer an unwaited collective writes: its first read on the issuing thread is noted."""

    __slots__ = ()
    array = property(_read, _write)


def watch(call: CollectiveCall, tensors: Sequence[torch.Tensor]) -> None:
    """Watch the buffers of `tensors` that the call writes, until its first wait."""
    buffers = [tensor._buf for tensor in tensors if isinstance(tensor, TpuTensor) and tensor._view is None]
    buffers = [buffer for buffer in buffers if type(buffer) in (CountedBuffer, WatchedBuffer)]
    if not buffers:
        return
    with _lock:
        call.watched = buffers
        for buffer in buffers:
            _watchers.setdefault(id(buffer), []).append(call)
            buffer.__class__ = WatchedBuffer


def unwatch(call: CollectiveCall) -> None:
    """The call was waited on (or read): its buffers are no longer watched for it."""
    with _lock:
        buffers, call.watched = call.watched, None
        for buffer in buffers or ():
            calls = _watchers.get(id(buffer))
            if calls is not None and call in calls:
                calls.remove(call)
            if not calls:
                _watchers.pop(id(buffer), None)
                if type(buffer) is WatchedBuffer:
                    buffer.__class__ = CountedBuffer


def _noted(buffer: Any, calls: list[CollectiveCall]) -> None:
    thread = threading.get_ident()
    for call in [call for call in calls if call.thread == thread]:
        if call.read_early_frame_id is None:
            call.read_early_frame_id = call.recorder.frame_id()
        unwatch(call)
