"""Collectives for the TUI: by kind and message size, and per rank (time and waiting for other ranks).

In a recorded run a group's or rank's time is the time it had a call in flight, and its waiting the time it had one
waiting for the last rank's arrival (a call waits from its own arrival, `start_ns`, for `wait_ns`): asynchronous calls
waited for together overlap, and each instant counts once, as in the summary. An import's rows (one per chip's call)
are summed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.derived.text import shown
from tputrace.store.aggregates import collectives_in_flight

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


@dataclass(frozen=True)
class CollectiveGroup:
    """Collectives of one kind and message size; `bytes` and `wait_ns` are None where the trace does not have them
    (an imported capture without message sizes, or without every member's capture to measure waits from)."""

    kind: str
    bytes: int | None
    count: int
    total_ns: int  # in flight (a recorded run's calls counted once where they overlap)
    wait_ns: int | None
    bus_bandwidth: float | None
    calls_ns: int = 0  # the calls' durations summed: what the mean of a call is of

    @property
    def mean_ns(self) -> float:
        return self.calls_ns / self.count if self.count else 0.0


@dataclass(frozen=True)
class CollectiveTotals:
    """A rank's collectives together: how many, the time one was in flight, and waiting (None: not measured)."""

    count: int
    total_ns: int
    wait_ns: int | None


def collective_groups(trace: Trace, rank: int) -> list[CollectiveGroup]:
    """Collectives of `rank` by kind and size, most time first; bandwidth is the mean bus bandwidth."""
    rows = trace.sql(
        "SELECT kind, bytes, COUNT(*), COALESCE(SUM(dur_ns), 0), SUM(wait_ns), AVG(bus_bandwidth) "
        "FROM collectives WHERE rank = ? GROUP BY kind, bytes",
        (rank,),
    )
    once = _in_flight(trace, "kind, bytes", (" AND rank = ?", (rank,)))
    groups = []
    for kind, nbytes, count, calls_ns, wait_ns, bandwidth in rows:
        in_flight, waiting = once.get((kind, nbytes), (calls_ns, wait_ns or 0))
        groups.append(CollectiveGroup(shown(kind) or "?", nbytes, count, in_flight, None if wait_ns is None else waiting, bandwidth, calls_ns))
    return sorted(groups, key=lambda group: -group.total_ns)


def collective_totals(trace: Trace, rank: int) -> CollectiveTotals:
    """All of `rank`'s collectives: in a recorded run, the time any was in flight and any waited."""
    ((count, calls_ns, wait_ns),) = trace.sql(
        "SELECT COUNT(*), COALESCE(SUM(dur_ns), 0), SUM(wait_ns) FROM collectives WHERE rank = ?", (rank,))
    in_flight, waiting = _in_flight(trace, "rank", (" AND rank = ?", (rank,))).get((rank,), (calls_ns, wait_ns or 0))
    return CollectiveTotals(count, in_flight, None if wait_ns is None else waiting)


def _in_flight(trace: Trace, by: str, condition: tuple[str, tuple]) -> dict[tuple, tuple[int, int]]:
    """`collectives_in_flight` for a recorded run; empty for an import, whose rows are summed."""
    return {} if trace.meta.get("imported") else collectives_in_flight(trace, by, condition)


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
    once = _in_flight(trace, "rank", ("", ()))
    ranks = []
    for rank, count, calls_ns, wait_ns, nbytes in rows:
        in_flight, waiting = once.get((rank,), (calls_ns, wait_ns or 0))
        ranks.append(RankCollectives(rank, count, in_flight, None if wait_ns is None else waiting, nbytes))
    return ranks

