"""What a collective leaves in the trace: one `collectives` row per call on each rank.

A row is opened when the call is issued (the user's source line and the step are those of the
issuing thread) and written when its result is back on the chip. `start_ns` is when this rank's data
entered the transport (its arrival), `dur_ns` runs from there to the result being on the chip. The
time each rank waited for the last arrival needs every rank's clock, so `tputrace merge` fills
`wait_ns` in; a single rank's trace leaves it NULL.

Message sizes follow the nccl-tests convention: all-gather and reduce-scatter count the full
(unsharded) buffer, and bus bandwidth is that size times the ring factor of the kind over the duration.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from tputrace.backend.dtypes import short_name

_perf_ns = time.perf_counter_ns

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


@dataclass
class CollectiveCall:
    """One collective as issued on this rank; `finished()` writes its row."""

    recorder: Any
    kind: str
    nbytes: int
    dtype: str
    group: str
    ranks: str
    frame_id: int | None
    step: int
    transport: str
    start_ns: int = 0

    def arrived(self) -> None:
        """This rank's data is in the transport: the moment the others wait for."""
        self.start_ns = _perf_ns()

    def finished(self) -> None:
        end = _perf_ns()
        duration = max(end - self.start_ns, 1)
        size = len(self.ranks.split(","))
        bandwidth = self.nbytes * bus_factor(self.kind, size) / (duration / 1e9) if self.nbytes else None
        algorithm = f"{self.transport}:{ALGORITHMS[self.kind]}" if self.kind in ALGORITHMS else self.transport
        self.recorder.collective(
            self.kind, self.nbytes, self.dtype, self.group, self.ranks, self.frame_id, self.start_ns, duration, None, algorithm, bandwidth, self.step
        )


def open_call(kind: str, tensors: list[torch.Tensor], nbytes: int, group: str, ranks: str, transport: str) -> CollectiveCall | None:
    """A call to record, or None when nothing is recording (the cheap path)."""
    from tputrace import recorder as recorder_module

    recorder = recorder_module.active()
    if recorder is None or not recorder.enabled:
        return None
    dtype = short_name(tensors[0].dtype) if tensors else ""
    return CollectiveCall(recorder, kind, nbytes, dtype, group, ranks, recorder.frame_id(), recorder.step_index, transport)


def message_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)
