"""The ranges of a torch.profiler window that its importer's first pass reads beside the step markers: Kineto's span of
the window (its `PyTorch Profiler (N)` event), and the user's ranges, which mark the steps of a capture without
`ProfilerStep#N` markers (a `profile()` without a schedule, whose loop never calls `prof.step()`): the user's own range
around each iteration (`record_function("train_step")`), repeated one after another at the top level of the thread that
runs most ops; each step runs from the end of the range before it to the end of its own, as `ProfilerStep#N` markers do."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tputrace.importers.json_events import event_texts
from tputrace.importers.range_names import family_label, range_keys

_RANGE_TEXT = re.compile(r'"cat"\s*:\s*"(?:user_annotation|Trace)"')
_SPAN_TEXT = re.compile(r'"cat"\s*:\s*"Trace"')
# A CPU op's thread, where Kineto writes its keys in its usual order (`ph`, `cat`, `name`, `pid`, `tid`).
_OP_THREAD_TEXT = re.compile(r'"cat"\s*:\s*"cpu_op"\s*,\s*"name"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*"pid"\s*:\s*[^,]*,'
                             r'\s*"tid"\s*:\s*"?([^",\s}]*)')
_MIN_REPEATS = 2
# torch.profiler's name of a module's forward call (its Python tracer, `with_stack`): `nn.Module: Linear_0`.
MODULE_PREFIX = "nn.Module: "
# torch's own ranges, which no user opened around an iteration: `Optimizer.step#SGD.step`, `enumerate(DataLoader)#...`,
# a process group's `gloo:all_reduce`, torch.compile's `Torch-Compiled Region: 0/0`, `CompiledFunction`,
# `## Call CompiledFxGraph ... ##`, `TorchDynamo Cache Lookup`, DDP's `DistributedDataParallel.forward`.
_TORCH_RANGE = re.compile(r"#|::|^(?:gloo|nccl|mpi|ucc|xccl|hccl):|^(?:Torch-Compiled Region|CompiledFunction|TorchDynamo"
                          r"|DistributedDataParallel|DDP|entire_(?:frame|backward)_compile|ProfilerStep)")

# A user range: (start us, end us, thread, name), on its file's clock.
UserRange = tuple[float, float, Any, str]


class WindowRanges:
    """A window's user ranges, its modules' calls and Kineto's span of it (start and end, us on the file's clock; None where
    not written)."""

    def __init__(self) -> None:
        self.user: list[UserRange] = []
        self.span: tuple[float, float] | None = None
        self.modules: list[UserRange] = []  # `nn.Module: Linear_0` ranges, named `Linear_0`

    def _add_module(self, event: dict[str, Any]) -> None:
        """Read a decoded `python_function` event, if it is a module's call (`nn.Module: Linear_0`)."""
        ts, dur, name = event.get("ts"), event.get("dur"), event.get("name")
        if (isinstance(name, str) and name.startswith(MODULE_PREFIX) and isinstance(ts, (int, float))
                and isinstance(dur, (int, float))):
            self.modules.append((ts, ts + dur, event.get("tid"), name[len(MODULE_PREFIX):]))

    def scan_text(self, text: str, event_around: Callable[[str, re.Match[str]], dict[str, Any]],
                  user: bool = True) -> None:
        """Read the ranges of a block of raw text, each event decoded by `event_around`; only the window's span
        without `user` (a window with step markers, whose user ranges are not its steps). Module calls are
        `python_function` events, which the caller's own scan finds and passes to `add_event`."""
        pattern = _RANGE_TEXT if user else _SPAN_TEXT
        # Each match ends with a category's value, found with `str.find` (a pattern whose literal start, `"cat"`, is in
        # every event scans the whole block), and starts at the nearest `"cat"` before it.
        matches = []
        for value in ('"user_annotation"', '"Trace"') if user else ('"Trace"',):
            at = text.find(value)
            while at >= 0:
                start = text.rfind('"cat"', 0, at)
                match = pattern.match(text, start) if start >= 0 else None
                if match is not None and match.end() == at + len(value):
                    matches.append(match)
                at = text.find(value, at + 1)
        for match in sorted(matches, key=lambda found: found.start()):
            self.add_event(event_around(text, match))

    def add_event(self, event: dict[str, Any]) -> None:
        """Read a decoded event, if it is a complete `user_annotation` range, the window's span or a module's call."""
        ts, dur, category = event.get("ts"), event.get("dur"), event.get("cat")
        if category == "python_function":
            self._add_module(event)
            return
        if category not in ("user_annotation", "Trace") or event.get("ph") != "X" or not isinstance(ts, (int, float)) \
                or not isinstance(dur, (int, float)):
            return
        name = str(event.get("name", ""))
        if category == "Trace":
            self.span = (min(ts, self.span[0]), max(ts + dur, self.span[1])) if self.span else (ts, ts + dur)
        elif not _TORCH_RANGE.search(name):
            self.user.append((ts, ts + dur, event.get("tid"), name))

    def recorded_us(self, first_us: float, end_us: float) -> float:
        """The window's recorded time: Kineto's span of it, else from its first event (`first_us`) to `end_us`."""
        return self.span[1] - self.span[0] if self.span else end_us - first_us


