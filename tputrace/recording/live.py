"""What `tputrace run`'s live output shows while the script runs: the compiles with their reasons as
they happen, host syncs, and the last step's time. Kept by the recorder, read by the status thread."""

from __future__ import annotations

import threading
from collections import deque

# Compiles kept for the live output between two reads; older ones are counted, not kept.
MAX_KEPT_COMPILES = 64
MAX_REASON_CHARS = 120


class LiveNotes:
    """Compiles (numbered from 1, with their reason), syncs and the last step's duration so far."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._compiles: deque[tuple[int, str]] = deque(maxlen=MAX_KEPT_COMPILES)
        self.compile_count = 0
        self.sync_count = 0
        self.last_step_ns: int | None = None

    def compiled(self, op_name: str, reason: str, diff: str | None) -> None:
        """A compile: `reason` "first" for a program's first, else a recompile with `diff`, what changed."""
        if reason == "first":
            text = f"compile: {op_name}"
        else:
            changed = " ".join((diff or reason).split())
            if len(changed) > MAX_REASON_CHARS:
                changed = changed[: MAX_REASON_CHARS - 1] + "…"
            text = f"recompile: {op_name} ({changed})"
        with self._lock:
            self.compile_count += 1
            self._compiles.append((self.compile_count, text))

    def synced(self) -> None:
        self.sync_count += 1

    def step_ended(self, duration_ns: int) -> None:
        self.last_step_ns = duration_ns

    def compiles_after(self, number: int) -> tuple[list[str], int]:
        """The compiles numbered above `number` still kept, and the number of the last compile."""
        with self._lock:
            return [text for index, text in self._compiles if index > number], self.compile_count
