"""Host time inside the steps that no record covers, by the source line that ran next: where a rank's own host work
sits (data loading or preprocessing in NumPy, a sleep, a Python loop), read from the gap before the first thing
the trace records after it. Compared across ranks, it names the line before which the late rank spends longer."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from tputrace.store.records import SourceLocation

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

# The tables whose rows are the host's own time with a source line (a chip's executions run beside the host's work).
HOST_TABLES = ("ops", "flushes", "compiles", "syncs", "transfers", "fallbacks", "collectives")


def gaps_by_line(trace: Trace, rank: int) -> dict[SourceLocation, int]:
    """Per source line, the uncovered host time of `rank`'s steps after the first that ended at a record of that line."""
    steps = trace.sql("SELECT start_ns, end_ns FROM steps WHERE rank = ? AND step >= 1 AND source != 'end' ORDER BY start_ns", (rank,))
    if not steps:
        return {}
    first, last = steps[0][0], steps[-1][1]
    rows: list[tuple[int, int, int | None]] = []
    for table in HOST_TABLES:
        if trace.has_table(table):
            rows.extend(trace.sql(f"SELECT start_ns, start_ns + COALESCE(dur_ns, 0), frame_id FROM {table} "
                                  "WHERE rank = ? AND start_ns BETWEEN ? AND ?", (rank, first, last)))
    rows.sort(key=lambda row: (row[0], row[1]))
    gaps: dict[SourceLocation, int] = defaultdict(int)
    covered_until, pending = first, 0
    for start, end, frame_id in rows:
        pending += max(start - covered_until, 0)
        covered_until = max(covered_until, end)
        location = trace.frame(frame_id) if frame_id is not None and pending else None
        if location is not None:  # a gap before a record without a line goes to the next one with a line
            gaps[location] += pending
            pending = 0
    return dict(gaps)


def line_of_extra_host_time(trace: Trace, late: int, others: list[int]) -> tuple[SourceLocation, int] | None:
    """The line before which rank `late` spends the most more uncovered host time than the other ranks do on average,
    with that excess in all; None without steps or excess."""
    late_gaps = gaps_by_line(trace, late)
    other_gaps = [gaps_by_line(trace, rank) for rank in others]
    if not late_gaps or not other_gaps:
        return None
    excess = {location: gap - sum(gaps.get(location, 0) for gaps in other_gaps) / len(other_gaps) for location, gap in late_gaps.items()}
    location = max(excess, key=lambda key: excess[key])
    return (location, int(excess[location])) if excess[location] > 0 else None
