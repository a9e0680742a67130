"""Where importers write: one `TraceWriter`, a rank per imported capture, and the provenance list
stored as `meta.imported` (one JSON object per rank: format, path, host, device)."""

from __future__ import annotations

import bisect
import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tputrace.derived.imported_sources import IMPORTED_META_KEY
from tputrace.store.writer import TraceWriter
# Rows appended between two wakings of the writer's thread, which inserts them while the importer reads on (its
# `sqlite3` calls let go of the GIL while SQLite works); a queue that still fills up to the writer's bound is
# committed by the importer itself, so memory stays bounded however big the capture.
_ROWS_PER_COMMIT = 20_000


class StepClock:
    """Step boundaries of one rank (ns since its start) and their numbers, to give every row its step (compact
    columns where the numbers fit in int64)."""

    def __init__(self) -> None:
        self.starts: Sequence[int] = array("q")
        self.labels: Sequence[int] = array("q", [0])  # the step after 0, 1, 2.. boundaries
        self.after_last: tuple[int, int] | None = None  # (number, start) of the span after the last step, where closed

    def place(self, markers: list[tuple[int, int, int | None]], close_last: bool = False) -> list[tuple[int, int, int]]:
        """Set the boundaries from step markers (start, end, the capture's step number or None); the steps as
        (number, start, end) in time order. The capture's numbers are kept when every marker has one and they
        increase in time; else the steps are numbered 1... Rows before the first step are in step 0, or one
        below the first step's number where that is 0 or less. With `close_last`, rows after the last step's
        end are in the step after it (`after_last`), which is no step of the loop."""
        ordered = sorted(markers, key=lambda marker: (marker[0], marker[1]))
        numbers = [number for _, _, number in ordered if number is not None]
        if len(numbers) != len(ordered) or any(a >= b for a, b in zip(numbers, numbers[1:])):
            numbers = list(range(1, len(ordered) + 1))
        starts = [start for start, _, _ in ordered]
        labels = [min(0, numbers[0] - 1) if numbers else 0, *numbers]
        if close_last and ordered:
            self.after_last = (numbers[-1] + 1, max(end for _, end, _ in ordered))
            starts.append(self.after_last[1])
            labels.append(self.after_last[0])
        self._set(starts, labels)
        return [(number, start, end) for number, (start, end, _) in zip(numbers, ordered)]

    def _set(self, starts: list[int], labels: list[int]) -> None:
        try:
            self.starts, self.labels = array("q", starts), array("q", labels)
        except OverflowError:  # a capture's step number beyond int64
            self.starts, self.labels = starts, labels

    def step_at(self, t_ns: int) -> int:
        """The step whose boundary is the latest at or before `t_ns` (the `before` label before the first one)."""
        return self.labels[bisect.bisect_right(self.starts, t_ns)]


@dataclass(frozen=True)
class RankClock:
    """A rank another capture of its process writes into: its number, start (Unix ns) and steps."""

    rank: int
    start_unix_ns: int
    steps: StepClock


class ImportSink:
    """Wraps the writer: counts rows, has the writer's thread commit every so often, and records where each rank
    came from."""

    def __init__(self, writer: TraceWriter) -> None:
        self.writer = writer
        self.sources: list[dict[str, Any]] = []
        self.rows = 0
        self.warnings: list[str] = []  # what the user should know of the import (lines skipped), one line each
        self._since_commit = 0

    @property
    def appended(self) -> int:
        """Rows appended so far, committed or not."""
        return self.rows + self._since_commit

    def new_rank(self, fmt: str, path: str, **facts: Any) -> int:
        """The rank for one more capture, with its provenance entry."""
        rank = len(self.sources)
        self.sources.append({"rank": rank, "format": fmt, "path": path, **facts})
        return rank

    def note(self, rank: int, **facts: Any) -> None:
        """Add facts to a rank's provenance entry (e.g. the device the capture was made on)."""
        self.sources[rank].update(facts)

    def warn(self, message: str) -> None:
        """Say something about a capture once, after the import (e.g. how many damaged lines were skipped)."""
        self.warnings.append(message)

    def append(self, table: str, row: tuple[Any, ...]) -> None:
        self.writer.append(table, row)
        self._since_commit += 1
        if self._since_commit >= _ROWS_PER_COMMIT:
            self.rows += self._since_commit
            self._since_commit = 0
            self.writer.commit_soon()

    def extend(self, table: str, rows: list[tuple[Any, ...]]) -> None:
        """Append many rows at once (the importers' fast path: one call per block of events)."""
        self.writer.extend(table, rows)
        self._since_commit += len(rows)
        if self._since_commit >= _ROWS_PER_COMMIT:
            self.rows += self._since_commit
            self._since_commit = 0
            self.writer.commit_soon()

    def finish(self) -> None:
        """Write the provenance and commit what is left."""
        self.rows += self._since_commit
        self._since_commit = 0
        self.writer.set_meta(IMPORTED_META_KEY, json.dumps(self.sources, sort_keys=True))
        self.writer.commit()
