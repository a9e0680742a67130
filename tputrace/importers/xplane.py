"""Importing an XProf `XSpace` (`<host>.xplane.pb` from jax.profiler, TorchTPU or PyTorch/XLA).

Mapping (docs/importing.md has the full table): one rank per file, or per process for several sessions;
XLA ops (device planes' `XLA Ops` lines, or host-thread events with an `hlo_op` stat on XLA:CPU) become
`ops` rows with their program, `source` frame and `tf_op` path; XLA modules become `programs` and
`executions` (FLOPs and bytes summed from the ops' metadata stats); fusions become `fusions` rows; step
markers (host events with a `step_num` stat, or a device `Steps` line) become `steps`; Python tracer frames
(`$file:line function`) and TraceMe ranges become `annotations` with origin `python` or `traceme`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from contextlib import ExitStack
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from tputrace.importers.chip_collectives import ChipCollectives
from tputrace.importers.hlo_body import ProgramBody, compile_detail
from tputrace.importers.hlo_metadata import HloVersions, InstructionSource, UserFileFrames, read_hlo
from tputrace.importers.hlo_placement import recompile_diff
from tputrace.importers.hlo_text import movement_shapes, operand_name
from tputrace.importers.sink import ImportSink, StepClock
from tputrace.importers.step_markers import ProgramRuns, StepMarkers, place_markers
from tputrace.importers.sources import XPLANE, CaptureError
from tputrace.importers.wire import LineHead, XSpaceFile
from tputrace.importers.xla_compiles import (
    BACKEND_EVENT,
    CLIENT_COMPILE,
    COMPILE_EVENTS,
    JITTED_CALL,
    UNNAMED,
    CallLine,
    CompileSpans,
)
from tputrace.importers.xplane_lines import ASYNC_OPS_LINE, COUNTERS_LINE, MODULE_LINES, OP_LINES, SPARSECORE_PLANE
from tputrace.importers.xplane_lines import Counters, async_annotations
from tputrace.importers.xplane_processes import UNIX_NS_FLOOR, capture_host
from tputrace.importers.xplane_ops import OpEvents, OpMeta, OpRows, Program, distinct_ids, group_rows, per_event
from tputrace.importers.xplane_runs import (LaunchTimes, RunSpans, SingleDeviceLaunches, launched_at,
                                           launched_at_ids)
from tputrace.importers.xplane_host_ops import HostOps
from tputrace.importers.xplane_step_ranges import TraceMeRanges, line_ranges
from tputrace.importers.xplane_streams import HOST_OP_STATS, StreamLines
from tputrace.importers.xla_ops import LineNesting, collective_category
from tputrace.importers.xevents import EventColumns, decode_run, int_stat_columns, int_stats, isin_few
from tputrace.importers.xstats import StatDecoder, plane_stat

_DEVICE_PLANE = re.compile(r"^/device:([A-Z]+)[^:]*:(\d+)$")
_PYTHON_FRAME = re.compile(r"^\$(.*?):(\d+) (.*)$")
_SOURCE_STAT = re.compile(r"^(.*?):(\d+)$")
# PjRt's launch of a program on one device, which names no run (`CommonPjRtLoadedExecutable::…`).
SINGLE_DEVICE_LAUNCH = "ExecuteHelperOnSingleDevice"
# A stat an event does not carry.
_ABSENT = object()


class XPlaneImporter(OpRows, HostOps, StreamLines):
    """Imports the `xplane.pb` of one host and process as one rank: one file, or the files of several
    profiling sessions of the process (`jax.profiler.trace` called more than once)."""

    def __init__(self, sink: ImportSink, paths: list[Path]) -> None:
        self.sink = sink
        self.paths = paths
        self.path = paths[0]
        self.writer = sink.writer
        facts = {"windows": [str(path) for path in paths]} if len(paths) > 1 else {}
        self.rank = sink.new_rank(XPLANE, str(paths[0]), host=capture_host(paths[0]), **facts)
        self.programs: dict[str, Program] = {}
        self.runs = RunSpans()
        self.chip_calls = ChipCollectives()
        self.steps = StepClock()
        self.step_starts, self.step_labels = np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)  # as arrays
        self.start_unix_ns = 0
        self.end_ns = 0
        self.counters = Counters()  # the `_counters_` lines' samples
        self.latest_start_ns = -1  # the latest start of an event that is a row (ns since the rank's start)
        self.seq = 0
        self.host_op_metas: dict[tuple[int, str, int | None], OpMeta] = {}
        self.host_op_stats: dict[int, str] = {}
        self.host_chips: set[int] = set()  # the device ordinals of XLA ops run on host threads
        self.stream_kernels: dict[str, int] = {}  # a GPU's kernels that are no XLA op: name -> program id
        self.stream_plane: Any = None
        self.offset_ns = 0  # what puts the line times of the file being read on the Unix clock
        self.offsets: dict[Path, int] = {}
        self.lines_without_ops: set[tuple[Path, int]] = set()  # host lines (file, start) holding no XLA op
        self.chips = 1
        self.hlo: dict[str, dict[str, InstructionSource]] = {}  # module -> instruction -> where it came from
        self.hlo_versions: HloVersions = {}  # module -> each of its protos' sources, in compile order
        self.hlo_signatures: dict[tuple[str, int], str] = {}  # (module, XLA's id of it) -> its parameters' shapes
        self.hlo_bodies: dict[tuple[str, int], ProgramBody] = {}  # (module, XLA's id of it) -> what it computes
        self.hlo_user_frames: UserFileFrames = {}  # the user's files' functions and lines in the programs' stacks
        # Run ids (ascending) and when the host launched each run (ns since the rank's start).
        self.launch_ids, self.launch_starts = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)

    def run(self) -> None:
        from tputrace.xplane_proto import messages

        for path in self.paths:
            if path.stat().st_size == 0:
                raise CaptureError(f"{path} is empty")
        classes = messages()
        self.plane_class, self.line_class, self.event_class = classes["XPlane"], classes["XLine"], classes["XEvent"]
        with ExitStack() as files:
            self._run([files.enter_context(XSpaceFile(path)) for path in self.paths])

    def _planes(self, space: XSpaceFile) -> Iterator[tuple[Any, list[LineHead]]]:
        """Each plane and its lines' heads, their times moved by `offset_ns` (onto the Unix clock)."""
        for span in space.planes():
            plane, line_spans = space.plane(span, self.plane_class)
            heads = [space.line_head(line) for line in line_spans]
            if self.offset_ns:
                heads = [dataclasses.replace(head, timestamp_ns=head.timestamp_ns + self.offset_ns) for head in heads]
            yield plane, heads

    def _columns(self, space: XSpaceFile, line: LineHead, stats: bool = True) -> Iterator[EventColumns]:
        """A line's events, a window's worth of them at a time, as columns (without their stats where not `stats`)."""
        for run in space.event_runs(line):
            yield decode_run(run, self.line_class, self.event_class, stats)

    def _run(self, spaces: list[XSpaceFile]) -> None:
        # First pass: the capture's start, its step markers and compiles (needed before any row is written).
        device_kind = "cpu"
        chips: set[int] = set()
        device_types: set[str] = set()  # the device planes' `device_type_string` ("TPU v6 Lite"), "" for none
        starts: list[int] = []
        host_markers = StepMarkers()
        device_markers: dict[int, StepMarkers] = {}
        compiles = CompileSpans()
        launches = LaunchTimes()
        singles = SingleDeviceLaunches()
        program_runs = ProgramRuns()
        trace_ranges = TraceMeRanges()
        for session, space in enumerate(spaces):
            self.offset_ns = 0
            file_starts: list[int] = []
            file_host_markers = StepMarkers()
            file_ranges = TraceMeRanges()
            file_device_markers: dict[int, StepMarkers] = {}
            file_compiles = CompileSpans()
            file_launches = LaunchTimes()
            file_singles = SingleDeviceLaunches()
            file_runs = ProgramRuns()
            profile_start_unix_ns = None
            for plane, lines in self._planes(space):
                if plane.name == "Task Environment":
                    profile_start_unix_ns = plane_stat(plane, "profile_start_time")
                if plane.name == "/host:metadata":
                    read_hlo(plane, self.hlo, self.hlo_versions, self.hlo_signatures, self.hlo_bodies,
                             self.hlo_user_frames)
                match = _DEVICE_PLANE.match(plane.name)
                if match:
                    device_kind = match.group(1).lower()
                    chips.add(int(match.group(2)))
                    device_types.add(str(plane_stat(plane, "device_type_string") or ""))
                file_starts += [line.timestamp_ns for line in lines if line.has_events]
                if match:
                    file_device_markers[int(match.group(2))] = self._device_markers(space, plane, lines, file_runs)
                elif not SPARSECORE_PLANE.match(plane.name):  # a SparseCore's `Sparse Core Steps` are no host's
                    self._host_scan(space, plane, lines, file_compiles, (file_launches, file_singles), file_host_markers,
                                    file_ranges)
            # Some producers (JAX among them) write line times relative to the profile's start, which the Task
            # Environment plane holds: every time is put on the Unix clock, so that files of one process line up.
            offset = (profile_start_unix_ns if file_starts and min(file_starts) < UNIX_NS_FLOOR
                      and isinstance(profile_start_unix_ns, int) else 0)
            self.offsets[space.path] = offset
            starts += [start + offset for start in file_starts]
            host_markers.extend(file_host_markers, offset)
            trace_ranges.extend(file_ranges, session, offset)
            for chip, chip_markers in file_device_markers.items():
                device_markers.setdefault(chip, StepMarkers()).extend(chip_markers, offset)
            launches.extend(file_launches, offset)
            singles.extend(file_singles, offset)
            compiles.extend(file_compiles, offset)
            program_runs.extend(file_runs, offset)
            del file_host_markers, file_device_markers, file_compiles, file_launches, file_runs  # copied: memory
        # The host's step markers when there are any, else one chip's `Steps` line (every chip has one).
        markers = host_markers or (device_markers[min(device_markers)] if device_markers else StepMarkers())
        if not markers:  # else a user's TraceMe repeated around each iteration, as `jax.profiler.TraceAnnotation`'s
            chosen = trace_ranges.steps()
            if chosen is not None:
                markers = chosen[1]
                self.sink.note(self.rank, step_source="traceme", step_range=chosen[0])
        self.start_unix_ns = min(starts) if starts else 0
        self.chips = max(len(chips), 1)
        start_unix_ns = self.start_unix_ns
        launches.add_many(*singles.pairs(launches))
        self.launch_ids, self.launch_starts = launches.sorted(-start_unix_ns)
        # The last step ends where its marker does, or later where a chip's `Steps` line or a program run launched
        # by then ends: what starts after that (an evaluation after the loop, the profiler's stop) is in an `end` step.
        close_at = max((end for chip_markers in (markers, *device_markers.values())
                        if (end := chip_markers.last_end()) is not None), default=None)
        if close_at is not None:
            close_at = program_runs.end_of_runs_by(close_at)
        steps = place_markers(self.steps, markers, -start_unix_ns, close_at)
        self.step_starts = np.asarray(self.steps.starts, dtype=np.int64)
        self.step_labels = np.asarray(self.steps.labels, dtype=np.int64)
        for number, start_ns, end_ns in steps:
            self.sink.append("steps", (self.rank, number, start_ns, end_ns, "imported"))
        device_types.discard("")
        self.sink.note(self.rank, device=device_kind, **({"device_name": ", ".join(sorted(device_types))} if device_types else {}))
        self.writer.set_run(rank=self.rank, world_size=1, script=str(self.path), argv=[], cwd=None,
                            host=self.sink.sources[self.rank]["host"], chips=self.chips,
                            platform=device_kind, start_unix_ns=start_unix_ns)
        self._compiles(compiles)
        del markers, host_markers, device_markers, compiles, launches  # kept in `self.steps` and `self.launch_*`
        # Second pass: the rows.
        for space in spaces:
            self.offset_ns = self.offsets[space.path]
            for plane, lines in self._planes(space):
                match = _DEVICE_PLANE.match(plane.name)
                sparsecore = SPARSECORE_PLANE.match(plane.name)
                if match or sparsecore:
                    chip = int(match.group(2)) if match else int(sparsecore.group(1)) if sparsecore else 0
                    self._device_plane(space, plane, lines, chip, sparsecore=match is None)
                elif plane.name.startswith("/host:") and plane.name != "/host:metadata":
                    self._host_plane(space, plane, lines)
                else:
                    for line in lines:
                        self._line_end(line, max((_end_ps(columns) for columns in self._columns(space, line)),
                                                 default=0))
        self._finish_programs()
        if self.counters.series:
            self.sink.note(self.rank, counters=self.counters.as_dict())
        after = self.steps.after_last
        if after is not None and self.latest_start_ns >= after[1]:
            self.sink.append("steps", (self.rank, after[0], after[1], max(self.end_ns, after[1]), "end"))
        # XLA:CPU's devices have no planes: their ops on host threads say which device ran them, by JAX's global id
        # (a `jax.distributed` process's devices are numbered from 2048 times its index).
        chip_count = max(self.chips, max(self.host_chips, default=0) - min(self.host_chips, default=0) + 1)
        self.writer.update_run(rank=self.rank, end_ns=self.end_ns, chips=chip_count)

    def _steps_at(self, starts: np.ndarray, run_ids: list[Any] | None = None) -> np.ndarray:
        """The step of each of some times (ns since the rank's start); of an XLA op's run (`run_ids`), the step in
        which the host launched it, as the op may run after that step's marker ends (asynchronous dispatch)."""
        if run_ids is not None and len(self.launch_ids):
            starts = launched_at(self.launch_ids, self.launch_starts, run_ids, starts)
        return self.step_labels[np.searchsorted(self.step_starts, starts, side="right")]

    def _steps_of_runs(self, starts: np.ndarray, run_ids: np.ndarray, has_run: np.ndarray) -> np.ndarray:
        """`_steps_at` of events whose run ids are a column (uint64, each one where `has_run`)."""
        if has_run.any() and len(self.launch_ids):
            starts = launched_at_ids(self.launch_ids, self.launch_starts, run_ids, has_run, starts)
        return self.step_labels[np.searchsorted(self.step_starts, starts, side="right")]

    def _line_end(self, line: LineHead, end_ps: int) -> None:
        self.end_ns = max(self.end_ns, line.timestamp_ns - self.start_unix_ns + end_ps // 1000)

    # -- first pass ---------------------------------------------------------------------------------

    def _device_markers(self, space: XSpaceFile, plane: Any, lines: list[LineHead], runs: ProgramRuns) -> StepMarkers:
        """A chip's step markers: the events of its `Steps` line, with their `step_num` stat where they have one; and
        the spans of its program runs (`XLA Modules`) into `runs`."""
        step_ids = {key for key, meta in plane.stat_metadata.items() if meta.name == "step_num"}
        markers = StepMarkers()
        for line in lines:
            if line.name == "XLA Modules":
                for columns in self._columns(space, line):
                    starts = line.timestamp_ns + columns.offset_ps // 1000
                    runs.add(starts, starts + columns.duration_ps // 1000)
            if line.name != "Steps":
                continue
            for columns in self._columns(space, line):
                starts = (line.timestamp_ns + columns.offset_ps // 1000).tolist()
                ends = (columns.duration_ps // 1000).tolist()
                numbers = int_stats(columns, np.arange(len(columns)), step_ids)
                for start, duration, number in zip(starts, ends, numbers):
                    markers.add(start, start + duration, number)
        return markers

    def _host_scan(self, space: XSpaceFile, plane: Any, lines: list[LineHead], compiles: CompileSpans,
                   launch_times: tuple[LaunchTimes, SingleDeviceLaunches], markers: StepMarkers,
                   ranges: TraceMeRanges) -> None:
        """A host plane's step markers (events with a `step_num` stat, and its value), its compile events and lines
        with jitted calls, the earliest event of each program run (`run_id`) that is no XLA op: when the host
        launched it, and the launches that name no run with each run's first op (`SingleDeviceLaunches`); and each
        line's top-level TraceMe ranges (`ranges`: the steps of a capture without markers)."""
        launches, singles = launch_times
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        step_ids = {key for key, name in stat_names.items() if name == "step_num"}
        run_ids = {key for key, name in stat_names.items() if name == "run_id"}
        hlo_op_ids = {key for key, name in stat_names.items() if name == "hlo_op"}
        name_ids = {key for key, name in stat_names.items() if name == "name"}
        device_ids = {key for key, name in stat_names.items() if name == "device_ordinal"}
        single_ids = [key for key, meta in plane.event_metadata.items() if meta.name.endswith(SINGLE_DEVICE_LAUNCH)]
        compile_ids = {key for key, meta in plane.event_metadata.items() if meta.name in COMPILE_EVENTS}
        client_compile_ids = {key for key, meta in plane.event_metadata.items() if CLIENT_COMPILE.match(meta.name)}
        backend_ids = {key for key, meta in plane.event_metadata.items() if meta.name.endswith(BACKEND_EVENT)}
        calls = {key: match.group(1) for key, meta in plane.event_metadata.items() if (match := JITTED_CALL.match(meta.name))}
        watched = list(compile_ids | client_compile_ids | backend_ids | compiles.watch_frames(plane.event_metadata, calls))
        frame_ids = [key for key, meta in plane.event_metadata.items() if meta.name.startswith("$")]
        for line in lines:
            base_ns = line.timestamp_ns
            has_calls = False
            has_ops = False
            tracemes: list[np.ndarray] = []  # per window: start, end and metadata id of its TraceMe events
            work: list[np.ndarray] = []  # per window: the starts of its jitted calls and launches
            call_count = 0
            for columns in self._columns(space, line):
                op_events = columns.with_stat(hlo_op_ids)
                # The second pass reads a line's stats only for its XLA ops: a line without any, whose stats decoded
                # from the wire here, is read there without them.
                has_ops = has_ops or columns.from_messages or bool(len(op_events))
                has_calls = has_calls or bool(calls and isin_few(columns.metadata_id, list(calls)).any())
                for index in np.flatnonzero(isin_few(columns.metadata_id, watched)).tolist():
                    metadata_id = int(columns.metadata_id[index])
                    start = base_ns + int(columns.offset_ps[index]) // 1000
                    span = (start, start + int(columns.duration_ps[index]) // 1000)
                    if metadata_id in compile_ids:
                        compiles.compiles.append(span)
                    elif metadata_id in client_compile_ids:
                        compiles.client_compiles.append(span)
                    elif metadata_id in compiles.frame_names:
                        compiles.frames.append((*span, compiles.frame_names[metadata_id]))
                    else:
                        names = [stat.str_value or stat_names.get(stat.ref_value, "")
                                 for stat in columns.message(index).stats if stat.metadata_id in name_ids]
                        if names and names[0]:
                            compiles.named.append((*span, names[0]))
                launched = np.zeros(len(columns), dtype=bool)
                launched[columns.with_stat(run_ids)] = True
                launched[op_events] = False
                self._launches(columns, np.flatnonzero(launched), run_ids, base_ns, launches)
                traceme = ~isin_few(columns.metadata_id, frame_ids)
                traceme[op_events] = False
                window_starts = base_ns + columns.offset_ps // 1000
                if single_ids:
                    singles.scan(columns, window_starts, op_events, (run_ids, device_ids, single_ids))
                tracemes.append(np.stack((window_starts, window_starts + columns.duration_ps // 1000,
                                          columns.metadata_id))[:, traceme])
                called = isin_few(columns.metadata_id, list(calls))
                call_count += int(called.sum())
                work.append(window_starts[launched | called])
                marked = columns.with_stat(step_ids)
                starts = base_ns + columns.offset_ps[marked] // 1000
                ends = starts + columns.duration_ps[marked] // 1000
                found = int_stat_columns(columns, marked, step_ids) if len(marked) else None
                if found is None:
                    for start, end, number in zip(starts.tolist(), ends.tolist(), int_stats(columns, marked, step_ids)):
                        markers.add(start, end, number)
                else:
                    markers.add_many(starts, ends, *found)
            if not has_ops:
                self.lines_without_ops.add((space.path, line.span.start))
            if has_calls:
                compiles.call_lines.append(CallLine(space, line, calls))
            events = np.concatenate(tracemes, axis=1) if tracemes else np.zeros((3, 0), dtype=np.int64)
            ranges.add(0, plane.name, line.name, line_ranges(
                events[0], events[1], events[2], lambda key: str(plane.event_metadata[key].name),
                np.concatenate(work) if work else np.zeros(0, dtype=np.int64), call_count))

    @staticmethod
    def _launches(columns: EventColumns, events: np.ndarray, run_ids: set[int], base_ns: int,
                  launches: LaunchTimes) -> None:
        """The launches of some events (ascending indices): those with an integer run id."""
        found = int_stat_columns(columns, events, run_ids) if len(events) and run_ids else None
        if found is None:
            for index, run_id in zip(events.tolist(), int_stats(columns, events, run_ids)):
                if run_id is not None:
                    launches.add(run_id, base_ns + int(columns.offset_ps[index]) // 1000)
            return
        _, numbers, has = found
        launches.add_many(numbers[has].view(np.uint64), base_ns + columns.offset_ps[events[has]] // 1000)

    def _compiles(self, compiles: CompileSpans) -> None:
        """`compiles` rows (`xla_compiles`); a compile's program is the one its backend compiler (an event with a `name`
        stat) built meanwhile. A compile of a function compiled before (in the capture, or before it as the HLO protos
        say) is a recompile, unless it has no name at all."""
        compiles.keep_calls((call_line, columns) for call_line in compiles.call_lines
                            for columns in self._columns(call_line.space, call_line.line))
        latest: dict[tuple[str, Any], tuple[str | None, Any]] = {}  # (label, frame) -> its last signature, placement
        for start, end, name, label, frame, again, version in compiles.named_compiles(
                self.hlo_versions, self.hlo_user_frames):
            program = self._program(self._version_name(name, version)) if name else None
            start_ns = start - self.start_unix_ns
            reason = "recompile" if again and label != UNNAMED else "first"
            signature = self.hlo_signatures.get((name, version)) if name and version is not None else None
            body = self.hlo_bodies.get((name, version)) if name and version is not None else None
            placement, before = body.placement if body else None, latest.get((label, frame))
            diff = recompile_diff(before, signature, placement) if reason == "recompile" else None
            latest[(label, frame)] = (signature or (before and before[0]), placement or (before and before[1]))
            detail = compile_detail(body) if body is not None else None
            self.sink.append("compiles", (self.writer.next_id("compiles"), self.rank,
                                          program.program_id if program else None, "xla", self.writer.intern(label),
                                          signature and self.writer.intern(signature), -1, start_ns, end - start,
                                          frame and self.writer.frame(*frame),
                                          self.steps.step_at(start_ns), reason, diff and self.writer.intern(diff),
                                          detail))

    # -- second pass --------------------------------------------------------------------------------

    def _device_plane(self, space: XSpaceFile, plane: Any, lines: list[LineHead], chip: int,
                      sparsecore: bool = False) -> None:
        """A chip's rows; of one of its SparseCores (`sparsecore`), only its ops, on the chip's number."""
        decoder = StatDecoder(plane)
        op_metas: dict[int, OpMeta] = {}
        event_metadata = plane.event_metadata
        for line in lines:
            base_ns = line.timestamp_ns - self.start_unix_ns
            end_ps = 0
            nesting = LineNesting()
            for columns in self._columns(space, line):
                end_ps = max(end_ps, _end_ps(columns))
                starts = base_ns + columns.offset_ps // 1000
                durations = columns.duration_ps // 1000
                if len(starts) and (line.name in MODULE_LINES | OP_LINES or line.name.startswith("Stream #")):
                    self.latest_start_ns = max(self.latest_start_ns, int(starts.max()))
                if line.name == COUNTERS_LINE:
                    self.counters.read(plane, decoder, columns, line.timestamp_ns * 1000)
                elif line.name == ASYNC_OPS_LINE:
                    self.sink.extend("annotations", async_annotations(self.rank, self.writer.intern, plane, columns,
                                                                      starts, durations, self._steps_at(starts)))
                elif line.name in MODULE_LINES and not sparsecore:
                    for metadata_id, start_ns, dur_ns in zip(columns.metadata_id.tolist(), starts.tolist(),
                                                             durations.tolist()):
                        program = self._program(event_metadata[metadata_id].name)
                        self.runs.add(chip, None, program.program_id, start_ns, start_ns + dur_ns)
                elif line.name in OP_LINES:
                    groups = group_rows(columns.metadata_id)
                    metas = []
                    for metadata_id in columns.metadata_id[groups.firsts].tolist():
                        meta = op_metas.get(metadata_id)
                        if meta is None:
                            meta = op_metas[metadata_id] = self._op_meta(plane, metadata_id, decoder, None)
                        metas.append(meta)
                    count = len(columns)
                    self._ops(OpEvents(metas, groups.of_row, np.full(count, chip, dtype=np.int64),
                                       np.zeros(count, dtype=np.uint64), np.zeros(count, dtype=bool), starts,
                                       durations), nesting)
                elif line.name.startswith("Stream #"):
                    self._stream_events(plane, lines, decoder, columns, starts, durations, chip, nesting)
            self.sink.extend("ops", nesting.flush())
            self._line_end(line, end_ps)

    def _host_plane(self, space: XSpaceFile, plane: Any, lines: list[LineHead]) -> None:
        decoder = StatDecoder(plane)
        hlo_op_ids = set(decoder.ids_named("hlo_op"))
        self.host_op_metas = {}  # metadata ids are the plane's own
        self.host_op_stats = {key: name for name in HOST_OP_STATS for key in decoder.ids_named(name)}
        # Per event metadata id: (annotation origin, name sid, frame id) of an event that is no XLA op.
        annotations: dict[int, tuple[str, int, int | None]] = {}
        for line in lines:
            base_ns = line.timestamp_ns - self.start_unix_ns
            end_ps = 0
            nesting = LineNesting()
            for columns in self._columns(space, line, (space.path, line.span.start) not in self.lines_without_ops):
                end_ps = max(end_ps, _end_ps(columns))
                if line.name == COUNTERS_LINE:  # samples, not spans of the host's work
                    self.counters.read(plane, decoder, columns, line.timestamp_ns * 1000)
                    continue
                op_events = columns.with_stat(hlo_op_ids)
                starts = base_ns + columns.offset_ps // 1000
                durations = columns.duration_ps // 1000
                if len(starts):
                    self.latest_start_ns = max(self.latest_start_ns, int(starts.max()))
                if len(op_events):
                    self._host_ops(plane, decoder, columns, op_events, starts[op_events], durations[op_events],
                                   nesting)
                others = np.ones(len(columns), dtype=bool)
                others[op_events] = False
                self._annotation_rows(plane, annotations, columns.metadata_id[others], starts[others],
                                      durations[others])
            self.sink.extend("ops", nesting.flush())
            self._line_end(line, end_ps)

    def _annotation_rows(self, plane: Any, annotations: dict[int, tuple[str, int, int | None]],
                         metadata_ids: np.ndarray, starts: np.ndarray, durations: np.ndarray) -> None:
        """`annotations` rows of host events that are no XLA op, built a column at a time."""
        if not len(metadata_ids):
            return
        distinct, positions = distinct_ids(metadata_ids)
        found = []
        for metadata_id in distinct.tolist():
            annotation = annotations.get(metadata_id)
            if annotation is None:
                annotation = annotations[metadata_id] = self._annotation(plane.event_metadata[metadata_id].name)
            found.append(annotation)
        origins, name_sids, frame_ids = (per_event(list(column), positions) for column in zip(*found))
        steps = self._steps_at(starts)
        self.sink.extend("annotations", list(zip(
            repeat(self.rank), name_sids, origins, starts.tolist(), durations.tolist(), frame_ids, steps.tolist())))

    def _annotation(self, name: str) -> tuple[str, int, int | None]:
        """A host event that is no XLA op: a Python tracer frame (`$file:line function`) or a TraceMe range."""
        if name.startswith("$"):
            return "python", self.writer.intern(name[1:]), self._python_frame(name)
        return "traceme", self.writer.intern(name), None

    # -- ops and programs ---------------------------------------------------------------------------

    def _program(self, module_name: str) -> Program:
        program = self.programs.get(module_name)
        if program is None:
            program = self.programs[module_name] = Program(self.writer.next_id("programs"), module_name)
        return program

    def _version_name(self, module: str, program_id: int | None) -> str:
        """The program name of XLA's module `program_id` of name `module`: with its id (`jit_f(12)`, as a TPU's `XLA
        Modules` name a program) where the capture's HLO holds several modules of the name (a jitted function compiled
        for new shapes, or `jax.jit(f)` and `jax.jit(jax.grad(f))`), each its own program; else the name alone."""
        if program_id is None or len(self.hlo_versions.get(module, ())) < 2:
            return module
        return f"{module}({program_id})"

    def _op_meta(self, plane: Any, metadata_id: int, decoder: StatDecoder, module: str | None,
                 op_name: str | None = None, program_id: int | None = None) -> OpMeta:
        metadata = plane.event_metadata[metadata_id]
        stats = {decoder.name(stat.metadata_id): decoder.value(stat) for stat in metadata.stats}
        name = op_name or metadata.display_name or metadata.name
        frame_id = None
        source = stats.get("source")
        if isinstance(source, str):
            match = _SOURCE_STAT.match(source)
            if match:
                frame_id = self.writer.frame(match.group(1), int(match.group(2)), "")
        tf_op = stats.get("tf_op")
        sources = self._hlo_of(module or "", program_id)
        origin = sources.get(name)  # XLA:CPU's ops: their HLO instruction's metadata
        if origin is not None and frame_id is None and origin.file and origin.line:
            frame_id = self.writer.frame(origin.file, origin.line, origin.function)
        tf_op = tf_op or (origin.op_name if origin is not None else None)
        program_name = self._version_name(module, program_id) if module else module
        if program_name is None and "program_id" in stats:
            program_name = next((p.name for p in self.programs.values()
                                 if p.name.endswith(f"({stats['program_id']})")), f"program({stats['program_id']})")
        program = self._program(program_name) if program_name else None
        shapes = movement_shapes(metadata.name, stats.get("hlo_category"), name)
        if module is None:
            sources = self._hlo_of(re.sub(r"\(\d+\)$", "", program_name or ""), program_id)
        copied = sources.get(operand_name(shapes[0]) or "") if shapes else None
        tf_op = tf_op or (copied.op_name if copied is not None else None)  # a copy's: JAX's name of what it copies
        return OpMeta(
            name=name,
            name_sid=self.writer.intern(name),
            category=str(stats["hlo_category"]) if "hlo_category" in stats else collective_category(name),
            flops=float(stats.get("flops", 0) or 0),
            bytes_accessed=float(stats.get("bytes_accessed", 0) or 0),
            frame_id=frame_id,
            tf_op_sid=self.writer.intern(str(tf_op)) if tf_op else None,
            program=program,
            shape_sids=(self.writer.intern(shapes[0]), self.writer.intern(shapes[1])) if shapes else (None, None),
        )

    def _hlo_of(self, module: str, program_id: int | None) -> dict[str, InstructionSource]:
        """The instructions' sources of the program that ran: the proto of XLA's id `program_id` of module `module`
        (a name compiled several times has a proto each), else the first proto of the name."""
        if program_id is not None:
            found = next((sources for version, sources in self.hlo_versions.get(module, []) if version == program_id),
                         None)
            if found is not None:
                return found
        return self.hlo.get(module, {})

    def _signature(self, module: str, program_name: str) -> str | None:
        """A program's parameters' shapes from its HLO proto: that of XLA's id in its name (`jit_f(12)`), else of the
        name's only proto."""
        number = re.search(r"\((\d+)\)$", program_name)
        if number is not None:
            return self.hlo_signatures.get((module, int(number.group(1))))
        protos = self.hlo_versions.get(module, [])
        return self.hlo_signatures.get((module, protos[0][0])) if len(protos) == 1 else None

    def _python_frame(self, name: str) -> int | None:
        match = _PYTHON_FRAME.match(name)
        if match is None or match.group(1) == "<unknown>":
            return None
        frame_id: int = self.writer.frame(match.group(1), int(match.group(2)), match.group(3))
        return frame_id

    def _finish_programs(self) -> None:
        self.chip_calls.write(self.sink.extend, self.rank, self._collective_hlo)
        for program in self.programs.values():
            name_sid = self.writer.intern(program.name)
            structure = re.sub(r"\(\d+\)$", "", program.name)
            signature = self._signature(structure, program.name)
            self.sink.append("programs", (program.program_id, self.rank, "xla", name_sid, self.writer.intern(structure),
                                          signature and self.writer.intern(signature), len(program.op_names),
                                          program.flops or None,
                                          program.bytes_accessed or None, len(program.op_names) or None))
        for program_ids, chips, run_ids, starts, ends in self.runs.blocks_in_start_order():
            steps = self._steps_at(starts, run_ids).tolist()
            self.sink.extend("executions", list(zip(repeat(self.rank), program_ids, chips, starts.tolist(),
                                                    (ends - starts).tolist(), steps, repeat(None))))


def _end_ps(columns: EventColumns) -> int:
    """The latest end (ps after the line's start) of some events, 0 for none."""
    return max(int((columns.offset_ps + columns.duration_ps).max()), 0) if len(columns) else 0
