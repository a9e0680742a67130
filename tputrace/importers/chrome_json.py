"""Importing torch.profiler's Chrome/Kineto JSON (`prof.export_chrome_trace(path)`).

Two streaming passes over `traceEvents`. The first scans the raw text with regular expressions (no JSON
decoding): the capture's start (the earliest `ts`), its `ProfilerStep#N` ranges and the user's Python
frames (only those events are decoded); where the text does not have the expected shape it decodes the
events instead. The second decodes the events a block at a time and writes rows. `cpu_op` events ->
`ops` (shapes from `Input type`/`Input Dims`, frame the innermost enclosing user `python_function`: only
the user's frames, not the libraries'); `kernel`/`gpu_memcpy`/`gpu_memset` events (and other devices' and
older Kineto's names for them, see `kineto`) -> `programs` (one per kernel name, kind `kernel`) and
`executions` on the device (`args.device`) in their launch's step; NCCL kernels and `record_param_comms`
ops whose args name a collective -> `collectives`; runtime calls that block the host -> `syncs`;
`[memory]` events -> `memory` samples (`Total Allocated`, running peak) on `Device Id`; `python_function`
events -> `annotations` of origin `python` with their frame; `user_annotation` events -> `annotations` of
origin `record_function`.
"""

from __future__ import annotations

import bisect
import math
import re
from pathlib import Path
from typing import Any

from tputrace.importers import chrome_scan, compile_ranges, kineto, memory_buffers, window_ranges
from tputrace.importers.profiler_parts import (FrameIndex, Nesting, OpModules, OpSpans, Shapes, call_stack_frame,
                                              open_op)
from tputrace.importers.chrome_scan import COLLECTIVE, NUMBER, STEP, Irregular
from tputrace.importers.chrome_scan import is_user_frame as _is_user_frame
from tputrace.importers.chrome_scan import number as _number
from tputrace.importers.json_events import event_lists, read_head, read_header
from tputrace.importers.sink import ImportSink, RankClock, StepClock
from tputrace.importers.sources import CHROME_JSON, CaptureError

