"""The device kernels of an imported GPU (or MTIA) capture, by device time: what a GPU profiler's kernel table shows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

KERNEL_NAME_CHARS = 90  # C++ kernel names run to hundreds of characters of template arguments


@dataclass(frozen=True)
class KernelStat:
    """One kernel (a `programs` row of kind kernel): its runs and their device time, and its share of all kernels'."""

    name: str
    calls: int
    total_ns: int
    share: float


def top_kernels(trace: Trace, rank: int, limit: int) -> tuple[KernelStat, ...]:
    """The `limit` kernels of `rank` that ran longest in all; none for a trace without kernels."""
    rows = trace.sql(
        "SELECT p.name_sid, COUNT(*), COALESCE(SUM(e.dur_ns), 0) FROM executions e JOIN programs p ON p.id = e.program_id "
        "WHERE e.rank = ? AND p.kind = 'kernel' GROUP BY p.id", (rank,))
    all_ns = sum(total for _, _, total in rows)
    ranked = sorted(rows, key=lambda row: -row[2])[:limit]
    return tuple(KernelStat(short_kernel_name(trace.string(name_sid) or "?"), calls, total, total / all_ns if all_ns else 0.0)
                 for name_sid, calls, total in ranked)


def short_kernel_name(name: str) -> str:
    """A kernel's name cut to `KERNEL_NAME_CHARS`, its end marked."""
    return name if len(name) <= KERNEL_NAME_CHARS else name[:KERNEL_NAME_CHARS - 1] + "…"
