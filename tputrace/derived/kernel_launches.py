"""The device time of an imported GPU capture's CPU ops: the kernels each op launched (`kernel_launches`), summed
per op name and per source line of the ops, as a GPU profiler's op table shows them beside host time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tputrace.store.records import SourceLocation

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


def kernel_ns_by_op(trace: Trace, rank: int) -> dict[str, int]:
    """Per op name, the device time of the kernels its calls launched; empty for a trace without the link."""
    if not trace.has_table("kernel_launches"):
        return {}
    return {trace.string(op_sid) or "?": int(total) for op_sid, total in trace.sql(
        "SELECT o.op_sid, SUM(k.dur_ns) FROM kernel_launches k JOIN ops o ON o.rank = k.rank AND o.seq = k.op_seq "
        "WHERE k.rank = ? GROUP BY o.op_sid", (rank,))}


def kernel_ns_by_line(trace: Trace, rank: int, limit: int) -> list[tuple[SourceLocation, int]]:
    """The `limit` source lines (the launching ops' frames) whose ops launched the most kernel time, most first."""
    if not trace.has_table("kernel_launches"):
        return []
    rows = trace.sql(
        "SELECT o.frame_id, SUM(k.dur_ns) AS total FROM kernel_launches k JOIN ops o ON o.rank = k.rank AND o.seq = k.op_seq "
        "WHERE k.rank = ? AND o.frame_id IS NOT NULL GROUP BY o.frame_id ORDER BY total DESC LIMIT ?", (rank, limit))
    lines = []
    for frame_id, total in rows:
        source = trace.frame(frame_id)
        if source is not None:
            lines.append((source, int(total)))
    return lines
