"""Growth in a loop without steps: a line outside the training loop's steps (after its last step, or in a run
with no steps at all, such as a validation loop) whose buffers of one shape pile up, iteration after iteration,
all live at once. Keeping each iteration's loss (`val_losses.append(loss)`) outside `torch.no_grad()` keeps its
graph too, and the graph's activations pile up with it.

A submodule called over the time steps inside one call of its model (an `nn.LSTMCell` stepped by the model's forward)
makes a buffer of one shape per call, all live until the backward: those calls are no iterations of the script's
loop. Its buffers count once per call of the model: calls with no op outside the model's modules between them
(the script's own lines, another model) are one call. Likewise the backward of one `loss.backward()` is one run of
its line, however many buffers of one shape its time steps keep live at once."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Sequence
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
    outer_call = _outer_calls(trace, rank)
    for frame_id, made in by_line.items():
        iterations, peak = _pile_up(made)
        if iterations >= MIN_ITERATIONS:
            iterations, peak = _pile_up(made, outer_call)
        if iterations < MIN_ITERATIONS or _only_factories(trace, rank, frame_id):
            continue
        source = trace.frame(frame_id)
        module = max(made, key=lambda buffer: buffer.bytes).module
        lines.append(PilingLine(frame_id, source.file if source else None, source.line if source else None,
                                source.function if source else None, module, iterations, peak // iterations, peak,
                                _last_seq(trace, rank, frame_id, loop_steps)))
    lines.sort(key=lambda line: -line.peak_bytes)
    return tuple(lines)


def _pile_up(buffers: list[BufferLifetime],
             outer_call: Callable[[BufferLifetime], int] | None = None) -> tuple[int, int]:
    """(the most buffers of the largest shape that piled up live at once, the most bytes of all the line's buffers
    live at once). Buffers of one shape count as one kind only when one module made them: a forward's layers each
    make one of a shape (a `Sequential` of equal widths) in a single call of the line, which is no iteration. With
    `outer_call`, a kind's buffers live at once count once per call of their model (`_outer_calls`)."""
    events = sorted([(buffer.alloc_ns, 1, buffer) for buffer in buffers]
                    + [(buffer.free_ns, -1, buffer) for buffer in buffers if buffer.free_ns is not None],
                    key=lambda event: (event[0], event[1]))
    Kind = tuple[int, tuple[int, ...] | None, str | None]
    live_of: dict[Kind, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    most_of: dict[Kind, int] = defaultdict(int)
    live = peak = 0
    for _, change, buffer in events:
        kind = (buffer.bytes, buffer.shape, buffer.module)
        calls = live_of[kind]
        call = outer_call(buffer) if outer_call is not None else buffer.id  # without it each buffer is an iteration
        calls[call] += change
        if calls[call] <= 0:
            del calls[call]
        most_of[kind] = max(most_of[kind], len(calls))
        live += change * buffer.bytes
        peak = max(peak, live)
    piled = [(kind[0], count) for kind, count in most_of.items() if count >= MIN_ITERATIONS]
    return (max(piled)[1], peak) if piled else (0, peak)


def _outer_calls(trace: Trace, rank: int) -> Callable[[BufferLifetime], int]:
    """A buffer's call of its model (the first part of its module's name), or, for a buffer of no module made at a
    line that ran autograd's backward (`loss.backward()`), its run of that line: the number of ops dispatched before
    it was made outside that model's modules (or at other lines), so that buffers of one call share a number."""
    outside: dict[tuple[str, int], list[int]] = {}
    backward_lines: list[set[int]] = []  # read once, when a buffer of no module needs it

    def ran_backward(frame_id: int | None) -> bool:
        if not backward_lines:
            backward_lines.append({int(frame) for (frame,) in trace.sql(
                "SELECT DISTINCT o.frame_id FROM ops o JOIN strings s ON s.id = o.op_sid WHERE o.rank = ? "
                "AND o.frame_id IS NOT NULL AND s.text LIKE '%\\_backward%' ESCAPE '\\'", (rank,))})
        return frame_id in backward_lines[0]

    def outer_call(buffer: BufferLifetime) -> int:
        query: tuple[str, tuple[int | str, ...]]
        if buffer.module and "." in buffer.module:
            model = buffer.module.split(".", 1)[0]
            key = (model, -1)
            query = ("SELECT o.start_ns FROM ops o LEFT JOIN strings s ON s.id = o.module_sid WHERE o.rank = ? "
                     "AND o.start_ns IS NOT NULL AND (s.text IS NULL OR (s.text != ? AND substr(s.text, 1, ?) != ?)) "
                     "ORDER BY o.start_ns", (rank, model, len(model) + 1, model + "."))
        elif not buffer.module and ran_backward(buffer.frame_id):
            key = ("", int(buffer.frame_id or 0))
            query = ("SELECT start_ns FROM ops WHERE rank = ? AND start_ns IS NOT NULL "
                     "AND (frame_id IS NULL OR frame_id != ?) ORDER BY start_ns", (rank, key[1]))
        else:
            return buffer.id  # a model or line the script calls: each call is an iteration
        if key not in outside:
            outside[key] = [int(start) for (start,) in trace.sql(*query)]
        return -1 - bisect_right(outside[key], buffer.alloc_ns)

    return outer_call


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
