"""The parts of a torch.profiler trace's rows that need more than one event: the CPU ops open on each thread (an
op's self time is its duration less its children's), the user's Python frames around an op, and input shapes
from the parallel `Input type` and `Input Dims` lists."""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Callable
from typing import Any


# A CPU op (or torch.compile range) still open on its thread, as a list (made and read in the importer's per-event
# loop, where a list costs a fraction of an object's `__init__`): its end and start (us), its row (None for a compile
# range and the ops run inside one), the time of its direct children (which its own, self, time leaves out), and a
# compile range's event and compile id.
OpenOp = list
END_US, START_US, ROW, CHILD_US, COMPILE_EVENT, COMPILE_ID = range(6)


def open_op(end_us: float, start_us: float, row: list[Any] | None,
            compile_event: tuple[str, int, int, int, int | None] | None = None) -> OpenOp:
    """An open op's entry; `row` None for a torch.compile range (`compile_event`) and the ops run inside one."""
    return [end_us, start_us, row, 0.0, compile_event, None]


class Nesting:
    """The CPU ops open on each thread. torch.profiler nests ops (`aten::linear` holds `aten::addmm`); each
    becomes an `ops` row with its self time, so that the rows of a thread do not overlap and their sum is the
    time the thread spent in ops. Events of a thread come in start order; one that does not is taken as
    top-level. torch.compile ranges call `on_compile` when they close."""

    def __init__(self, on_compile: Any) -> None:
        self.stacks: dict[Any, list[OpenOp]] = {}
        self.last_start: dict[Any, float] = {}
        self.on_compile = on_compile

    def open_on(self, tid: Any, ts: float, rows: list[tuple[Any, ...]]) -> list[OpenOp]:
        """The ops still open on `tid` at `ts` (closing, into `rows`, those that ended before it)."""
        stack = self.stacks.get(tid)
        if stack is None:
            stack = self.stacks[tid] = []
        elif ts < self.last_start[tid]:
            while stack:
                self._close(stack, rows)
        self.last_start[tid] = ts
        while stack and stack[-1][0] <= ts:  # `_close`, inline (every op closes here or at the end)
            _, _, row, child_us, compile_event, compile_id = stack.pop()
            if row is not None:
                if child_us or row[7] < 0:
                    row[7] = max(0, row[7] - round(child_us * 1000))
                rows.append(tuple(row))
            elif compile_event is not None:
                self.on_compile(compile_event, compile_id)
        return stack

    def push(self, tid: Any, item: OpenOp) -> None:
        stack = self.stacks[tid]
        if stack:
            parent = stack[-1]
            parent[CHILD_US] += min(item[END_US], parent[END_US]) - item[START_US]
        stack.append(item)

    def name_compile(self, tid: Any, compile_id: str) -> None:
        """Give the innermost open torch.compile range of `tid` its compile id (from its `…_data` annotation)."""
        for item in reversed(self.stacks.get(tid, [])):
            if item[COMPILE_EVENT] is not None:
                item[COMPILE_ID] = item[COMPILE_ID] or compile_id
                return

    def close_all(self, rows: list[tuple[Any, ...]]) -> None:
        for stack in self.stacks.values():
            while stack:
                self._close(stack, rows)

    def _close(self, stack: list[OpenOp], rows: list[tuple[Any, ...]]) -> None:
        _, _, row, child_us, compile_event, compile_id = stack.pop()
        if row is not None:
            row[7] = max(0, row[7] - round(child_us * 1000))
            rows.append(tuple(row))
        elif compile_event is not None:
            self.on_compile(compile_event, compile_id)