_KERNEL_CATEGORIES = frozenset(("kernel", "gpu_memcpy", "gpu_memset"))
# torch.compile's ranges (dynamo_timed): a frame's compile, and AOTAutograd's backward compile.
_COMPILE_EVENTS = frozenset(("entire_frame_compile", "entire_backward_compile"))
# The annotation inside each such range that names its compile: `entire_frame_compile_data: ..., compile_id=0/1`.
_COMPILE_DATA = re.compile(r"^entire_(?:frame|backward)_compile_data: .*\bcompile_id=([\w/\[\]-]+)")
_PYTHON_FRAME = re.compile(r"^(.*?)\((\d+)\): (.*)$")
_HOST_TEXT = re.compile(r'"host_name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_PID_TEXT = re.compile(r'"pid"\s*:\s*(\d+)')
_SYNC_OPS_KEPT = 1 << 17
is_user_frame = _is_user_frame  # whether a `python_function` name is a frame of the user's code (see `chrome_scan`)


class ChromeJsonImporter:
    """Imports the torch.profiler JSON files of one process (one file, or the several windows of a
    profiling schedule) as one rank."""

    def __init__(self, sink: ImportSink, paths: list[Path], *, compiles_elsewhere: bool = False) -> None:
        self.sink = sink
        self.paths = paths
        self.compiles_elsewhere = compiles_elsewhere  # the process's TORCH_TRACE log writes its frames' compiles
        self.start_unix_ns = 0
        self.path = paths[0]
        self.writer = sink.writer
        facts = {"windows": [str(path) for path in paths]} if len(paths) > 1 else {}
        self.rank = sink.new_rank(CHROME_JSON, str(paths[0]), **facts)
        self.steps = StepClock()
        self.kernel_programs: dict[str, int] = {}
        self.ranges = kineto.ProfilerRanges()
        self.copy_bytes: dict[str, list[int]] = {}  # a memcpy's name -> [runs with bytes, their bytes]
        self.frames: dict[str, int | None] = {}
        self.peak_bytes: dict[int, int] = {}
        self.seq = 0
        self.latest_start_ns = -1  # the latest start of a timed event's row, to know whether any ran after the steps
        self.parse_float: Any = float  # reads a window's floats (its nanosecond timestamps exactly, see `kineto`)
        self.comms = "annotation"  # where a window's collectives come from (see `kineto.comms_source`)
        # The CPU ops a sync may happen in (`aten::copy_`, `aten::_local_scalar_dense`), by thread: starts, (end, kind).
        self.sync_ops: dict[Any, tuple[list[float], list[tuple[float, str]]]] = {}
        self.window = window_ranges.WindowRanges()  # the first pass's window span and user ranges
        self.launching: set[Path] = set()  # the files with runtime calls that launch (a `correlation` arg)
        self.compile_outcomes = compile_ranges.CompileOutcomes()
        self.compile_rows: list[tuple[Any, ...]] = []  # written at the end, with what the capture shows of each outcome
        self.allocations = memory_buffers.Allocations()  # a window's `[memory]` events, for `buffers` rows
        self.buffers_written, self.latest_alloc_ns = 0, -1
        self.compiled_functions: dict[int, str] = {}  # a frame compile's start -> the user's frame that ran next

    def run(self) -> None:
        # First pass over every file: its start on the Unix clock, its steps and user frames.
        windows, ranges = [], []
        for path in self.paths:
            self.path = path
            header = read_header(path)
            # `ts` written with nanosecond digits: read less a whole number of microseconds, so that a float keeps them.
            offset_us = kineto.exact_offset(read_head(path))
            self.parse_float = kineto.exact_or_float(offset_us)
            trailer: dict[str, Any] = {}
            comms: set[str] = set()
            self.window = window_ranges.WindowRanges()
            try:
                start_us, markers, user_frames = self._scan_text(trailer, comms)
            except Irregular:
                comms.clear()
                self.window = window_ranges.WindowRanges()
                start_us, markers, user_frames = self._scan_events(trailer, comms)
            if start_us is None:
                raise CaptureError(f"{path} holds no timed events")
            header = {**trailer, **header}  # Kineto writes some fields (`baseTimeNanoseconds`) after the events
            base_ns = int(header.get("baseTimeNanoseconds") or 0) + (offset_us or 0) * 1000
            windows.append((path, base_ns, start_us, markers, user_frames, offset_us, kineto.comms_source(comms)))
            ranges.append(self.window)
            self._note_header(header)
        # Without `ProfilerStep#N` markers (no schedule), the user's range repeated around each iteration marks the steps.
        chosen = None if any(window[3] for window in windows) else window_ranges.choose(ranges, self.paths)
        if chosen is not None:
            windows = [(*window[:3], steps, *window[4:]) for window, steps in zip(windows, chosen[1])]
            self.sink.note(self.rank, step_source="user_annotation", step_range=chosen[0])
        start_unix_ns = self.start_unix_ns = min(base_ns + int(round(start_us * 1000))
                                                 for _, base_ns, start_us, *_ in windows)
        # Each file's `ts` (us since its `baseTimeNanoseconds`, less its offset) at the rank's start.
        origins = [(start_unix_ns - base_ns) / 1000 for _, base_ns, *_ in windows]
        spans = [(int(round((start - origin) * 1000)), int(round((end - origin) * 1000)), number)
                 for (_, _, _, markers, *_), origin in zip(windows, origins) for start, end, number in markers]
        steps = self.steps.place(spans, close_last=True)
        host, pid, _ = process_key(self.paths[0])  # Kineto's `host_name` and the process's id, where the file has them
        self.writer.set_run(rank=self.rank, world_size=1, script=str(self.paths[0]), argv=[], platform="cpu",
                            chips=0, start_unix_ns=start_unix_ns, host=(host or None) if pid else None,
                            pid=int(pid) if pid else None)
        end_ns = 0
        devices: set[int] = set()
        trailing: set[int] = set()  # the starts of steps in windows that hold nothing else
        self.device_kinds: set[str] = set()
        self.runtime = False  # the capture has a device runtime's calls
        recorded_ns = 0  # the windows' time, without the gaps between them that were not recorded
        warned = len(self.sink.warnings)
        for (path, _, first_us, markers, user_frames, offset_us, comms_source), origin, window in zip(windows, origins,
                                                                                                     ranges):
            self.path = path
            self.start_us = origin
            self.parse_float = kineto.exact_or_float(offset_us)
            self.comms = comms_source
            self.user_frames = FrameIndex(user_frames)
            self.modules = OpModules(window.modules, self.writer.intern)
            appended, ops_before = self.sink.appended, self.seq
            end_us, window_devices = self._rows()
            self._buffers(self._ns(end_us), last_window=path == windows[-1][0])
            # A window may hold only a step marker (the step a schedule's next cycle opened when profiling ended), or no op.
            if self.sink.appended == appended and not markers and not kineto.empty_window(self.sink, path):
                raise CaptureError(kineto.no_profiler_events(path))
            if self.seq == ops_before and not window_devices:  # e.g. only the DataLoader's fetch that ended the loop
                trailing.update(int(round((start - origin) * 1000)) for start, _, _ in markers)
            end_ns = max(end_ns, self._ns(end_us))
            recorded_ns += max(0, int(round(window.recorded_us(first_us, end_us) * 1000)))
            devices |= window_devices
        if self.seq == 0 and not devices and len(self.sink.warnings) == warned:
            self.sink.warn(f"{self.paths[0]}: torch.profiler recorded no operator or kernel in this capture (only "
                           "its own step markers or Python calls): nothing of torch ran in its window; a `schedule` "
                           "records its active steps only, which `on_trace_ready` writes: `export_chrome_trace` after "
                           "the last cycle writes an empty window")
        # Such a step (opened by the loop's last `prof.step()`, closed when profiling stopped) is no step of the loop.
        for number, step_start_ns, step_end_ns in steps:
            self.sink.append("steps", (self.rank, number, step_start_ns, step_end_ns,
                                       "end" if step_start_ns in trailing else "imported"))
        # What ran after the last step closed (a collective the loop's last step left running, the profiler's
        # own stop) is no step of the loop: an `end` step holds it, as a recording's work after the loop.
        after = self.steps.after_last
        if after is not None and self.latest_start_ns >= after[1]:
            self.sink.append("steps", (self.rank, after[0], after[1], end_ns, "end"))
        # A GPU's runtime calls without kernels (CUPTI's range profiler replaces them) are still a GPU's capture.
        device = (min(self.device_kinds) if self.device_kinds else "gpu") if devices or self.runtime else "cpu"
        self.sink.note(self.rank, device=device, **({"recorded_ns": recorded_ns} if len(windows) > 1 else {}))
        if self.copy_bytes:
            self.sink.note(self.rank, copy_bytes={name: {"runs": runs, "bytes": moved}
                                                  for name, (runs, moved) in sorted(self.copy_bytes.items())})
        self.writer.update_run(rank=self.rank, platform=device, chips=len(devices), end_ns=end_ns)
        self._write_compiles(end_ns)
        kineto.write_ranges(self.sink, self.rank, self.ranges, self.kernel_programs, self.paths[0])

    def _note_header(self, header: dict[str, Any]) -> None:
        """The rank's process facts from Kineto's header: its torch.distributed rank and world size
        (`distributedInfo`), and the name of its device (`deviceProperties`)."""
        distributed = header.get("distributedInfo")
        if isinstance(distributed, dict):
            for key, fact in (("rank", "distributed_rank"), ("world_size", "distributed_world_size")):
                if isinstance(distributed.get(key), int):
                    self.sink.note(self.rank, **{fact: distributed[key]})
        devices = header.get("deviceProperties")
        names = sorted({str(item["name"]) for item in devices if isinstance(item, dict) and item.get("name")}) \
            if isinstance(devices, list) else []
        if names:
            self.sink.note(self.rank, device_name=", ".join(names))

    # -- first pass: start, steps and user frames -------------------------------------------------

    def _scan_text(self, trailer: dict[str, Any] | None = None, comms: set[str] | None = None) -> tuple[
            float | None, list[tuple[float, float, int | None]], list[tuple[float, float, Any, str]]]:
        """The first pass over raw text (`chrome_scan.scan_text`)."""
        return chrome_scan.scan_text(self.path, self.parse_float, self.window, self.launching, trailer, comms)

    def _scan_events(self, trailer: dict[str, Any] | None = None, comms: set[str] | None = None) -> tuple[
            float | None, list[tuple[float, float, int | None]], list[tuple[float, float, Any, str]]]:
        """The first pass over decoded events (`chrome_scan.scan_events`)."""
        return chrome_scan.scan_events(self.path, self.parse_float, self.window, self.launching, trailer, comms)

    # -- second pass: rows ----------------------------------------------------------------------

    def _rows(self) -> tuple[float, set[int]]:
        """Write every event's row; the capture's end (us) and the devices its kernels ran on."""
        rank = self.rank
        start_us = self.start_us
        intern = self.writer.intern
        step_starts, step_labels = self.steps.starts, self.steps.labels
        innermost = self.user_frames.innermost
        latest_frames = self.user_frames.latest  # each thread's latest frame and the times it holds for (`innermost`)
        module_of = self.modules.module_sid if self.modules.index is not None else None  # None: no module ranges
        name_sids: dict[str, int] = {}  # an op's name -> its string id
        inputs_sids: dict[str, int] = {}  # an op's shapes -> their string id
        # The step of the latest row and the times [from, until) it holds for: rows come mostly in time order.
        step, step_from, step_until = 0, 1.0, 0.0
        frame_of = self._frame
        frames = self.frames  # a frame's name -> its id (-1 where not yet known)
        shapes_of = Shapes()
        end_us = start_us
        latest_start_ns = self.latest_start_ns
        devices: set[int] = set()
        seq = self.seq
        extend = self.sink.extend
        nesting = Nesting(self._compile)
        categories = kineto.CATEGORIES
        compiled_call = compile_ranges.COMPILED_CALL.match
        sync_op_kinds = kineto.SYNC_OP_KINDS
        launches = kineto.LaunchSteps(self._kernel_rows)
        op_spans = OpSpans()  # each thread's CPU ops, for the op around a kernel's launch
        # Kept only for a file with launches: 32 bytes an op, however many ops the file holds.
        add_span = op_spans.add if self.path in self.launching else None
        comms = self.comms
        python_names: dict[str, tuple[int, int | None]] = {}  # a Python frame's name -> its string id and frame id
        for events in event_lists(self.path, parse_float=self.parse_float):
            ops: list[tuple[Any, ...]] = []
            annotations: list[tuple[Any, ...]] = []
            memory: list[tuple[Any, ...]] = []
            for event in events:
                if event.__class__ is not dict:
                    continue
                ts = event.get("ts")
                if ts.__class__ is not float and not isinstance(ts, NUMBER):
                    continue
                dur = event.get("dur", 0)
                if dur.__class__ is not float and not isinstance(dur, NUMBER):
                    dur = 0.0
                if ts + dur > end_us and event.get("s") != "g":  # not a global marker (`Record Window End`)
                    end_us = ts + dur
                name = event.get("name", "")
                if name.__class__ is not str:
                    name = str(name)
                start_ns = round((ts - start_us) * 1000)
                if name == "[memory]":
                    memory_args = _args(event)
                    memory.append(self._memory(memory_args, start_ns))
                    self.allocations.add(start_ns, ts, event.get("tid"), memory_args)
                    continue
                if event.get("ph") != "X":
                    continue
                category = event.get("cat")
                if category.__class__ is not str:
                    category = None
                elif category in categories:  # older Kineto's names, other devices' names
                    if category in kineto.DEVICE_OF_CATEGORY:
                        self.device_kinds.add(kineto.DEVICE_OF_CATEGORY[category])
                    category = categories[category]
                dur_ns = int(dur * 1000)
                if not step_from <= start_ns < step_until:
                    position = bisect.bisect_right(step_starts, start_ns)
                    step = step_labels[position]
                    step_from = step_starts[position - 1] if position else -math.inf
                    step_until = step_starts[position] if position < len(step_starts) else math.inf
                if start_ns > latest_start_ns:
                    latest_start_ns = start_ns
                if category == "cpu_op":
                    tid = event.get("tid")
                    stack = nesting.open_on(tid, ts, ops)
                    if name in _COMPILE_EVENTS or (stack and stack[-1][2] is None):
                        # torch.compile's own work (its phases, and the ops it runs on fake tensors) is the compile's
                        # time, not the program's ops.
                        frame_name = innermost(ts, tid) if name in _COMPILE_EVENTS else None
                        if name == "entire_frame_compile":
                            self._note_compiled_function(ts, ts + dur, tid, start_ns)
                        nesting.push(tid, open_op(ts + dur, ts, None, (
                            name, start_ns, dur_ns, step, frame_of(frame_name) if frame_name else None)
                            if name in _COMPILE_EVENTS else None))
                        continue
                    if compiled_call(name):  # a compiled graph's call: a range around its ops, no op itself
                        self.compile_outcomes.call(name)
                        annotations.append((rank, intern(name), "record_function", start_ns, dur_ns,
                                            frame_of(innermost(ts, tid) or ""), step))
                        continue
                    seq += 1
                    args = event.get("args")
                    if name in sync_op_kinds:
                        self._sync_op(tid, ts, ts + dur, sync_op_kinds[name])
                    elif name == "record_param_comms" and comms == "param" and args.__class__ is dict:
                        self._comms(args, start_ns, dur_ns, step, frame_of(innermost(ts, tid) or ""))
                    inputs = shapes_of(args.get("Input type"), args.get("Input Dims")) if args.__class__ is dict else ""
                    if add_span is not None:
                        add_span(tid, ts, ts + dur, seq)
                    call_stack = args.get("Call stack") if args.__class__ is dict else None
                    frame_name = call_stack and call_stack_frame(call_stack, _is_user_frame)
                    if not frame_name:
                        latest = latest_frames.get(tid)  # `FrameIndex.innermost`'s answer that still holds, inline
                        frame_name = latest[2] if latest is not None and latest[0] <= ts <= latest[1] else \
                            innermost(ts, tid)
                    # The name's and the shapes' string ids before the frame's.
                    name_sid = name_sids.get(name)
                    if name_sid is None:
                        name_sid = name_sids[name] = intern(name)
                    if inputs:
                        inputs_sid = inputs_sids.get(inputs)
                        if inputs_sid is None:
                            inputs_sid = inputs_sids[inputs] = intern(inputs)
                    else:
                        inputs_sid = None
                    frame_id = frames.get(frame_name, -1) if frame_name else None
                    if frame_id == -1:
                        frame_id = frame_of(str(frame_name))
                    end = ts + dur
                    parent = stack[-1] if stack else None
                    if parent is not None:  # `Nesting.push`, inline (see `profiler_parts.open_op` for the list)
                        parent[3] += (end if end < parent[0] else parent[0]) - ts
                    module_sid = module_of(ts, tid, name, args, parent) if module_of else None
                    stack.append([end, ts, [seq, rank, name_sid, inputs_sid, None, -1, start_ns, dur_ns, frame_id,
                                            module_sid, step, None, None], 0.0, None, None])
                elif category == "python_function":
                    named = python_names.get(name)
                    if named is None:
                        named = python_names[name] = (intern(name), frame_of(name))
                    annotations.append((rank, named[0], "python", start_ns, dur_ns, named[1], step))
                elif category == "user_annotation":
                    collective = COLLECTIVE.match(name)
                    if collective and kineto.collective_kind(collective.group(2)) and (
                            comms == "annotation" or (comms == "kernel" and collective.group(1) != "nccl")):
                        self._collective(collective.group(2), event, start_ns, dur_ns, step)
                    compile_id = _COMPILE_DATA.match(name)
                    if compile_id:
                        nesting.name_compile(event.get("tid"), compile_id.group(1))
                    if "compile_id=" in name:
                        self.compile_outcomes.annotation(name)
                    if not STEP.match(name):
                        annotations.append((rank, intern(name), "record_function", start_ns, dur_ns, None, step))
                elif category in _KERNEL_CATEGORIES:
                    devices.add(self._kernel(name, event, start_ns, dur_ns, step, launches))
                elif category == kineto.PROFILER_RANGE:
                    self.ranges.add(name, event.get("args"))
                elif category == "cuda_runtime":
                    self.runtime = True
                    args = event.get("args")
                    if args.__class__ is dict and "correlation" in args:
                        tid = event.get("tid")
                        launches.launch(args["correlation"], step, (ts, tid, op_spans.innermost(tid, ts, ts + dur)))
                    if name in kineto.SYNC_CALLS:
                        tid = event.get("tid")
                        self._sync(self._sync_kind(tid, ts, ts + dur), start_ns, dur_ns, step,
                                   frame_of(innermost(ts, tid) or ""))
            extend("ops", ops)
            extend("annotations", annotations)
            if memory:
                extend("memory", memory)
        launches.finish()
        op_spans.clear()
        ops = []
        nesting.close_all(ops)
        extend("ops", ops)
        self.seq = seq
        self.latest_start_ns = latest_start_ns
        return end_us, devices

    def _compile(self, event: tuple[str, int, int, int, int | None], compile_id: str | None) -> None:
        """A `compiles` row (and its `programs` row) for one torch.compile range seen by the profiler."""
        name, start_ns, dur_ns, step, frame_id = event
        if self.compiles_elsewhere and name != "entire_backward_compile":
            return  # the TORCH_TRACE log's compile of the frame (it has no backward compiles)
        kind = "aot" if name == "entire_backward_compile" else "dynamo_frame"
        frame, _, attempt = (compile_id or "").partition("/")
        label = f"{'backward of ' if kind == 'aot' else ''}compiled frame {frame}" if compile_id else name
        label_sid = self.writer.intern(label)
        program_id = self.writer.next_id("programs")
        self.sink.append("programs", (program_id, self.rank, "compiled", label_sid, label_sid, None, None, None, None,
                                      None))
        reason = "recompile" if attempt.split("_")[0] not in ("", "0") else "first"
        self.compile_rows.append((program_id, kind, label_sid, start_ns, dur_ns, frame_id, step, reason, compile_id,
                                  name))

    def _note_compiled_function(self, start_us: float, end_us: float, tid: Any, start_ns: int) -> None:
        """The user's function that a frame compile (at `start_ns`) was for, as the first of the user's frames that
        runs after it inside the caller around it: where the compile left no compiled code, that function's own frame
        runs next, as written (where it left code, the compiled region runs instead)."""
        caller_end = self.user_frames.enclosing_end(start_us, tid)
        function = self.user_frames.first_after(end_us, tid, caller_end)
        if function:
            self.compiled_functions[start_ns] = function

    def _buffers(self, window_end_ns: int, last_window: bool) -> None:
        """The window's `buffers` rows from its `[memory]` events (see `memory_buffers`)."""
        lifetimes = self.allocations.lifetimes(window_end_ns, last_window)
        if not lifetimes:
            return
        modules = self.modules.index
        intern = self.writer.intern

        def place(ts: float, tid: Any) -> tuple[int | None, int | None]:
            frame_name = self.user_frames.innermost(ts, tid)
            module = modules.innermost(ts, tid) if modules is not None else None
            return (self._frame(frame_name) if frame_name else None), (intern(module) if module else None)

        rows, self.latest_alloc_ns = memory_buffers.buffer_rows(
            self.rank, lifetimes, self.buffers_written, self.latest_alloc_ns, place,
            memory_buffers.step_at(self.steps.starts, self.steps.labels))
        self.buffers_written += len(rows)
        self.sink.extend("buffers", rows)

    def _write_compiles(self, end_ns: int) -> None:
        """The `compiles` rows, a frame compile's detail with what the capture shows of its outcome (see
        `compile_ranges.CompileOutcomes.detail`)."""
        for program_id, kind, label_sid, start_ns, dur_ns, frame_id, step, reason, compile_id, name in self.compile_rows:
            outcome = self.compile_outcomes.detail(compile_id, start_ns + dur_ns, end_ns) \
                if compile_id and kind == "dynamo_frame" else {}
            function = self.compiled_functions.get(start_ns)
            if outcome.get("region_ran") is False and function:
                frame_id = self._frame(function)  # the function that ran as written, as TORCH_TRACE places a compile
            self.sink.append("compiles", (self.writer.next_id("compiles"), self.rank, program_id, kind, label_sid, None,
                                          -1, start_ns, dur_ns, frame_id, step, reason, None,
                                          compile_ranges.compile_detail(compile_id, name, outcome)))
        self.compile_rows.clear()

    def clock(self) -> RankClock:
        """The rank, start and steps, for another capture of the process to write into."""
        return RankClock(self.rank, self.start_unix_ns, self.steps)

    def _ns(self, ts_us: float) -> int:
        return int(round((ts_us - self.start_us) * 1000))

    def _kernel(self, name: str, event: dict[str, Any], start_ns: int, dur_ns: int, step: int,
                launches: kineto.LaunchSteps) -> int:
        """A kernel's (or a device copy's) `programs` row; its execution (and collective) rows in the step of its
        launch (see `kineto.LaunchSteps`). The device it ran on."""
        program_id = self.kernel_programs.get(name)
        if program_id is None:
            program_id = self.kernel_programs[name] = self.writer.next_id("programs")
            name_sid = self.writer.intern(name)
            self.sink.append("programs", (program_id, self.rank, "kernel", name_sid, name_sid, None, None, None,
                                          None, None))
        args = _args(event)
        chip = int(args.get("device", 0) or 0)
        moved = args.get("bytes")
        if isinstance(moved, int) and moved >= 0 and name.startswith("Memcpy"):
            counts = self.copy_bytes.setdefault(name, [0, 0])
            counts[0] += 1
            counts[1] += moved
        launches.kernel(args.get("correlation"), (program_id, chip, args, start_ns, dur_ns), step)
        return chip

    def _kernel_rows(self, kernel: tuple[int, int, dict[str, Any], int, int], step: int,
                     launched_at: tuple[float, Any, int | None] | None) -> None:
        """A kernel's `executions` row; its `kernel_launches` row where its launch (its time, thread and the CPU op
        around it) is known to have run in an op; an NCCL kernel's `collectives` row at the user's frame around its
        launch."""
        program_id, chip, args, start_ns, dur_ns = kernel
        self.sink.append("executions", (self.rank, program_id, chip, start_ns, dur_ns, step, None))
        if launched_at is not None and launched_at[2] is not None:
            self.sink.append("kernel_launches", (self.rank, launched_at[2], program_id, chip, start_ns, dur_ns))
        if self.comms == "kernel" and kineto.COLLECTIVE_ARG in args:
            frame_name = self.user_frames.innermost(launched_at[0], launched_at[1]) if launched_at is not None else None
            self._comms(args, start_ns, dur_ns, step, self._frame(frame_name) if frame_name else None)

    def _comms(self, args: dict[str, Any], start_ns: int, dur_ns: int, step: int, frame_id: int | None) -> None:
        """A `collectives` row from the args Kineto gives an NCCL kernel or a `record_param_comms` op."""
        name, nbytes, dtype, group, ranks, group_size = kineto.comms_facts(args)
        kind = kineto.collective_kind(name)
        if kind is None:
            return
        intern = self.writer.intern
        self.sink.append("collectives", (self.rank, kind, nbytes, dtype, intern(group) if group else None,
                                         intern(ranks) if ranks else None, frame_id, start_ns, dur_ns, None, None,
                                         kineto.bus_bandwidth(kind, nbytes, dur_ns, group_size), step, None))

    def _sync_op(self, tid: Any, start_us: float, end_us: float, kind: str) -> None:
        """Remember a CPU op a sync may happen in. Kineto writes the runtime calls after the ops (and the ids
        linking them differ between its versions), so each thread's such ops are kept, the latest 2^17."""
        starts, rest = self.sync_ops.setdefault(tid, ([], []))
        if len(starts) >= _SYNC_OPS_KEPT:
            del starts[:_SYNC_OPS_KEPT // 2], rest[:_SYNC_OPS_KEPT // 2]
        starts.append(start_us)
        rest.append((end_us, kind))

    def _sync_kind(self, tid: Any, start_us: float, end_us: float) -> str:
        """`syncs.kind` of a runtime call that blocked the host: that of the innermost CPU op around it on its thread
        (`aten::_local_scalar_dense`: `item`), else `synchronize`."""
        starts, rest = self.sync_ops.get(tid, ((), ()))
        position = bisect.bisect_right(starts, start_us)  # type: ignore[arg-type]
        for index in range(position - 1, max(position - 8, 0) - 1, -1):
            if rest[index][0] >= end_us:
                return rest[index][1]
        return "synchronize"

    def _sync(self, kind: str, start_ns: int, dur_ns: int, step: int, frame_id: int | None) -> None:
        """A `syncs` row of a runtime call that blocked the host (`cudaStreamSynchronize`, a blocking memcpy)."""
        self.sink.append("syncs", (self.rank, kind, frame_id, 0, start_ns, dur_ns, None, step, None))

    def _collective(self, name: str, event: dict[str, Any], start_ns: int, dur_ns: int, step: int) -> None:
        """A `collectives` row of a process group's collective (`gloo:all_reduce`, `nccl:all_gather`...), its
        bytes from the tensors' `Input Dims` and `Input type` (recorded with `record_shapes`; unknown, NULL, without)."""
        args = _args(event)
        nbytes, dtype = kineto.input_bytes(args)
        self.sink.append("collectives", (self.rank, kineto.collective_kind(name), nbytes, dtype, None, None, None, start_ns,
                                         dur_ns, None, None, None, step, None))

    def _memory(self, args: dict[str, Any], t_ns: int) -> tuple[int, int, int, int, int]:
        """A `memory` row of a `[memory]` event's args."""
        chip = int(args.get("Device Id", -1) if args.get("Device Id") is not None else -1)
        live = int(_number(args.get("Total Allocated")))
        peak = self.peak_bytes[chip] = max(self.peak_bytes.get(chip, 0), live)
        return self.rank, chip, t_ns, live, peak

    def _frame(self, name: str) -> int | None:
        frame_id = self.frames.get(name, -1)
        if frame_id == -1:
            match = _PYTHON_FRAME.match(name)
            frame_id = self.frames[name] = (self.writer.frame(match.group(1), int(match.group(2)), match.group(3))
                                            if match else None)
        return frame_id


def process_key(path: Path) -> tuple[str, str, str]:
    """Which process a torch.profiler file comes from: its `host_name`, the `pid` of its first event (from
    the file's first block) and the torch.distributed rank of a Kineto header before the events (ranks on different
    hosts, each in its container, can have one pid), or the file itself where there is no pid."""
    head = read_head(path)
    host = _HOST_TEXT.search(head)
    pid = _PID_TEXT.search(head)
    if pid is None:
        return str(path), "", ""
    distributed = read_header(path).get("distributedInfo")
    rank = distributed.get("rank") if isinstance(distributed, dict) else None
    return (host.group(1) if host else ""), pid.group(1), "" if rank is None else str(rank)


def _args(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}
