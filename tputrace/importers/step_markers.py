"""Step markers in compact columns, for captures with hundreds of thousands of steps: collected in the first pass
of an import, then placed on the rank's `StepClock` without a Python object per step."""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import numpy as np

from tputrace.importers.sink import StepClock
from tputrace.importers.xevents import UINT64_VALUE

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

    def add_many(self, starts: np.ndarray, ends: np.ndarray, kinds: np.ndarray, numbers: np.ndarray,
                 numbered: np.ndarray) -> None:
        """`add` of markers given as columns: their numbers (int64) where `numbered`, of kind `INT64_VALUE` or
        `UINT64_VALUE` (a uint64 beyond int64 makes a wide marker)."""
        wide = numbered & (kinds == UINT64_VALUE) & (numbers < 0)
        for start, end, number in zip(starts[wide].tolist(), ends[wide].tolist(), numbers[wide].tolist()):
            self.add(start, end, number % (1 << 64))
        kept = ~wide
        self.starts.frombytes(starts[kept].astype(np.int64).tobytes())
        self.ends.frombytes(ends[kept].astype(np.int64).tobytes())
        self.numbers.frombytes(np.where(numbered[kept], numbers[kept], 0).astype(np.int64).tobytes())
        self.numbered += numbered[kept].astype(np.uint8).tobytes()

    def extend(self, other: StepMarkers, offset: int = 0) -> None:
        """Add `other`'s markers, moved by `offset` ns."""
        self.starts.frombytes((np.asarray(other.starts, dtype=np.int64) + offset).tobytes())
        self.ends.frombytes((np.asarray(other.ends, dtype=np.int64) + offset).tobytes())
        self.numbers += other.numbers
        self.numbered += other.numbered
        self.wide += [(start + offset, end + offset, number) for start, end, number in other.wide]

    def last_end(self) -> int | None:
        """The latest end of the markers (ns), None for none."""
        return max((*self.ends, *(end for _, end, _ in self.wide)), default=None)

    def tuples(self) -> list[tuple[int, int, int | None]]:
        """The markers as (start, end, number) tuples."""
        return [*zip(self.starts, self.ends, (number if numbered else None
                                               for number, numbered in zip(self.numbers, self.numbered))), *self.wide]


class ProgramRuns:
    """The spans (ns) of the chips' program runs (their `XLA Modules` events), 16 bytes a run: a chip runs a step's
    programs after the host's marker of the step has ended (asynchronous dispatch), so the last step's device work
    ends later than its marker."""

    def __init__(self) -> None:
        self.starts = array("q")
        self.ends = array("q")

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.starts.frombytes(starts.astype(np.int64).tobytes())
        self.ends.frombytes(ends.astype(np.int64).tobytes())

    def extend(self, other: ProgramRuns, offset: int = 0) -> None:
        """Add `other`'s runs, moved by `offset` ns."""
        self.add(np.asarray(other.starts, dtype=np.int64) + offset, np.asarray(other.ends, dtype=np.int64) + offset)

    def end_of_runs_by(self, t_ns: int) -> int:
        """The latest end of the runs that started at or before `t_ns`, or `t_ns` where none ends later."""
        starts = np.asarray(self.starts, dtype=np.int64)
        ends = np.asarray(self.ends, dtype=np.int64)[starts <= t_ns]
        return max(t_ns, int(ends.max())) if len(ends) else t_ns


def place_markers(clock: StepClock, markers: StepMarkers, offset: int = 0,
                  close_at: int | None = None) -> Iterator[tuple[int, int, int]]:
    """`StepClock.place` of markers in columns, moved by `offset` ns; the steps are made a block at a time. With
    `close_at` (ns, before the offset; at or after the last marker's start), rows from then on are in the step after
    the last (`clock.after_last`), which is no step of the loop."""
    if markers.wide:
        steps = clock.place([(start + offset, end + offset, number) for start, end, number in markers.tuples()])
        if close_at is not None and steps:
            _close(clock, steps[-1][0] + 1, close_at + offset)
        return iter(steps)
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
    if close_at is not None and len(numbers):
        _close(clock, int(numbers[-1]) + 1, close_at + offset)
    return _blocks(numbers, starts, ends)


def _close(clock: StepClock, number: int, start: int) -> None:
    """Open the span after the last step (number, start ns) on `clock`."""
    clock.after_last = (number, start)
    starts, labels = list(clock.starts), list(clock.labels)
    clock._set([*starts, start], [*labels, number])


def _blocks(numbers: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Iterator[tuple[int, int, int]]:
    for at in range(0, len(numbers), _STEPS_PER_BLOCK):
        block = slice(at, at + _STEPS_PER_BLOCK)
        yield from zip(numbers[block].tolist(), starts[block].tolist(), ends[block].tolist())