class FrameIndex:
    """The user's Python frames (torch.profiler's `python_function` events outside torch and libraries) by
    thread and start time, to give a CPU op the innermost one that encloses it on its thread: the latest
    frame started at or before the op, else the nearest of its callers (the frames still open when it
    started) that has not ended by then."""

    def __init__(self, frames: list[tuple[float, float, Any, str]]) -> None:
        by_thread: dict[Any, list[tuple[float, float, str]]] = {}
        for start, end, tid, name in sorted(frames, key=lambda frame: (frame[0], -frame[1])):
            by_thread.setdefault(tid, []).append((start, end, name))
        self.starts = {tid: [frame[0] for frame in thread] for tid, thread in by_thread.items()}
        self.ends = {tid: [frame[1] for frame in thread] for tid, thread in by_thread.items()}
        self.names = {tid: [frame[2] for frame in thread] for tid, thread in by_thread.items()}
        self.callers = {tid: _callers(thread) for tid, thread in by_thread.items()}
        # Per thread, the latest answer and the times [from, until] it holds for: queries come mostly in time order,
        # and consecutive ops of a thread mostly share their frame.
        self.latest: dict[Any, tuple[float, float, str | None]] = {}

    def first_after(self, ts: float, tid: Any, until: float) -> str | None:
        """The first frame of `tid` that starts in [ts, until): after a Dynamo compile that left no compiled code, the
        function it was compiling, run as written."""
        starts = self.starts.get(tid)
        if starts is None:
            return None
        position = bisect.bisect_left(starts, ts)
        return self.names[tid][position] if position < len(starts) and starts[position] < until else None

    def enclosing_end(self, ts: float, tid: Any) -> float:
        """The end of the innermost frame of `tid` open at `ts` (infinite where none is)."""
        starts = self.starts.get(tid)
        if starts is None:
            return math.inf
        position = bisect.bisect_right(starts, ts) - 1
        ends, callers = self.ends[tid], self.callers[tid]
        while position >= 0 and ends[position] < ts:
            position = callers[position]
        return ends[position] if position >= 0 else math.inf

    def innermost(self, ts: float, tid: Any) -> str | None:
        latest = self.latest.get(tid)
        if latest is not None and latest[0] <= ts <= latest[1]:
            return latest[2]
        starts = self.starts.get(tid)
        if starts is None:
            return None
        position = bisect.bisect_right(starts, ts) - 1
        # The same frames start at or before any time before the next start, and those skipped below stay ended.
        until = starts[position + 1] if position + 1 < len(starts) else math.inf
        ends = self.ends[tid]
        callers = self.callers[tid]
        while position >= 0 and ends[position] < ts:
            position = callers[position]
        name = self.names[tid][position] if position >= 0 else None
        if position >= 0 and ends[position] < until:
            self.latest[tid] = (ts, ends[position], name)
        else:
            self.latest[tid] = (ts, math.nextafter(until, -math.inf), name)
        return name


def module_paths(ranges: list[tuple[float, float, Any, str]]) -> list[tuple[float, float, Any, str]]:
    """Each `nn.Module` range (torch.profiler's `python_function` event `nn.Module: Linear_0`, by its Python tracer,
    `with_stack`) with its path: the names of the module ranges it ran inside on its thread, outermost first
    (`Net_0.Block_0.Linear_0`), as tputrace's own recordings name an op's module by its path from the model."""
    by_thread: dict[Any, list[tuple[float, float, str]]] = {}
    for start, end, tid, name in sorted(ranges, key=lambda item: (item[0], -item[1])):
        by_thread.setdefault(tid, []).append((start, end, name))
    paths = []
    for tid, thread in by_thread.items():
        named: list[str] = []
        for (start, end, name), caller in zip(thread, _callers(thread)):
            named.append(f"{named[caller]}.{name}" if caller >= 0 else name)
            paths.append((start, end, tid, named[-1]))
    return paths


def call_stack_frame(stack: Any, is_user: Callable[[str], bool]) -> str | None:
    """The innermost user frame of an op's `Call stack` arg (torch.profiler's `with_stack` before its Python tracer, and
    TorchScript's stacks: `/path/train.py(12): step;/path/train.py(30): <module>`, innermost first), whose line is
    where the frame was (the call's line), not its function's first; None where it holds none."""
    if stack.__class__ is not str or not stack:
        return None
    return next((frame for frame in stack.split(";") if is_user(frame)), None)


def _callers(frames: list[tuple[float, float, str]]) -> list[int]:
    """For each frame (by start), the position of the latest-started frame still open when it started, or -1."""
    callers = []
    open_frames: list[int] = []
    for position, (start, _, _) in enumerate(frames):
        while open_frames and frames[open_frames[-1]][1] < start:
            open_frames.pop()
        callers.append(open_frames[-1] if open_frames else -1)
        open_frames.append(position)
    return callers


class Shapes:
    """`float[8,16], float[32]` from torch.profiler's parallel `Input type` and `Input Dims` lists, remembered
    per distinct pair of lists."""

    def __init__(self) -> None:
        self.known: dict[Any, str] = {}

    def __call__(self, types: Any, dims: Any) -> str:
        if types.__class__ is not list or dims.__class__ is not list:
            return ""
        try:
            # One flat tuple: the types (JSON scalars), then each dims entry as a tuple and its type (no tuple or type
            # comes from JSON, so the parts cannot run into each other).
            key: Any = (*types, *map(tuple, dims), *map(type, dims))
            text = self.known.get(key)
        except TypeError:  # unhashable or scalar entries
            key = f"{types!r}{dims!r}"
            text = self.known.get(key)
        if text is None:
            text = self.known[key] = _shapes(types, dims)
        return text


