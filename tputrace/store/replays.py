"""Step replay as a trace recorded it (`flushes.replay`, `flushes.replay_break`): how many DeferAndFuse flushes
replayed the graph flushed at the same point of the loop before, and where and why replay broke."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from tputrace.store.aggregates import rank_filter


class ReplayQueries(Protocol):
    """What `replay_stats` reads from a trace (`tputrace.store.reader.Trace` is one)."""

    def sql(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]: ...

    def string(self, sid: int | None) -> str | None: ...

    def has_column(self, table: str, column: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class ReplayBreak:
    """Flushes whose replay broke for one reason: the first step it happened in, and how often."""

    reason: str
    first_step: int
    trigger: str | None
    count: int


@dataclass(frozen=True, slots=True)
class ReplayStats:
    """Replay over a trace's flushes that had it on (`replay` not NULL)."""

    flushes: int
    held: int
    broke: int
    breaks: tuple[ReplayBreak, ...]  # by first step

    @property
    def text(self) -> str:
        """E.g. 'replayed 40 of 44 flushes; broke 2 times, first in step 4: op 12 (aten.mm.default): ...'."""
        line = f"replayed {self.held} of {self.flushes} flushes"
        if not self.breaks:
            return line
        first = self.breaks[0]
        times = "once" if self.broke == 1 else f"{self.broke} times"
        line += f"; broke {times}, first in step {first.first_step}: {first.reason}"
        if len(self.breaks) > 1:
            line += f" (and {len(self.breaks) - 1} other reasons)" if len(self.breaks) > 2 else " (and 1 other reason)"
        return line


def replay_stats(trace: ReplayQueries, *, rank: int | None = None) -> ReplayStats | None:
    """Replay counts of `rank` (every rank: None); None where no flush says (replay off, a strict-mode run, a file
    written before `flushes.replay`)."""
    if not trace.has_column("flushes", "replay"):
        return None
    where, params = rank_filter(rank, prefix="AND ")
    counts = dict(trace.sql(f"SELECT replay, COUNT(*) FROM flushes WHERE replay IS NOT NULL{where} GROUP BY replay", params))
    total = sum(counts.values())
    if not total:
        return None
    rows = trace.sql(
        "SELECT replay_break_sid, MIN(COALESCE(step, 0)) AS first_step, MIN(trigger), COUNT(*) FROM flushes "
        f"WHERE replay = 'broke'{where} GROUP BY replay_break_sid ORDER BY first_step, MIN(id)",
        params,
    )
    breaks = tuple(ReplayBreak(trace.string(sid) or "not recorded", first_step, trigger, count) for sid, first_step, trigger, count in rows)
    return ReplayStats(total, counts.get("held", 0), counts.get("broke", 0), breaks)
