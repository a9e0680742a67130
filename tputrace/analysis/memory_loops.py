"""Growth in a loop without steps: a line outside the training loop's steps (after its last step, or in a run
with no steps at all, such as a validation loop) whose buffers of one shape pile up, iteration after iteration,
all live at once. Keeping each iteration's loss (`val_losses.append(loss)`) outside `torch.no_grad()` keeps its
graph too, and the graph's activations pile up with it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from tputrace.analysis.memory_growth import KEPT_KINDS
from tputrace.derived.memory_timeline import BufferLifetime
from tputrace.store.reader import Trace

MIN_ITERATIONS = 3  # buffers of one shape from one line live at once, to call it a pile-up
# Ops that make a tensor at a size the script gives them: a list of them made in a loop is kept on purpose (caches).
_FACTORY_OPS = ("aten.zeros", "aten.zero_", "aten.ones", "aten.full", "aten.fill_", "aten.empty", "aten.new_",
                "aten.randn", "aten.rand", "aten.normal_", "aten.uniform_", "aten.random_", "aten.arange")


@dataclass(frozen=True)
class PilingLine:
    """A line whose buffers, made outside the loop's steps, piled up: `iterations` of its buffers of one shape were
    live at once, `bytes_per_iteration` each time on average, `peak_bytes` of its buffers live at most."""

    frame_id: int | None
    file: str | None
    line: int | None
    function: str | None
    module: str | None
    iterations: int
    bytes_per_iteration: int
    peak_bytes: int
    last_seq: int  # the line's last op outside the loop's steps, by dispatch order (-1 when none is recorded)


def piling_lines(trace: Trace, rank: int, buffers: Sequence[BufferLifetime], loop_steps: set[int],
                 chip: int | None = None) -> tuple[PilingLine, ...]:
    """Lines outside `loop_steps` (all lines when it is empty) whose buffers of one shape were live `MIN_ITERATIONS`
    times or more at once, most bytes first; lines that only made tensors at a given size (a list of caches) left out."""
    by_line: dict[int | None, list[BufferLifetime]] = defaultdict(list)
    for buffer in buffers:
        if buffer.kind in KEPT_KINDS or buffer.is_working_memory or buffer.step in loop_steps:
            continue
        if (chip is not None and buffer.chip != chip) or buffer.frame_id is None:
            continue  # buffers of no recorded line are no line's pile-up (unrelated values together)
        by_line[buffer.frame_id].append(buffer)
    lines = []
    for frame_id, made in by_line.items():
        iterations, peak = _pile_up(made)
        if iterations < MIN_ITERATIONS or _only_factories(trace, rank, frame_id):
            continue
        source = trace.frame(frame_id)
        module = max(made, key=lambda buffer: buffer.bytes).module
        lines.append(PilingLine(frame_id, source.file if source else None, source.line if source else None,
                                source.function if source else None, module, iterations, peak // iterations, peak,
                                _last_seq(trace, rank, frame_id, loop_steps)))
    lines.sort(key=lambda line: -line.peak_bytes)
    return tuple(lines)


def _pile_up(buffers: list[BufferLifetime]) -> tuple[int, int]:
    """(the most buffers of the largest shape that piled up live at once, the most bytes of all the line's buffers
    live at once). Buffers of one shape count as one kind only when one module made them: a forward's layers each
    make one of a shape (a `Sequential` of equal widths) in a single call of the line, which is no iteration."""
    events = sorted([(buffer.alloc_ns, 1, buffer) for buffer in buffers]
                    + [(buffer.free_ns, -1, buffer) for buffer in buffers if buffer.free_ns is not None],
                    key=lambda event: (event[0], event[1]))
    live_of: dict[tuple[int, tuple[int, ...] | None, str | None], int] = defaultdict(int)
    most_of: dict[tuple[int, tuple[int, ...] | None, str | None], int] = defaultdict(int)
    live = peak = 0
    for _, change, buffer in events:
        kind = (buffer.bytes, buffer.shape, buffer.module)
        live_of[kind] += change
        most_of[kind] = max(most_of[kind], live_of[kind])
        live += change * buffer.bytes
        peak = max(peak, live)
    piled = [(kind[0], count) for kind, count in most_of.items() if count >= MIN_ITERATIONS]
    return (max(piled)[1], peak) if piled else (0, peak)


def _only_factories(trace: Trace, rank: int, frame_id: int | None) -> bool:
    if frame_id is None:
        return False
    names = [name for (name,) in trace.sql(
        "SELECT DISTINCT s.text FROM ops o JOIN strings s ON s.id = o.op_sid WHERE o.rank = ? AND o.frame_id = ?",
        (rank, frame_id))]
    return bool(names) and all(name.startswith(_FACTORY_OPS) for name in names)


def same_loop(lines: Sequence[PilingLine]) -> list[PilingLine]:
    """The lines piling up about as often as the one of most bytes (the first): the same loop's. A count may be one
    more than the iterations (a transient buffer of the shape live beside the piled ones), so within a quarter."""
    iterations = lines[0].iterations
    return [line for line in lines if abs(line.iterations - iterations) <= max(1, iterations // 4)]


def kept_value_line(lines: Sequence[PilingLine]) -> PilingLine:
    """The line whose piled-up value each iteration made last: the result the loop keeps (a loss, a score), whose
    graph keeps the earlier lines' activations alive; among the lines of the loop of most bytes (`same_loop`)."""
    return max(same_loop(lines), key=lambda line: line.last_seq)


def _last_seq(trace: Trace, rank: int, frame_id: int | None, loop_steps: set[int]) -> int:
    if frame_id is None:
        return -1
    steps = sorted(loop_steps)
    outside = f"AND step NOT IN ({', '.join('?' * len(steps))})" if steps else ""
    ((seq,),) = trace.sql(f"SELECT MAX(seq) FROM ops WHERE rank = ? AND frame_id = ? {outside}", (rank, frame_id, *steps))
    return -1 if seq is None else int(seq)
