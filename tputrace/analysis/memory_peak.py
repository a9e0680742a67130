"""What holds a chip's memory at its peak: the buffers live then, by kind, module and line, summed against the
measured peak; a program's working memory under DeferAndFuse split over the ops of its flush by their output sizes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from tputrace.analysis.shapes import tensors
from tputrace.derived.memory_timeline import BufferLifetime, MemoryPeak
from tputrace.store.reader import Trace

TOP_PARTS = 12


@dataclass(frozen=True)
class PeakPart:
    """Bytes live at the peak that one line made in one module, of one kind. `estimated`: working memory of a
    fused program, shared out over its ops by their output sizes (XLA reports its temporaries as one total)."""

    kind: str
    module: str | None
    file: str | None
    line: int | None
    function: str | None
    bytes: int
    buffers: int
    estimated: bool = False

    @property
    def where(self) -> str:
        place = f"{self.file.rsplit('/', 1)[-1]}:{self.line}" if self.file is not None else "no user line"
        return f"{place} in {self.module}" if self.module else place


@dataclass(frozen=True)
class LiveBuffer:
    """One of the largest buffers live at the peak."""

    kind: str
    bytes: int
    dtype: str | None
    shape: tuple[int, ...] | None
    module: str | None
    file: str | None
    line: int | None


@dataclass(frozen=True)
class PeakBreakdown:
    """A chip's peak: when, its bytes (from buffer lifetimes and as the `memory` table measured it), and what
    was live then by kind, by module and by line (`parts`, largest first). `unattributed_bytes` is what no
    user line made (buffers made outside the user's code); `coverage` is the breakdown's sum over the measured peak."""

    chip: int
    t_ns: int
    step: int
    bytes: int
    measured_peak_bytes: int
    by_kind: tuple[tuple[str, int], ...]
    by_module: tuple[tuple[str, int], ...]
    parts: tuple[PeakPart, ...]
    largest: tuple[LiveBuffer, ...]
    unattributed_bytes: int

    @property
    def coverage(self) -> float:
        return self.bytes / self.measured_peak_bytes if self.measured_peak_bytes else 1.0


def breakdown(trace: Trace, rank: int, peak: MemoryPeak, measured_peak_bytes: int) -> PeakBreakdown:
    """`peak`'s live buffers grouped by kind, module and line, working memory shared over its program's ops."""
    parts: dict[tuple[str, str | None, int | None, bool], list[int]] = defaultdict(lambda: [0, 0])
    for buffer in peak.live:
        if buffer.is_working_memory:
            for module, frame_id, share in _working_memory_shares(trace, rank, buffer):
                entry = parts[(buffer.kind, module, frame_id, share != buffer.bytes)]
                entry[0] += share
                entry[1] += 1
            continue
        entry = parts[(buffer.kind, buffer.module, buffer.frame_id, False)]
        entry[0] += buffer.bytes
        entry[1] += 1
    located = []
    for (kind, module, frame_id, estimated), (nbytes, count) in parts.items():
        source = trace.frame(frame_id)
        located.append(PeakPart(kind, module, source.file if source else None, source.line if source else None,
                                source.function if source else None, nbytes, count, estimated))
    located.sort(key=lambda part: -part.bytes)
    by_kind: dict[str, int] = defaultdict(int)
    by_module: dict[str, int] = defaultdict(int)
    for part in located:
        by_kind[part.kind] += part.bytes
        by_module[part.module or "(no module)"] += part.bytes
    return PeakBreakdown(
        chip=peak.chip,
        t_ns=peak.t_ns,
        step=peak.step,
        bytes=peak.bytes,
        measured_peak_bytes=measured_peak_bytes,
        by_kind=tuple(sorted(by_kind.items(), key=lambda item: -item[1])),
        by_module=tuple(sorted(by_module.items(), key=lambda item: -item[1])),
        parts=tuple(located),
        largest=_largest(trace, peak.live),
        unattributed_bytes=sum(part.bytes for part in located if part.file is None),
    )


def _largest(trace: Trace, live: Sequence[BufferLifetime], limit: int = 10) -> tuple[LiveBuffer, ...]:
    ranked = sorted((buffer for buffer in live if not buffer.is_working_memory), key=lambda buffer: -buffer.bytes)[:limit]
    result = []
    for buffer in ranked:
        source = trace.frame(buffer.frame_id)
        result.append(LiveBuffer(buffer.kind, buffer.bytes, buffer.dtype, buffer.shape, buffer.module,
                                 source.file if source else None, source.line if source else None))
    return tuple(result)


def _working_memory_shares(trace: Trace, rank: int, buffer: BufferLifetime) -> list[tuple[str | None, int | None, int]]:
    """(module, frame, bytes) shares of a program's working memory: the ops of the DeferAndFuse flush launched
    then, by their output sizes; the row's own line and module where no flush holds it (a strict op's program)."""
    rows = trace.sql(
        "SELECT o.module_sid, o.frame_id, o.outputs_sid FROM flushes f JOIN ops o ON o.flush_id = f.id AND o.rank = f.rank "
        "WHERE f.rank = ? AND f.chip = ? AND f.start_ns <= ? AND f.start_ns + f.dur_ns >= ? ",
        (rank, buffer.chip, buffer.alloc_ns, buffer.alloc_ns),
    ) if trace.has_table("flushes") else []
    weights: dict[tuple[str | None, int | None], int] = defaultdict(int)
    for module_sid, frame_id, outputs_sid in rows:
        weights[(trace.string(module_sid), frame_id)] += sum(spec.nbytes for spec in tensors(trace.string(outputs_sid)))
    total = sum(weights.values())
    if not total:
        return [(buffer.module, buffer.frame_id, buffer.bytes)]
    shares = [(module, frame_id, buffer.bytes * weight // total) for (module, frame_id), weight in weights.items() if weight]
    remainder = buffer.bytes - sum(share for _, _, share in shares)
    module, frame_id, share = shares[0]
    shares[0] = (module, frame_id, share + remainder)
    return shares
