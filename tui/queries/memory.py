"""Memory for the TUI, from buffer lifetimes: live bytes over time on the chip with the highest peak, and at the
peak the bytes by kind, module and line (`tputrace.analysis.memory_peak`), with lines whose buffers survive steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.analysis.memory_growth import SurvivingLine, step_ends, surviving_lines
from tputrace.analysis.memory_peak import PeakBreakdown, breakdown
from tputrace.derived.imported_sources import imported_source
from tputrace.derived.memory_timeline import buffer_lifetimes, chips_of, live_series, peak_of

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

TIMELINE_COLUMNS = 120
BUFFERS_FORMAT_VERSION = 3
"""The first trace format with buffer lifetimes (the `buffers` table)."""


@dataclass(frozen=True)
class MemoryTables:
    """The chip with the highest peak: its live bytes in `TIMELINE_COLUMNS` time bins (the highest in each), its peak
    broken down, and the lines whose buffers outlive their step. `peak` is None for a trace without buffer lifetimes,
    and `missing` then says why and where the trace's sampled live bytes are shown."""

    chip: int
    live_columns: tuple[int, ...]
    peak: PeakBreakdown | None
    surviving: tuple[SurvivingLine, ...]
    missing: str = ""


def memory_tables(trace: Trace, rank: int) -> MemoryTables:
    buffers = buffer_lifetimes(trace, rank)
    peaks = [peak for peak in (peak_of(buffers, chip) for chip in chips_of(buffers)) if peak is not None]
    if not peaks:
        return MemoryTables(0, (), None, (), _missing_lifetimes(trace, rank))
    peak = max(peaks, key=lambda candidate: candidate.bytes)
    measured = trace.sql("SELECT MAX(peak_bytes) FROM memory WHERE rank = ? AND chip = ?", (rank, peak.chip))
    measured_bytes = measured[0][0] if measured and measured[0][0] is not None else peak.bytes
    return MemoryTables(peak.chip, _columns(live_series(buffers, peak.chip)), breakdown(trace, rank, peak, measured_bytes),
                        surviving_lines(trace, buffers, step_ends(trace, rank), peak.chip))


def _missing_lifetimes(trace: Trace, rank: int) -> str:
    """Why `rank` has no buffer lifetimes, and where its memory samples (if any) are drawn instead."""
    if imported_source(trace, rank) is not None:
        why = "this imported capture has none"
    elif trace.format_version < BUFFERS_FORMAT_VERSION:
        why = f"a format {trace.format_version} trace; recorded from format {BUFFERS_FORMAT_VERSION} on"
    else:
        why = "no buffer was allocated on the chip"
    samples = trace.sql("SELECT COUNT(*) FROM memory WHERE rank = ?", (rank,))[0][0]
    drawn = f"; its {samples:,} samples of live bytes are drawn in the Memory section of `tputrace plot`" if samples else ""
    return f"no buffer lifetimes in this trace ({why}){drawn}"


def _columns(series: list[tuple[int, int]]) -> tuple[int, ...]:
    """The highest live bytes in each of `TIMELINE_COLUMNS` equal time bins (carrying the last value over empty ones)."""
    if not series:
        return ()
    start, end = series[0][0], series[-1][0]
    span = max(1, end - start)
    columns = [-1] * TIMELINE_COLUMNS
    for t_ns, live in series:
        index = min(TIMELINE_COLUMNS - 1, (t_ns - start) * TIMELINE_COLUMNS // span)
        columns[index] = max(columns[index], live)
    last = 0
    for index, value in enumerate(columns):
        if value < 0:
            columns[index] = last
        else:
            last = value
    return tuple(columns)
