"""The timeline for the TUI: how busy each lane is in each column of a window, bucketed to the lanes'
width, and the longest events in the window.

Lanes of indexed tables are bucketed in SQL. numpy is imported on first use, not before the first paint. The ops have no time index (it would cost too much of a
trace's size), so the dispatch lane reads every op's start and duration once (`op_times`, kept by the
caller for the next windows) and buckets a window's ops with numpy: a window then costs a few passes
over arrays instead of a scan of the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.derived.lanes import LANE_TABLES, Lane
from tputrace.derived.text import shown
from tputrace.store.aggregates import execution_spans_sql
from tputrace.store.records import SourceLocation

if TYPE_CHECKING:
    import numpy as np

    from tputrace.store.reader import Trace

HOST_LANES: tuple[tuple[str, str], ...] = (
    ("dispatch", "dispatch"),
    ("compile", "compile"),
    ("syncs", "sync"),
    ("transfers", "transfer"),
    ("fallbacks", "fallback"),
    ("collectives", "collective"),
)
"""Host lanes of the timeline: (lane name, lane kind). Chip lanes (kind "program") come from `executions`."""


@dataclass(frozen=True)
class LaneBusy:
    """A lane over a window (`lane.events`: its events in the window) and how busy it is in each column (0..1)."""

    lane: Lane
    busy: tuple[float, ...]


def _bucket_busy(rows: Iterable[tuple[int, int, int]], columns: int, bucket_ns: int) -> tuple[tuple[float, ...], int]:
    """Fold (bucket, busy ns clipped to the window, count) rows into per-column fractions.

    SQL puts an event's whole (clipped) time in the bucket it starts in; whatever exceeds a
    bucket's width carries into the next ones, which is exact for events that do not overlap.
    """
    busy = [0.0] * columns
    events = 0
    for bucket, busy_ns, count in rows:
        if bucket is None:
            continue
        busy[min(max(int(bucket), 0), columns - 1)] += float(busy_ns or 0)
        events += count
    carry = 0.0
    for index in range(columns):
        total = busy[index] + carry
        busy[index] = min(total, bucket_ns)
        carry = total - busy[index]
    return tuple(value / bucket_ns for value in busy), events


@dataclass(frozen=True)
class OpTimes:
    """Every op of a rank with a start: its start and duration (NULL as 0), in file order, and its rowid
    (`rowids`, or, where those are the rowids `first_rowid`, `first_rowid + 1`, ... without gaps, None)."""

    starts_ns: np.ndarray
    durs_ns: np.ndarray
    rowids: np.ndarray | None = None
    first_rowid: int = 0

    def overlapping(self, start_ns: int, end_ns: int) -> np.ndarray:
        """Indexes of the ops that overlap [start_ns, end_ns] as the SQL lanes count it (start before the
        end, finish at or after the start)."""
        import numpy as np

        return np.flatnonzero((self.starts_ns < end_ns) & (self.starts_ns + self.durs_ns >= start_ns))

    def rowids_of(self, indexes: np.ndarray) -> list[int]:
        return (self.rowids[indexes] if self.rowids is not None else indexes + self.first_rowid).tolist()


def op_times(trace: Trace, rank: int) -> OpTimes | None:
    """The ops' times for `timeline_lanes` and `window_events` (None where the columns are not all integers:
    those then scan the table)."""
    from tputrace.derived.op_columns import read_op_columns

    columns = read_op_columns(trace, rank, {"start": "start_ns", "dur": "COALESCE(dur_ns, 0)"})
    return None if columns is None else times_from_columns(trace, rank, columns["start"], columns["dur"])


def times_from_columns(trace: Trace, rank: int, starts_ns: np.ndarray, durs_ns: np.ndarray) -> OpTimes | None:
    """`OpTimes` from the rank's start (NULL as `NULL_VALUE`) and duration (NULL as 0) columns, read in file order."""
    from tputrace.derived.op_columns import NULL_VALUE, read_op_columns

    (low,), = trace.sql("SELECT MIN(rowid) FROM ops")
    (high,), = trace.sql("SELECT MAX(rowid) FROM ops")
    timed = starts_ns != NULL_VALUE
    if len(starts_ns) and len(starts_ns) == high - low + 1 and timed.all():  # every row the rank's, no gaps
        return OpTimes(starts_ns, durs_ns, None, low)
    read = read_op_columns(trace, rank, {"rowid": "rowid"})
    if read is None:
        return None
    return OpTimes(starts_ns[timed], durs_ns[timed], read["rowid"][timed])


