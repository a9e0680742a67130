"""Out-of-memory forensics: the live set when a run failed with an out-of-memory error (XLA's RESOURCE_EXHAUSTED),
or the first moment its live bytes went over the target chip's HBM."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tputrace.derived.memory_timeline import BufferLifetime, MemoryPeak, chips_of, first_over, moment

# XLA's allocator, torch's wording, and numpy's when a tensor's host copy cannot be made.
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "out of memory", "Out of memory", "OutOfMemory", "MemoryError")


@dataclass(frozen=True)
class OutOfMemory:
    """Where a run ran out of memory: `cause` is `error` (the run raised one; `live` is what was live at the last
    allocation before it, when the failing op asked for more) or `target` (live bytes first went over the target's
    HBM then); `message` is the error's last line, or the limit."""

    cause: str
    message: str
    live: MemoryPeak


def is_out_of_memory(error: str | None) -> bool:
    return error is not None and any(marker in error for marker in OOM_MARKERS)


def out_of_memory(buffers: Sequence[BufferLifetime], error: str | None, hbm_bytes: int) -> OutOfMemory | None:
    """The out-of-memory moment of a run: its error's, else the first overrun of `hbm_bytes`; None when neither."""
    if not buffers:
        return None
    if is_out_of_memory(error):
        assert error is not None
        # Buffers freed after the last allocation were freed by the failure unwinding the script.
        last_alloc_ns = max(buffer.alloc_ns for buffer in buffers)
        moments = [moment(buffers, chip, last_alloc_ns) for chip in chips_of(buffers)]
        fullest = max(moments, key=lambda live: live.bytes)
        last_line = next((line.strip() for line in reversed(error.strip().splitlines()) if line.strip()), error)
        return OutOfMemory("error", last_line, fullest)
    overruns = [over for over in (first_over(buffers, chip, hbm_bytes) for chip in chips_of(buffers)) if over is not None]
    if not overruns:
        return None
    return OutOfMemory("target", f"live bytes went over {hbm_bytes} bytes", min(overruns, key=lambda over: over.t_ns))
