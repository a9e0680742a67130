"""Live and peak bytes held by tpu tensors, per chip (what `torch.tpu.memory_allocated` reports).

Counters are plain lists indexed by chip, since every buffer allocation updates them.
"""

from __future__ import annotations

from typing import Any

MAX_CHIPS = 4096

live: list[int] = [0] * MAX_CHIPS
peak: list[int] = [0] * MAX_CHIPS
_used: set[int] = set()
# The recording's `buffer_lifetimes.BufferTracker` while one records buffer lifetimes, else None.
tracker: Any = None


def allocate(chip: int, nbytes: int) -> None:
    value = live[chip] + nbytes
    live[chip] = value
    if value > peak[chip]:
        peak[chip] = value
        _used.add(chip)


def running(chip: int, working_bytes: int) -> None:
    """A program runs holding `working_bytes` beyond the live buffers (its temporaries, and outputs
    not yet counted): they count toward the peak, as a device allocator sees them, not as live bytes."""
    value = live[chip] + working_bytes
    if value >= peak[chip]:
        # Only a launch that reaches the peak so far is recorded: the run's peak, and the first moment over any
        # limit, are among them.
        if tracker is not None:
            tracker.program_ran(chip, working_bytes)
        peak[chip] = value
        _used.add(chip)


def release(chip: int, nbytes: int) -> None:
    live[chip] -= nbytes


def live_bytes(chip: int) -> int:
    return live[chip]


def peak_bytes(chip: int) -> int:
    return peak[chip]


def reset_peak(chip: int) -> None:
    peak[chip] = live[chip]


def chips_in_use() -> list[int]:
    return sorted(_used)
