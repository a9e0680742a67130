"""Where importers write: one `TraceWriter`, a rank per imported capture, and the provenance list
stored as `meta.imported` (one JSON object per rank: format, path, host, device)."""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from typing import Any

from tputrace.store.writer import TraceWriter

IMPORTED_META_KEY = "imported"
# Rows appended between commits: keeps the writer's queues, and so memory, bounded however big the capture.
_ROWS_PER_COMMIT = 50_000


@dataclass
class StepClock:
    """Step boundaries of one rank (ns since its start), to give every row its step."""

    starts: list[int] = field(default_factory=list)

    def step_at(self, t_ns: int) -> int:
        """The step whose boundary is the latest at or before `t_ns` (0 before the first one)."""
        return bisect.bisect_right(self.starts, t_ns)


class ImportSink:
    """Wraps the writer: counts rows, commits every so often, and records where each rank came from."""

    def __init__(self, writer: TraceWriter) -> None:
        self.writer = writer
        self.sources: list[dict[str, Any]] = []
        self.rows = 0
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

    def append(self, table: str, row: tuple[Any, ...]) -> None:
        self.writer.append(table, row)
        self._since_commit += 1
        if self._since_commit >= _ROWS_PER_COMMIT:
            self.rows += self._since_commit
            self._since_commit = 0
            self.writer.commit()

    def extend(self, table: str, rows: list[tuple[Any, ...]]) -> None:
        """Append many rows at once (the importers' fast path: one call per block of events)."""
        self.writer.extend(table, rows)
        self._since_commit += len(rows)
        if self._since_commit >= _ROWS_PER_COMMIT:
            self.rows += self._since_commit
            self._since_commit = 0
            self.writer.commit()

    def finish(self) -> None:
        """Write the provenance and commit what is left."""
        self.rows += self._since_commit
        self._since_commit = 0
        self.writer.set_meta(IMPORTED_META_KEY, json.dumps(self.sources, sort_keys=True))
        self.writer.commit()