def choose(windows: list[WindowRanges], paths: Iterable[Path]) -> tuple[str, list[list[tuple[float, float, None]]]] | None:
    """The name of the range taken as the steps, and each window's steps (start, end, no number), from each window's
    user ranges: of the ranges repeated (one name, or names that differ only in their numbers, `batch_{i}`; at least
    twice) at the top level of a thread, one after another, those of the thread that runs most ops (counted in `paths`
    only where several threads have such ranges), and of them the name covering the most time. None where no range
    repeats."""
    top = [_top_level(window.user) for window in windows]
    keys = {tid: range_keys(name for ranges in top for _, _, other, name in ranges if other == tid)
            for tid in {tid for ranges in top for _, _, tid, _ in ranges}}
    candidates: dict[tuple[Any, str], list[float]] = {}  # (thread, name's key) -> [occurrences, time covered]
    for ranges in top:
        for start, end, tid, name in ranges:
            entry = candidates.setdefault((tid, keys[tid][name]), [0, 0.0])
            entry[0] += 1
            entry[1] += end - start
    candidates = {key: entry for key, entry in candidates.items() if entry[0] >= _MIN_REPEATS}
    if not candidates:
        return None
    threads = {tid for tid, _ in candidates}
    if len(threads) > 1:
        ops = ops_per_thread(paths)
        main = max(threads, key=lambda tid: (ops.get(str(tid), 0), max(entry[1] for (other, _), entry in
                                                                       candidates.items() if other == tid)))
        candidates = {key: entry for key, entry in candidates.items() if key[0] == main}
    tid, family = max(candidates, key=lambda key: (candidates[key][1], candidates[key][0]))
    chosen = [[(start, end, name) for start, end, other, name in ranges if other == tid and keys[tid][name] == family]
              for ranges in top]
    steps = [_contiguous([(start, end) for start, end, _ in ranges]) for ranges in chosen]
    return family_label(name for ranges in chosen for _, _, name in ranges), steps


def _contiguous(ranges: list[tuple[float, float]]) -> list[tuple[float, float, None]]:
    """Steps from a window's occurrences of the step range, as `ProfilerStep#N` markers divide a loop: each step ends
    where its range ends (where `prof.step()` would be called), and every step after the first starts where the one
    before it ended, so that the work between two ranges (loading the next batch) is in the step it prepares. The
    first step starts with its range: what ran before it is not told from the loop's setup."""
    return [(previous_end if index else start, end, None)
            for index, ((start, end), previous_end) in enumerate(zip(ranges, [0.0] + [end for _, end in ranges]))]


def _top_level(ranges: list[UserRange]) -> list[UserRange]:
    """The ranges that start after the previous top-level range of their thread has ended (not inside it, nor
    overlapping it), in time order."""
    top: list[UserRange] = []
    open_end: dict[Any, float] = {}  # thread -> the end of its latest top-level range
    for start, end, tid, name in sorted(ranges, key=lambda item: (item[0], -item[1])):
        if start >= open_end.get(tid, float("-inf")):
            open_end[tid] = end
            top.append((start, end, tid, name))
    return top


def ops_per_thread(paths: Iterable[Path]) -> Counter[str]:
    """How many CPU ops each thread (its `tid` as text) runs in the files' raw text."""
    counts: Counter[str] = Counter()
    for path in paths:
        for text in event_texts(path):
            counts.update(_OP_THREAD_TEXT.findall(text))
    return counts
