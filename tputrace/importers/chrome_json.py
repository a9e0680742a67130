"""Importing torch.profiler's Chrome/Kineto JSON (`prof.export_chrome_trace(path)`).

Two streaming passes over `traceEvents`: the first finds the capture's start and its `ProfilerStep#N`
ranges, the second writes rows. `cpu_op` events -> `ops` (shapes from `Input type`/`Input Dims`, frame the
innermost enclosing user
`python_function`, kept from the first pass: only the user's frames, not the libraries');
`kernel`/`gpu_memcpy`/`gpu_memset` events -> `programs` (one per kernel name, kind `kernel`) and
`executions` on the device (`args.device`); `[memory]` events -> `memory` samples (`Total Allocated`,
running peak) on `Device Id`; `python_function` events -> `annotations` of origin `python` with their
frame; `user_annotation` events -> `annotations` of origin `record_function`.
"""

from __future__ import annotations

import bisect
import re
from pathlib import Path
from typing import Any

from tputrace.importers.json_events import header_and_events
from tputrace.importers.sink import ImportSink, StepClock
from tputrace.importers.sources import CHROME_JSON, CaptureError

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_PYTHON_FRAME = re.compile(r"^(.*?)\((\d+)\): (.*)$")
_KERNEL_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# User frames looked at, latest-starting first, for the one enclosing an op.
_FRAME_LOOKBACK = 64


class ChromeJsonImporter:
    """Imports one torch.profiler JSON file as one rank."""

    def __init__(self, sink: ImportSink, path: Path) -> None:
        self.sink = sink
        self.path = path
        self.writer = sink.writer
        self.rank = sink.new_rank(CHROME_JSON, str(path))
        self.steps = StepClock()
        self.kernel_programs: dict[str, int] = {}
        self.frames: dict[str, int | None] = {}
        self.peak_bytes: dict[int, int] = {}

    def run(self) -> None:
        header, events = header_and_events(self.path)
        start_us: float | None = None
        end_us = 0.0
        markers: list[tuple[float, float]] = []
        devices: set[int] = set()
        user_frames: list[tuple[float, float, Any, str]] = []
        for event in events:
            ts = event.get("ts")
            if not isinstance(ts, (int, float)):
                continue
            if event.get("cat") == "python_function" and _is_user_frame(str(event.get("name", ""))):
                user_frames.append((ts, ts + _number(event.get("dur")), event.get("tid"), str(event["name"])))
            start_us = ts if start_us is None else min(start_us, ts)
            end_us = max(end_us, ts + _number(event.get("dur")))
            if event.get("ph") == "X" and _STEP.match(str(event.get("name", ""))):
                markers.append((ts, ts + _number(event.get("dur"))))
            if event.get("cat") in _KERNEL_CATEGORIES:
                devices.add(int(_args(event).get("device", 0) or 0))
        if start_us is None:
            raise CaptureError(f"{self.path} holds no timed events")
        self.start_us = start_us
        base_ns = int(header.get("baseTimeNanoseconds") or 0)
        self.steps.starts = sorted(self._ns(start) for start, _ in markers)
        for index, (start, end) in enumerate(sorted(markers)):
            self.sink.append("steps", (self.rank, index + 1, self._ns(start), self._ns(end), "imported"))
        device = "gpu" if devices else "cpu"
        self.sink.note(self.rank, device=device)
        self.writer.set_run(rank=self.rank, world_size=1, script=str(self.path), argv=[], platform=device,
                            chips=len(devices), start_unix_ns=base_ns + int(start_us * 1000),
                            end_ns=self._ns(end_us))
        self.user_frames = _FrameIndex(user_frames)
        _, events = header_and_events(self.path)
        seq = 0
        for event in events:
            if not isinstance(event.get("ts"), (int, float)):
                continue
            name = str(event.get("name", ""))
            start_ns = self._ns(event["ts"])
            if name == "[memory]":
                self._memory(_args(event), start_ns)
                continue
            if event.get("ph") != "X":
                continue
            category = event.get("cat")
            dur_ns = int(_number(event.get("dur")) * 1000)
            step = self.steps.step_at(start_ns)
            if category == "cpu_op":
                seq += 1
                args = _args(event)
                inputs = _shapes(args.get("Input type"), args.get("Input Dims"))
                frame_name = self.user_frames.innermost(event["ts"], event.get("tid"))
                self.sink.append("ops", (seq, self.rank, self.writer.intern(name),
                                         self.writer.intern(inputs) if inputs else None, None, -1, start_ns, dur_ns,
                                         self._frame(frame_name) if frame_name else None, None, step, None, None))
            elif category in _KERNEL_CATEGORIES:
                self._kernel(name, event, start_ns, dur_ns, step)
            elif category == "python_function":
                self.sink.append("annotations", (self.rank, self.writer.intern(name), "python", start_ns, dur_ns,
                                                 self._frame(name), step))
            elif category == "user_annotation" and not _STEP.match(name):
                self.sink.append("annotations", (self.rank, self.writer.intern(name), "record_function", start_ns,
                                                 dur_ns, None, step))

    def _ns(self, ts_us: float) -> int:
        return int(round((ts_us - self.start_us) * 1000))

    def _kernel(self, name: str, event: dict[str, Any], start_ns: int, dur_ns: int, step: int) -> None:
        program_id = self.kernel_programs.get(name)
        if program_id is None:
            program_id = self.kernel_programs[name] = self.writer.next_id("programs")
            name_sid = self.writer.intern(name)
            self.sink.append("programs", (program_id, self.rank, "kernel", name_sid, name_sid, None, None, None,
                                          None, None))
        chip = int(_args(event).get("device", 0) or 0)
        self.sink.append("executions", (self.rank, program_id, chip, start_ns, dur_ns, step, None))

    def _memory(self, args: dict[str, Any], t_ns: int) -> None:
        chip = int(args.get("Device Id", -1) if args.get("Device Id") is not None else -1)
        live = int(_number(args.get("Total Allocated")))
        peak = self.peak_bytes[chip] = max(self.peak_bytes.get(chip, 0), live)
        self.sink.append("memory", (self.rank, chip, t_ns, live, peak))

    def _frame(self, name: str) -> int | None:
        if name not in self.frames:
            match = _PYTHON_FRAME.match(name)
            self.frames[name] = (self.writer.frame(match.group(1), int(match.group(2)), match.group(3))
                                 if match else None)
        return self.frames[name]


