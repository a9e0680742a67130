"""The user's frame around a CPU op (`FrameIndex.innermost`) is the same whichever queries came before it on the
thread: the index remembers its latest answer per thread and the times it holds for."""

from __future__ import annotations

import random

from tputrace.importers.profiler_parts import FrameIndex


def _innermost_by_search(frames: list[tuple[float, float, int, str]], ts: float, tid: int) -> str | None:
    """The frame of `tid` that holds `ts` and started latest (of those, the shortest), from every frame."""
    holding = [(start, -end, name) for start, end, thread, name in frames if thread == tid and start <= ts <= end]
    return max(holding)[2] if holding else None


def _nested_frames(generator: random.Random, tid: int) -> list[tuple[float, float, int, str]]:
    """Properly nested frames on one thread: calls that open inside their caller and end no later."""
    frames: list[tuple[float, float, int, str]] = []

    def calls(start: float, end: float, depth: int) -> None:
        at = start
        while depth < 4 and at < end - 2:
            call_start = at + generator.randint(0, 3)
            call_end = min(end, call_start + generator.randint(1, 12))
            if call_start >= call_end:
                break
            frames.append((float(call_start), float(call_end), tid, f"t{tid}.py({len(frames)}): f"))
            calls(call_start, call_end, depth + 1)
            at = call_end + generator.randint(0, 2)

    calls(0.0, 200.0, 0)
    return frames


def test_innermost_frame_does_not_depend_on_earlier_queries() -> None:
    generator = random.Random(7)
    frames = _nested_frames(generator, 1) + _nested_frames(generator, 2)
    index = FrameIndex(frames)
    times = [generator.randint(-2, 404) / 2 for _ in range(3000)]
    # Mostly in time order (as a thread's ops come), with runs of queries at one time and some going back.
    queries = sorted(times[:2000]) + times[2000:] + [ts for ts in sorted(times[:200]) for _ in range(2)]
    for number, ts in enumerate(queries):
        tid = 1 + number % 2 if number % 7 else 1
        assert index.innermost(ts, tid) == _innermost_by_search(frames, ts, tid), (ts, tid)
    assert index.innermost(10.0, 3) is None