def _dispatch_buckets(times: OpTimes, start_ns: int, end_ns: int, bucket_ns: int) -> list[tuple[int, int, int]]:
    """The dispatch lane's (bucket, busy ns, count) rows, as the SQL of `timeline_lanes` groups them."""
    import numpy as np

    from tputrace.derived.op_columns import sums_by

    inside = times.overlapping(start_ns, end_ns)
    if len(inside) == len(times.starts_ns):  # the whole run: no copies
        starts, finishes = times.starts_ns, times.starts_ns + times.durs_ns
    else:
        starts, finishes = times.starts_ns[inside], times.starts_ns[inside] + times.durs_ns[inside]
    begins = np.maximum(starts, start_ns)
    buckets = (begins - start_ns) // bucket_ns
    if not len(buckets):
        return []
    size = int(buckets.max()) + 1
    busy = sums_by(buckets, np.minimum(finishes, end_ns) - begins, size)
    counts = np.bincount(buckets, minlength=size)
    present = np.flatnonzero(counts)
    return list(zip(present.tolist(), busy[present].tolist(), counts[present].tolist()))


def _execution_buckets(trace: Trace, rank: int, start_ns: int, end_ns: int, bucket_ns: int
                       ) -> dict[int, list[tuple[int, int, int]]]:
    """Each chip's (bucket, busy ns, count) rows for the window: each execution from where its chip's earlier ones
    end (`execution_spans_sql`), so that the lane's time is the chip's time with a program in flight, each piece in
    the bucket it fell in."""
    chip_rows: dict[int, list[tuple[int, int, int]]] = {}
    for chip, begin_ns, run_end_ns in trace.sql(
        f"SELECT chip, begin_ns, end_ns FROM ({execution_spans_sql('rank = ? AND start_ns < ? AND start_ns + dur_ns >= ?', 'chip')}) "
        "ORDER BY chip, begin_ns",
        (rank, end_ns, start_ns),
    ):
        begin_ns = max(begin_ns, start_ns)
        rows = chip_rows.setdefault(chip, [])
        rows.append(((begin_ns - start_ns) // bucket_ns, 0, 1))
        finish_ns = min(run_end_ns, end_ns)
        while begin_ns < finish_ns:  # split at the buckets' edges, so that the time falls where it was spent
            bucket_index = (begin_ns - start_ns) // bucket_ns
            piece_end_ns = min(finish_ns, start_ns + (bucket_index + 1) * bucket_ns)
            rows.append((bucket_index, piece_end_ns - begin_ns, 0))
            begin_ns = piece_end_ns
    return chip_rows


def timeline_lanes(trace: Trace, rank: int, start_ns: int, end_ns: int, columns: int,
                   times: OpTimes | None = None) -> list[LaneBusy]:
    """Host lanes (dispatch, compile, syncs, transfers, fallbacks, collectives) and one lane per chip
    (program executions) for the window [start_ns, end_ns), `columns` wide; the dispatch lane from
    `times` when given."""
    columns = max(int(columns), 1)
    span = max(int(end_ns) - int(start_ns), 1)
    bucket_ns = max(-(-span // columns), 1)
    clip = "MIN(start_ns + COALESCE(dur_ns, 0), ?) - MAX(start_ns, ?)"
    bucket = "(MAX(start_ns, ?) - ?) / ?"
    params = (start_ns, start_ns, bucket_ns, end_ns, start_ns, rank, end_ns, start_ns)
    lanes = []
    for name, kind in HOST_LANES:
        table = LANE_TABLES[kind]
        hint = " NOT INDEXED" if table == "ops" else ""
        if table == "ops" and times is not None:
            busy, events = _bucket_busy(_dispatch_buckets(times, int(start_ns), int(end_ns), bucket_ns), columns, bucket_ns)
            lanes.append(LaneBusy(Lane(name, kind, rank, None, events), busy))
            continue
        rows = trace.sql(
            f"SELECT {bucket} AS b, SUM({clip}), COUNT(*) FROM {table}{hint} WHERE rank = ? AND start_ns < ? "
            "AND start_ns + COALESCE(dur_ns, 0) >= ? GROUP BY b",
            params,
        )
        busy, events = _bucket_busy(rows, columns, bucket_ns)
        lanes.append(LaneBusy(Lane(name, kind, rank, None, events), busy))
    chip_rows = _execution_buckets(trace, rank, int(start_ns), int(end_ns), bucket_ns)
    chips = [chip for (chip,) in trace.sql("SELECT DISTINCT chip FROM executions WHERE rank = ? ORDER BY chip", (rank,))]
    for chip in chips:
        busy, events = _bucket_busy(chip_rows.get(chip, []), columns, bucket_ns)
        lanes.append(LaneBusy(Lane(f"tpu:{chip} exec", "program", rank, chip, events), busy))
    return lanes


@dataclass(frozen=True)
class WindowEvent:
    """One of the longest events in a timeline window."""

    lane: str
    start_ns: int
    dur_ns: int
    label: str
    source: SourceLocation | None


def window_events(trace: Trace, rank: int, start_ns: int, end_ns: int, *, limit: int = 12,
                  times: OpTimes | None = None) -> list[WindowEvent]:
    """The `limit` longest events overlapping the window, across the timeline's tables; the ops' from
    `times` when given."""
    queries = {
        "dispatch": ("SELECT start_ns, dur_ns, op_sid, frame_id FROM ops NOT INDEXED", "string"),
        "compile": ("SELECT start_ns, dur_ns, name_sid, frame_id FROM compiles", "string"),
        "syncs": ("SELECT start_ns, dur_ns, kind, frame_id FROM syncs", "text"),
        "transfers": ("SELECT start_ns, dur_ns, direction || ' ' || bytes || ' B', frame_id FROM transfers", "text"),
        "fallbacks": ("SELECT start_ns, dur_ns, op_sid, frame_id FROM fallbacks", "string"),
        "collectives": ("SELECT start_ns, dur_ns, kind || ' ' || bytes || ' B', frame_id FROM collectives", "text"),
        "exec": ("SELECT start_ns, dur_ns, (SELECT name_sid FROM programs WHERE programs.id = program_id), NULL FROM executions", "string"),
    }
    events = []
    for lane, (select, label_kind) in queries.items():
        if lane == "dispatch" and times is not None:
            import numpy as np

            inside = times.overlapping(start_ns, end_ns)
            durations = times.durs_ns[inside]
            if 0 < limit < len(inside):  # the ops at least as long as the limit-th longest, then those in order
                kept = durations >= np.partition(durations, len(durations) - int(limit))[len(durations) - int(limit)]
                inside, durations = inside[kept], durations[kept]
            longest = inside[np.lexsort((times.starts_ns[inside], -durations))[:int(limit)]]
            rowids = times.rowids_of(longest)
            rows = trace.sql(f"SELECT start_ns, dur_ns, op_sid, frame_id FROM ops WHERE rowid IN ({', '.join('?' * len(rowids))})", rowids)
        else:
            rows = trace.sql(
                f"{select} WHERE rank = ? AND start_ns < ? AND start_ns + COALESCE(dur_ns, 0) >= ? ORDER BY dur_ns DESC LIMIT ?",
                (rank, end_ns, start_ns, int(limit)),
            )
        for event_start, dur_ns, label, frame_id in rows:
            text = trace.string(label) if label_kind == "string" else shown(label)
            events.append(WindowEvent(lane, event_start, dur_ns or 0, str(text) if text is not None else "?", trace.frame(frame_id)))
    events.sort(key=lambda event: (-event.dur_ns, event.start_ns))
    return events[:limit]

