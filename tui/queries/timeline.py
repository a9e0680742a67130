"""The timeline for the TUI: how busy each lane is in each column of a window, bucketed in SQL to the
lanes' width (a window over a million ops costs one grouped scan per lane), and the longest events in
the window."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.derived.lanes import LANE_TABLES, Lane
from tputrace.derived.text import shown
from tputrace.store.records import SourceLocation

if TYPE_CHECKING:
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


def timeline_lanes(trace: Trace, rank: int, start_ns: int, end_ns: int, columns: int) -> list[LaneBusy]:
    """Host lanes (dispatch, compile, syncs, transfers, fallbacks, collectives) and one lane per chip
    (program executions) for the window [start_ns, end_ns), `columns` wide."""
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
        rows = trace.sql(
            f"SELECT {bucket} AS b, SUM({clip}), COUNT(*) FROM {table}{hint} WHERE rank = ? AND start_ns < ? "
            "AND start_ns + COALESCE(dur_ns, 0) >= ? GROUP BY b",
            params,
        )
        busy, events = _bucket_busy(rows, columns, bucket_ns)
        lanes.append(LaneBusy(Lane(name, kind, rank, None, events), busy))
    chip_rows: dict[int, list[tuple[int, int, int]]] = {}
    for chip, bucket_index, busy_ns, count in trace.sql(
        f"SELECT chip, {bucket} AS b, SUM({clip}), COUNT(*) FROM executions WHERE rank = ? AND start_ns < ? "
        "AND start_ns + COALESCE(dur_ns, 0) >= ? GROUP BY chip, b",
        params,
    ):
        chip_rows.setdefault(chip, []).append((bucket_index, busy_ns, count))
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


def window_events(trace: Trace, rank: int, start_ns: int, end_ns: int, *, limit: int = 12) -> list[WindowEvent]:
    """The `limit` longest events overlapping the window, across the timeline's tables."""
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
        for event_start, dur_ns, label, frame_id in trace.sql(
            f"{select} WHERE rank = ? AND start_ns < ? AND start_ns + COALESCE(dur_ns, 0) >= ? "
            "ORDER BY dur_ns DESC LIMIT ?",
            (rank, end_ns, start_ns, int(limit)),
        ):
            text = trace.string(label) if label_kind == "string" else shown(label)
            events.append(WindowEvent(lane, event_start, dur_ns or 0, str(text) if text is not None else "?", trace.frame(frame_id)))
    events.sort(key=lambda event: (-event.dur_ns, event.start_ns))
    return events[:limit]

