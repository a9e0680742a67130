"""Per-step growth: the lines whose buffers outlive the step after the one that made them, step after step
(a loss appended to a list, a cache that grows), from buffer lifetimes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from tputrace.derived.memory_timeline import BufferLifetime
from tputrace.store.reader import Trace

# Kinds that live across steps by design.
KEPT_KINDS = frozenset({"parameter", "optimizer_state", "gradient"})


@dataclass(frozen=True)
class SurvivingLine:
    """A line whose buffers, made in `steps` different steps, were still live a whole step later."""

    file: str | None
    line: int | None
    function: str | None
    module: str | None
    kind: str
    steps: int
    bytes_per_step: int
    live_at_end_bytes: int


def surviving_lines(trace: Trace, buffers: Sequence[BufferLifetime], step_ends: dict[int, int], chip: int | None = None) -> tuple[SurvivingLine, ...]:
    """Lines that made buffers outliving the end of the next step in two steps or more, most bytes first.
    `step_ends` maps each step to its end (ns since the run's start)."""
    per_line: dict[tuple[int | None, str | None, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    live_at_end: dict[tuple[int | None, str | None, str], int] = defaultdict(int)
    for buffer in buffers:
        if buffer.kind in KEPT_KINDS or buffer.is_working_memory or (chip is not None and buffer.chip != chip):
            continue
        next_end = step_ends.get(buffer.step + 1)
        if next_end is None or (buffer.free_ns is not None and buffer.free_ns <= next_end):
            continue
        key = (buffer.frame_id, buffer.module, buffer.kind)
        per_line[key][buffer.step] += buffer.bytes
        if buffer.free_ns is None:
            live_at_end[key] += buffer.bytes
    lines = []
    for (frame_id, module, kind), by_step in per_line.items():
        if len(by_step) < 2:
            continue
        source = trace.frame(frame_id)
        lines.append(SurvivingLine(source.file if source else None, source.line if source else None,
                                   source.function if source else None, module, kind, len(by_step),
                                   sum(by_step.values()) // len(by_step), live_at_end[(frame_id, module, kind)]))
    lines.sort(key=lambda line: -(line.bytes_per_step * line.steps))
    return tuple(lines)


def step_ends(trace: Trace, rank: int) -> dict[int, int]:
    return {step: end for step, end in trace.sql("SELECT step, end_ns FROM steps WHERE rank = ? AND end_ns IS NOT NULL", (rank,))}