class _FrameIndex:
    """The user's Python frames (torch.profiler's `python_function` events outside torch and libraries) by
    start time, to give a CPU op the innermost one that encloses it on its thread."""

    def __init__(self, frames: list[tuple[float, float, Any, str]]) -> None:
        self.frames = sorted(frames, key=lambda frame: frame[0])
        self.starts = [frame[0] for frame in self.frames]

    def innermost(self, ts: float, tid: Any) -> str | None:
        index = bisect.bisect_right(self.starts, ts)
        for start, end, frame_tid, name in reversed(self.frames[max(0, index - _FRAME_LOOKBACK):index]):
            if end >= ts and frame_tid == tid:
                return name
        return None


def _is_user_frame(name: str) -> bool:
    match = _PYTHON_FRAME.match(name)
    if match is None:
        return False
    file = match.group(1)
    return not (file.startswith(("torch/", "<")) or "site-packages" in file or "/lib/python" in file)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _args(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _shapes(types: Any, dims: Any) -> str:
    """`float[8,16], float[32]` from torch.profiler's parallel `Input type` and `Input Dims` lists."""
    if not isinstance(types, list) or not isinstance(dims, list):
        return ""
    parts = []
    for kind, shape in zip(types, dims):
        if isinstance(shape, list) and shape:
            parts.append(f"{kind}[{','.join(str(size) for size in shape)}]")
        elif kind:
            parts.append(str(kind))
    return ", ".join(parts)
