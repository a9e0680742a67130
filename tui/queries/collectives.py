"""Collectives for the TUI: by kind and message size, and per rank (time and waiting for other ranks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.derived.text import shown

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


@dataclass(frozen=True)
class CollectiveGroup:
    """Collectives of one kind and message size; `bytes` and `wait_ns` are None where the trace does not have them
    (an imported capture without message sizes, or without every member's capture to measure waits from)."""

    kind: str
    bytes: int | None
    count: int
    total_ns: int
    wait_ns: int | None
    bus_bandwidth: float | None

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.count if self.count else 0.0


def collective_groups(trace: Trace, rank: int) -> list[CollectiveGroup]:
    """Collectives of `rank` by kind and size, most time first; bandwidth is the mean bus bandwidth."""
    rows = trace.sql(
        "SELECT kind, bytes, COUNT(*), COALESCE(SUM(dur_ns), 0) AS total_ns, SUM(wait_ns), "
        "AVG(bus_bandwidth) FROM collectives WHERE rank = ? GROUP BY kind, bytes ORDER BY total_ns DESC",
        (rank,),
    )
    return [CollectiveGroup(shown(kind) or "?", nbytes, count, total_ns, wait_ns, bandwidth)
            for kind, nbytes, count, total_ns, wait_ns, bandwidth in rows]


@dataclass(frozen=True)
class RankCollectives:
    """One rank's collectives: how long they took and how much of that was waiting for other ranks; `wait_ns` and
    `bytes` are None where none of its collectives has them."""

    rank: int
    count: int
    total_ns: int
    wait_ns: int | None
    bytes: int | None


def collective_ranks(trace: Trace) -> list[RankCollectives]:
    rows = trace.sql(
        "SELECT rank, COUNT(*), COALESCE(SUM(dur_ns), 0), SUM(wait_ns), SUM(bytes) "
        "FROM collectives GROUP BY rank ORDER BY rank"
    )
    return [RankCollectives(*row) for row in rows]