def _shapes(types: list[Any], dims: list[Any]) -> str:
    parts = []
    for kind, shape in zip(types, dims):
        if isinstance(shape, list) and shape:
            parts.append(f"{kind}[{','.join(str(size) for size in shape)}]")
        elif kind:
            parts.append(str(kind))
    return ", ".join(parts)


class OpSpans:
    """The CPU ops of each thread as (start, end, seq), to find the op that launched a kernel: the innermost op
    around its runtime call (`cudaLaunchKernel`) on the call's thread. Kineto writes the runtime calls after the
    ops, so every op's span is kept (in arrays, 32 bytes an op) until its file's events are read; an op that does
    not start at or after the one before it on its thread (not in start order) is left out."""

    def __init__(self) -> None:
        self.starts: dict[Any, array[float]] = {}
        self.ends: dict[Any, array[float]] = {}
        self.seqs: dict[Any, array[int]] = {}
        self.callers: dict[Any, array[int]] = {}  # the position of the op each op ran inside, or -1
        self.open: dict[Any, list[int]] = {}  # positions of the ops still open at the latest start

    def add(self, tid: Any, start_us: float, end_us: float, seq: int) -> None:
        starts = self.starts.get(tid)
        if starts is None:
            starts = self.starts[tid] = array("d")
            self.ends[tid], self.seqs[tid], self.callers[tid] = array("d"), array("q"), array("q")
            self.open[tid] = []
        elif start_us < starts[-1]:
            return
        ends, open_ops = self.ends[tid], self.open[tid]
        while open_ops and ends[open_ops[-1]] < start_us:
            open_ops.pop()
        self.callers[tid].append(open_ops[-1] if open_ops else -1)
        open_ops.append(len(starts))
        starts.append(start_us)
        ends.append(end_us)
        self.seqs[tid].append(seq)

    def innermost(self, tid: Any, start_us: float, end_us: float) -> int | None:
        """The seq of the innermost op of `tid` that holds [start_us, end_us], or None."""
        starts = self.starts.get(tid)
        if starts is None:
            return None
        ends, callers = self.ends[tid], self.callers[tid]
        position = bisect.bisect_right(starts, start_us) - 1
        while position >= 0 and ends[position] < end_us:
            position = callers[position]
        return self.seqs[tid][position] if position >= 0 else None

    def clear(self) -> None:
        for table in (self.starts, self.ends, self.seqs, self.callers, self.open):
            table.clear()



_FORWARDS_KEPT = 1 << 16
_BACKWARD_OP = "autograd::engine::evaluate_function: "


class OpModules:
    """The `nn.Module` path of each CPU op (`ops.module_sid`), from torch.profiler's module ranges (`nn.Module:
    Linear_0`, recorded by its Python tracer, `with_stack`): the path of the innermost module call around the op on
    its thread; else its parent op's (an op nested in another); else, for a backward op
    (`autograd::engine::evaluate_function: AddmmBackward0`, which runs outside any module's call), the module of the
    forward op of the same autograd `Sequence number`, which made the gradient's graph node. The latest 2^16 forward
    ops' modules are kept, each until its backward takes it."""

    def __init__(self, ranges: list[tuple[float, float, Any, str]], intern: Callable[[str], int]) -> None:
        self.index = FrameIndex(module_paths(ranges)) if ranges else None
        self.intern = intern
        self.sids: dict[str, int] = {}  # a module's path -> its string id
        self.forwards: dict[Any, int] = {}

    def module_sid(self, ts: float, tid: Any, name: str, args: Any, parent: OpenOp | None) -> int | None:
        index = self.index
        if index is None:
            return None
        latest = index.latest.get(tid)  # `FrameIndex.innermost`'s answer that still holds, inline
        path = latest[2] if latest is not None and latest[0] <= ts <= latest[1] else index.innermost(ts, tid)
        sequence = args.get("Sequence number") if args.__class__ is dict else None
        if path is not None:
            module_sid = self.sids.get(path)
            if module_sid is None:
                module_sid = self.sids[path] = self.intern(path)
            if sequence is not None and sequence not in self.forwards:
                self.forwards[sequence] = module_sid
                if len(self.forwards) > _FORWARDS_KEPT:
                    for key in list(self.forwards)[:_FORWARDS_KEPT // 2]:
                        del self.forwards[key]
            return module_sid
        parent_row = parent[ROW] if parent is not None else None
        if parent_row is not None and parent_row[9] is not None:
            return int(parent_row[9])
        if sequence is not None and name.startswith(_BACKWARD_OP):
            return self.forwards.pop(sequence, None)
        return None
