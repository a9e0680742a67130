"""What a collective leaves in the trace: one `collectives` row per call on each rank.

A row is opened when the call is issued (the user's source line and the step are those of the
issuing thread) and written when its result is back on the chip. `start_ns` is when this rank's data
entered the transport (its arrival), `dur_ns` runs from there to the result being on the chip. The
time each rank waited for the last arrival needs every rank's clock, so `tputrace merge` fills
`wait_ns` in; a single rank's trace leaves it NULL.

A user's own call (one without a recorded cause) also keeps when the user's code first waited on it
(`waited_after_ns`: its Work's `wait()` or `is_completed()` found true, its future's `wait()`, a functional
result's wait), and the user's line that first read one of the tensors it writes before that wait (`read_early_frame_id`,
see `early_reads`). Its row waits for the wait: a call whose result came back before any wait is written at the wait,
or, never waited, when its future is collected or the recording ends (NULL). A call with a cause is
waited on by its library (DDP's reducer waits in C++) and is written when its result is back.

Message sizes follow the nccl-tests convention: all-gather and reduce-scatter count the full
(unsharded) buffer, and bus bandwidth is that size times the ring factor of the kind over the duration.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.core.dtypes import short_name
from tputrace.backend.distributed import causes, early_reads, placements, redistributions
from tputrace.recording.interface import Recording, active

_perf_ns = time.perf_counter_ns
COMMIT_SOON_NS = 20_000_000
_last_commit_request_ns = 0
_held_lock = threading.Lock()
_held: set[CollectiveCall] = set()  # user calls whose result is back, waiting for the user's first wait to be written

def bus_factor(kind: str, ranks: int) -> float:
    """Bytes each rank moves per byte of message (nccl-tests' bus bandwidth factors)."""
    if ranks <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (ranks - 1) / ranks
    if kind == "barrier":
        return 0.0
    return 1.0


# The algorithm the transport runs, where it is known (gloo's all-reduce and all-gather are rings);
# other kinds are recorded with the transport's name alone.
ALGORITHMS = {"all_reduce": "ring", "all_gather": "ring", "send": "p2p", "recv": "p2p"}


class CollectiveCall:
    """One collective as issued on this rank; `finished()` writes its row. (A plain class with slots:
    one is made per collective while recording, so its cost is on the collective path.)"""

    __slots__ = ("recorder", "kind", "nbytes", "dtype", "group", "ranks", "size", "frame_id", "step", "algorithm", "start_ns", "cause_id",
                 "waited_after_ns", "result", "thread", "watched", "read_early_frame_id")

    def __init__(self, recorder: Recording, kind: str, nbytes: int, dtype: str, group: str, ranks: str, size: int, transport: str,
                 reduced_already: bool = False, tensors: list[torch.Tensor] | None = None) -> None:
        self.recorder = recorder
        self.kind = kind
        self.nbytes = nbytes
        self.dtype = dtype
        self.group = group
        self.ranks = ranks
        self.size = size
        self.frame_id = recorder.frame_id()
        self.step = recorder.step_index
        self.algorithm = f"{transport}:{ALGORITHMS[kind]}" if kind in ALGORITHMS else transport
        if kind == "all_gather" and tensors is not None and len(tensors) == 1 and nbytes != message_bytes(tensors) * size:
            self.algorithm = f"{transport}:uneven"  # pieces of different sizes, as the ranks chose them
        self.start_ns = 0
        self.cause_id = causes.cause_id(recorder, kind, group, reduced_already)
        self.waited_after_ns: int | None = None
        self.result: tuple[int, float | None] | None = None  # (duration, bandwidth) of a finished call not yet written
        self.thread = threading.get_ident()  # the issuing thread: its reads before the wait are the user's
        self.watched: list[Any] | None = None  # the buffers `early_reads` watches for the call
        self.read_early_frame_id: int | None = None

    def launched(self, outputs: Sequence[torch.Tensor]) -> None:
        """The call is in the transport: a user's call's output tensors are watched for reads until its first wait."""
        if self.cause_id is None:
            early_reads.watch(self, outputs)

    def arrived(self) -> None:
        """This rank's data is in the transport: the moment the others wait for. The rows recorded so far are
        committed soon (at most every `COMMIT_SOON_NS`): a peer's mismatched call can make gloo abort this process
        in the wait (`EnforceNotMet`, SIGABRT), and a trace keeps only what was committed."""
        global _last_commit_request_ns
        self.start_ns = now = _perf_ns()
        if now - _last_commit_request_ns >= COMMIT_SOON_NS:
            _last_commit_request_ns = now
            self.recorder.commit_soon()

    def finished(self, failed: bool = False) -> None:
        """The result is back, or the call failed (a peer gone, a timeout): write the row now (a failed call, so that
        the trace keeps the call a rank was waiting in, has no bus bandwidth), or, for a user's call nobody has waited on
        yet, at its first wait (`waited`) or once nobody can (`dropped`)."""
        if failed and self.watched is not None:
            early_reads.unwatch(self)
        duration = max(_perf_ns() - self.start_ns, 1)
        bandwidth = self.nbytes * bus_factor(self.kind, self.size) * 1e9 / duration if self.nbytes and not failed else None
        with _held_lock:
            if not failed and self.cause_id is None and self.waited_after_ns is None:
                self.result = (duration, bandwidth)
                _held.add(self)
                return
        self._write(duration, bandwidth)

    def waited(self) -> None:
        """The user's code waits on the call; the first wait is the one its row keeps."""
        if self.watched is not None:
            early_reads.unwatch(self)
        with _held_lock:
            if self.waited_after_ns is not None:
                return
            self.waited_after_ns = max(_perf_ns() - self.start_ns, 0) if self.start_ns else 0
            result, self.result = self.result, None
            _held.discard(self)
        if result is not None:
            self._write(*result)

    def dropped(self) -> None:
        """Nothing can wait on the call any more (its future was collected, the recording ends): a finished call's row
        is written as never waited."""
        if self.watched is not None:
            early_reads.unwatch(self)
        with _held_lock:
            result, self.result = self.result, None
            _held.discard(self)
        if result is not None:
            self._write(*result)

    def _write(self, duration: int, bandwidth: float | None) -> None:
        if active() is not self.recorder:  # the recording has ended
            return
        self.recorder.collective(
            self.kind, self.nbytes, self.dtype, self.group, self.ranks, self.frame_id, self.start_ns, duration, None, self.algorithm, bandwidth, self.step,
            self.cause_id, self.waited_after_ns, self.read_early_frame_id,
        )


def write_held_rows() -> None:
    """Write the rows of the finished calls nobody waited on (the recording ends: they never were)."""
    with _held_lock:
        calls = list(_held)
    for call in calls:
        call.dropped()


def open_call(kind: str, tensors: list[torch.Tensor], nbytes: int, group: str, ranks: str, size: int, transport: str) -> CollectiveCall | None:
    """A call to record (its source line and step taken now, on the issuing thread), or None when
    nothing is recording (the cheap path)."""
    recorder = active()
    if recorder is None or not recorder.enabled:
        return None
    if placements.has_pending():
        placements.record_pending(recorder)
    reduced_already = kind == "all_reduce" and len(tensors) == 1 and redistributions.reduces_again(recorder, tensors[0])
    return CollectiveCall(recorder, kind, nbytes, short_name(tensors[0].dtype) if tensors else "", group, ranks, size, transport, reduced_already,
                          tensors)


def note_splits(call: CollectiveCall | None, output_splits: Sequence[int], input_splits: Sequence[int]) -> tuple[list[int], list[int]]:
    """An all-to-all's split sizes as lists; a call whose pieces differ in size (the ranks chose them, as a mixture of
    experts' token dispatch does) is recorded with the algorithm `<transport>:uneven`."""
    outputs, inputs = list(output_splits), list(input_splits)
    if call is not None and (len(set(outputs)) > 1 or len(set(inputs)) > 1):
        call.algorithm = f"{call.algorithm.split(':')[0]}:uneven"
    return outputs, inputs


def active_recorder() -> Recording | None:
    """The recorder that records now, or None (the sharding hooks' cheap check)."""
    recorder = active()
    return recorder if recorder is not None and recorder.enabled else None


def user_frame_id() -> int | None:
    """The frame id of the user's line that is running now (None while nothing records)."""
    recorder = active_recorder()
    return recorder.frame_id() if recorder is not None else None


def message_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)
