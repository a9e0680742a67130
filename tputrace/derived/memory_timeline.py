"""Chip memory over time from the `buffers` table: each buffer's lifetime, live bytes after every allocation
and free (a program's working memory as a spike at its launch), the moment of the peak and what was live then."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tputrace.store.reader import Trace

PROGRAM_TEMPORARY = "program_temporary"
HOST_CHIP = -1


def memory_place(chip: int | None) -> str:
    """Whose memory a row is: `tpu:N`, or the host's for a host-only row (chip -1, an import's host allocator)."""
    return f"tpu:{chip}" if chip is not None and chip >= 0 else "host"


KINDS = ("parameter", "gradient", "optimizer_state", "activation", "temporary", PROGRAM_TEMPORARY, "other")


@dataclass(frozen=True)
class BufferLifetime:
    """One chip buffer from allocation to free (`free_ns` None: live when the recording stopped)."""

    id: int
    chip: int
    bytes: int
    dtype: str | None
    shape: tuple[int, ...] | None
    kind: str
    frame_id: int | None
    module: str | None
    alloc_ns: int
    free_ns: int | None
    step: int

    @property
    def is_working_memory(self) -> bool:
        """A program's temporaries while it runs: a spike at `alloc_ns`, not a held buffer."""
        return self.kind == PROGRAM_TEMPORARY

    def live_at(self, t_ns: int) -> bool:
        if self.is_working_memory:
            return self.alloc_ns == t_ns
        return self.alloc_ns <= t_ns and (self.free_ns is None or self.free_ns > t_ns)


@dataclass(frozen=True)
class MemoryPeak:
    """The largest live bytes on a chip, when, and the buffers (and working memory) live then."""

    chip: int
    t_ns: int
    bytes: int
    step: int
    live: tuple[BufferLifetime, ...]


def has_buffers(trace: Trace, rank: int) -> bool:
    return trace.has_table("buffers") and trace.count("buffers", where="rank = ?", params=(rank,)) > 0


def buffer_lifetimes(trace: Trace, rank: int) -> list[BufferLifetime]:
    """Every buffer lifetime of `rank`, in allocation order (none for a file from before the table)."""
    if not trace.has_table("buffers"):
        return []
    rows = trace.sql(
        "SELECT b.buffer_id, b.chip, b.bytes, b.dtype, s.text, b.kind, b.frame_id, m.text, b.alloc_ns, b.free_ns, b.step "
        "FROM buffers b LEFT JOIN strings s ON s.id = b.shape_sid LEFT JOIN strings m ON m.id = b.module_sid "
        "WHERE b.rank = ? ORDER BY b.alloc_ns",
        (rank,),
    )
    return [
        BufferLifetime(row_id, chip if chip is not None else 0, nbytes or 0, dtype, _shape(shape), kind or "other", frame_id,
                       module, alloc_ns, free_ns, step or 0)
        for row_id, chip, nbytes, dtype, shape, kind, frame_id, module, alloc_ns, free_ns, step in rows
    ]


def _shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    return tuple(int(size) for size in text.split(",")) if text else ()


def chips_of(buffers: Iterable[BufferLifetime]) -> list[int]:
    return sorted({buffer.chip for buffer in buffers})


def live_series(buffers: Sequence[BufferLifetime], chip: int) -> list[tuple[int, int]]:
    """(time, live bytes) after each allocation and free on `chip`; a program's working memory adds a point at
    its launch with the spike and one right after without it."""
    events: list[tuple[int, int, int]] = []  # (time, order, bytes): frees and allocations, spikes
    for buffer in buffers:
        if buffer.chip != chip:
            continue
        if buffer.is_working_memory:
            events.append((buffer.alloc_ns, 1, buffer.bytes))
            continue
        events.append((buffer.alloc_ns, 0, buffer.bytes))
        if buffer.free_ns is not None:
            events.append((buffer.free_ns, 0, -buffer.bytes))
    events.sort()
    series: list[tuple[int, int]] = []
    live = 0
    for t_ns, order, nbytes in events:
        if order == 1:
            series.append((t_ns, live + nbytes))
            series.append((t_ns, live))
        else:
            live += nbytes
            series.append((t_ns, live))
    return series


def peak_of(buffers: Sequence[BufferLifetime], chip: int, *, before_ns: int | None = None) -> MemoryPeak | None:
    """The moment `chip`'s live bytes peaked (the first, if several tie), optionally only before `before_ns`."""
    best_t, best_bytes = None, -1
    for t_ns, live in live_series(buffers, chip):
        if before_ns is not None and t_ns > before_ns:
            break
        if live > best_bytes:
            best_t, best_bytes = t_ns, live
    if best_t is None:
        return None
    return moment(buffers, chip, best_t, best_bytes)


def moment(buffers: Sequence[BufferLifetime], chip: int, t_ns: int, live_bytes: int | None = None) -> MemoryPeak:
    """What was live on `chip` at `t_ns` (with the working memory of a program launched then)."""
    live = tuple(buffer for buffer in buffers if buffer.chip == chip and buffer.live_at(t_ns))
    total = sum(buffer.bytes for buffer in live) if live_bytes is None else live_bytes
    step = max((buffer.step for buffer in live if buffer.alloc_ns == t_ns), default=None)
    if step is None:
        step = max((buffer.step for buffer in live), default=0)
    return MemoryPeak(chip, t_ns, total, step, live)


def first_over(buffers: Sequence[BufferLifetime], chip: int, limit_bytes: int) -> MemoryPeak | None:
    """The first moment `chip`'s live bytes went over `limit_bytes` (where a chip of that size runs out), or None."""
    for t_ns, live in live_series(buffers, chip):
        if live > limit_bytes:
            return moment(buffers, chip, t_ns, live)
    return None


def stacked_by_kind(buffers: Sequence[BufferLifetime], chip: int, points: int = 300) -> tuple[list[int], dict[str, list[int]]]:
    """Live bytes by kind at up to `points` evenly spaced times (and the peak's time), for a stacked timeline.
    Working memory shows at the sampled time it was launched nearest to."""
    on_chip = [buffer for buffer in buffers if buffer.chip == chip]
    if not on_chip:
        return [], {}
    start = min(buffer.alloc_ns for buffer in on_chip)
    end = max(max(buffer.alloc_ns, buffer.free_ns or buffer.alloc_ns) for buffer in on_chip)
    step_ns = max(1, (end - start) // max(1, points - 1))
    times = sorted({start + index * step_ns for index in range(points)} | {end})
    peak = peak_of(on_chip, chip)
    if peak is not None:
        times = sorted(set(times) | {peak.t_ns})
    by_kind: dict[str, list[int]] = {kind: [0] * len(times) for kind in KINDS}

    for buffer in on_chip:
        series = by_kind.setdefault(buffer.kind, [0] * len(times))
        if buffer.is_working_memory:
            index = min(bisect.bisect_left(times, buffer.alloc_ns), len(times) - 1)
            series[index] = max(series[index], buffer.bytes)
            continue
        first = bisect.bisect_left(times, buffer.alloc_ns)
        last = len(times) if buffer.free_ns is None else bisect.bisect_left(times, buffer.free_ns)
        for index in range(first, last):
            series[index] += buffer.bytes
    return times, {kind: values for kind, values in by_kind.items() if any(values)}
