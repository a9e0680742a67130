"""Step markers in compact columns, for captures with hundreds of thousands of steps: collected in the first pass
of an import, then placed on the rank's `StepClock` without a Python object per step."""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import numpy as np

from tputrace.importers.sink import StepClock

_STEPS_PER_BLOCK = 10_000
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class StepMarkers:
    """Step markers (start and end, ns; the capture's step number or None) in compact columns: a long capture holds
    hundreds of thousands."""

    def __init__(self) -> None:
        self.starts = array("q")
        self.ends = array("q")
        self.numbers = array("q")  # 0 where `numbered` is 0
        self.numbered = bytearray()
        self.wide: list[tuple[int, int, int | None]] = []  # markers whose number is beyond int64 (as tuples)

    def __len__(self) -> int:
        return len(self.starts) + len(self.wide)

    def add(self, start: int, end: int, number: int | None) -> None:
        if number is not None and not _INT64_MIN <= number <= _INT64_MAX:
            self.wide.append((start, end, number))
            return
        self.starts.append(start)
        self.ends.append(end)
        self.numbers.append(0 if number is None else number)
        self.numbered.append(number is not None)

    def extend(self, other: StepMarkers, offset: int = 0) -> None:
        """Add `other`'s markers, moved by `offset` ns."""
        self.starts.frombytes((np.asarray(other.starts, dtype=np.int64) + offset).tobytes())
        self.ends.frombytes((np.asarray(other.ends, dtype=np.int64) + offset).tobytes())
        self.numbers += other.numbers
        self.numbered += other.numbered
        self.wide += [(start + offset, end + offset, number) for start, end, number in other.wide]

    def tuples(self) -> list[tuple[int, int, int | None]]:
        """The markers as (start, end, number) tuples."""
        return [*zip(self.starts, self.ends, (number if numbered else None
                                               for number, numbered in zip(self.numbers, self.numbered))), *self.wide]


def place_markers(clock: StepClock, markers: StepMarkers, offset: int = 0) -> Iterator[tuple[int, int, int]]:
    """`StepClock.place` of markers in columns, moved by `offset` ns; the steps are made a block at a time."""
    if markers.wide:
        return iter(clock.place([(start + offset, end + offset, number) for start, end, number in markers.tuples()]))
    starts = np.asarray(markers.starts, dtype=np.int64) + offset
    ends = np.asarray(markers.ends, dtype=np.int64) + offset
    order = np.lexsort((ends, starts))  # stable, as `place`'s sort
    starts, ends = starts[order], ends[order]
    numbers = np.asarray(markers.numbers, dtype=np.int64)[order]
    numbered = np.frombuffer(markers.numbered, dtype=np.uint8).astype(bool) if len(order) else np.ones(0, bool)
    if not numbered.all() or (numbers[1:] <= numbers[:-1]).any():
        numbers = np.arange(1, len(order) + 1, dtype=np.int64)
    labels = array("q", [min(0, int(numbers[0]) - 1) if len(numbers) else 0])
    labels.frombytes(numbers.tobytes())
    clock.starts, clock.labels = array("q", starts.tobytes()), labels
    return _blocks(numbers, starts, ends)


def _blocks(numbers: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Iterator[tuple[int, int, int]]:
    for at in range(0, len(numbers), _STEPS_PER_BLOCK):
        block = slice(at, at + _STEPS_PER_BLOCK)
        yield from zip(numbers[block].tolist(), starts[block].tolist(), ends[block].tolist())
