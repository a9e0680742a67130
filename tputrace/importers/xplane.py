"""Importing an XProf `XSpace` (`<host>.xplane.pb` from jax.profiler, TorchTPU or PyTorch/XLA).

Mapping (docs/importing.md has the full table): one rank per file; XLA ops (device planes' `XLA Ops`
lines, or host-thread events with an `hlo_op` stat on XLA:CPU) become `ops` rows with their program,
`source` frame and `tf_op` path; XLA modules become `programs` and `executions` (FLOPs and bytes summed
from the ops' metadata stats); fusions become `fusions` rows; step markers (host events with a
`step_num` stat, or a device `Steps` line) become `steps`; Python tracer frames (`$file:line function`)
and TraceMe ranges become `annotations` with origin `python` or `traceme`.
"""

from __future__ import annotations

import mmap
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tputrace.importers.sink import ImportSink, StepClock
from tputrace.importers.sources import XPLANE, CaptureError
from tputrace.importers.wire import top_level_fields

_DEVICE_PLANE = re.compile(r"^/device:([A-Z]+)[^:]*:(\d+)$")
_PYTHON_FRAME = re.compile(r"^\$(.*?):(\d+) (.*)$")
_SOURCE_STAT = re.compile(r"^(.*?):(\d+)$")
_COLLECTIVE_CATEGORIES = {
    "all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
    "all-to-all": "all_to_all", "collective-permute": "send",
}
_XSPACE_PLANES = 1
# Line times below this (2001 in Unix ns) are relative to the profile's start, not to the epoch.
_UNIX_NS_FLOOR = 10**18


def _plane_stat(plane: Any, name: str) -> Any:
    names = {key: meta.name for key, meta in plane.stat_metadata.items()}
    for stat in plane.stats:
        if names.get(stat.metadata_id) == name:
            kind = stat.WhichOneof("value")
            return getattr(stat, kind) if kind else None
    return None


@dataclass
class _Program:
    program_id: int
    name: str
    flops: float = 0.0
    bytes_accessed: float = 0.0
    first_run: Any = None
    op_names: set[str] = field(default_factory=set)


@dataclass
class _Run:
    program: _Program
    chip: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class _OpMeta:
    """What an XLA op's event metadata says, read once per metadata id."""

    name: str
    category: str | None
    flops: float
    bytes_accessed: float
    frame_id: int | None
    tf_op_sid: int | None
    program: _Program | None


class XPlaneImporter:
    """Imports one `xplane.pb` as one rank."""

    def __init__(self, sink: ImportSink, path: Path) -> None:
        self.sink = sink
        self.path = path
        self.writer = sink.writer
        self.rank = sink.new_rank(XPLANE, str(path), host=path.name.removesuffix(".xplane.pb"))
        self.programs: dict[str, _Program] = {}
        self.runs: dict[tuple[int, int], _Run] = {}
        self.steps = StepClock()
        self.start_unix_ns = 0
        self.end_ns = 0
        self.seq = 0

    def run(self) -> None:
        with self.path.open("rb") as stream:
            if self.path.stat().st_size == 0:
                raise CaptureError(f"{self.path} is empty")
            with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                data = memoryview(mapped)
                try:
                    self._run(data)
                finally:
                    data.release()

    def _run(self, data: memoryview) -> None:
        from tputrace.xplane_proto import messages

        plane_class = messages()["XPlane"]
        plane_slices = [value for number, value in top_level_fields(data, str(self.path))
                        if number == _XSPACE_PLANES and isinstance(value, memoryview)]
        if not plane_slices:
            raise CaptureError(f"{self.path} holds no XPlane: not an XProf capture")
        # First pass: the capture's start and its step markers (both needed before any row is written).
        device_kind = "cpu"
        chips: set[int] = set()
        starts: list[int] = []
        host_markers: list[tuple[int, int]] = []
        device_markers: dict[int, list[tuple[int, int]]] = {}
        profile_start_unix_ns = None
        for plane_bytes in plane_slices:
            plane = self._parse(plane_class, plane_bytes)
            if plane.name == "Task Environment":
                profile_start_unix_ns = _plane_stat(plane, "profile_start_time")
            match = _DEVICE_PLANE.match(plane.name)
            if match:
                device_kind = match.group(1).lower()
                chips.add(int(match.group(2)))
            starts += [line.timestamp_ns for line in plane.lines if line.events]
            if match:
                device_markers[int(match.group(2))] = self._step_markers(plane)
            else:
                host_markers += self._step_markers(plane)
        # The host's step markers when there are any, else one chip's `Steps` line (every chip has one).
        markers = host_markers or (device_markers[min(device_markers)] if device_markers else [])
        self.start_unix_ns = min(starts) if starts else 0
        # Some producers write line times relative to the profile's start (held by the Task Environment plane).
        start_unix_ns = self.start_unix_ns
        if start_unix_ns < _UNIX_NS_FLOOR and isinstance(profile_start_unix_ns, int):
            start_unix_ns += profile_start_unix_ns
        self.steps.starts = sorted(start - self.start_unix_ns for start, _ in markers)
        ends = sorted(end - self.start_unix_ns for _, end in markers)
        for index, (start_ns, end_ns) in enumerate(zip(self.steps.starts, ends)):
            self.sink.append("steps", (self.rank, index + 1, start_ns, end_ns, "imported"))
        self.sink.note(self.rank, device=device_kind)
        self.writer.set_run(rank=self.rank, world_size=1, script=str(self.path), argv=[], cwd=None,
                            host=self.sink.sources[self.rank]["host"], chips=max(len(chips), 1),
                            platform=device_kind, start_unix_ns=start_unix_ns)
        # Second pass: the rows.
        for plane_bytes in plane_slices:
            plane = self._parse(plane_class, plane_bytes)
            match = _DEVICE_PLANE.match(plane.name)
            if match:
                self._device_plane(plane, int(match.group(2)))
            elif plane.name.startswith("/host:") and plane.name != "/host:metadata":
                self._host_plane(plane)
            self.end_ns = max([self.end_ns] + [line.timestamp_ns - self.start_unix_ns
                                               + max((event.offset_ps + event.duration_ps for event in line.events),
                                                     default=0) // 1000 for line in plane.lines])
        self._finish_programs()
        self.writer.update_run(rank=self.rank, end_ns=self.end_ns)

    def _parse(self, plane_class: type, plane_bytes: memoryview) -> Any:
        plane = plane_class()
        try:
            plane.ParseFromString(plane_bytes)
        except Exception as error:  # protobuf's DecodeError
            raise CaptureError(f"{self.path} holds a damaged XPlane ({error})") from None
        return plane

    # -- planes -------------------------------------------------------------------------------------

    def _step_markers(self, plane: Any) -> list[tuple[int, int]]:
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        step_ids = {key for key, name in stat_names.items() if name == "step_num"}
        markers = []
        is_device = bool(_DEVICE_PLANE.match(plane.name))
        for line in plane.lines:
            if is_device and line.name != "Steps":
                continue
            for event in line.events:
                if is_device or any(stat.metadata_id in step_ids for stat in event.stats):
                    start = line.timestamp_ns + event.offset_ps // 1000
                    markers.append((start, start + event.duration_ps // 1000))
        return markers

    def _device_plane(self, plane: Any, chip: int) -> None:
        decoder = _StatDecoder(plane)
        op_metas: dict[int, _OpMeta] = {}
        for line in plane.lines:
            base_ns = line.timestamp_ns - self.start_unix_ns
            if line.name == "XLA Modules":
                for event in line.events:
                    program = self._program(plane.event_metadata[event.metadata_id].name)
                    start_ns = base_ns + event.offset_ps // 1000
                    end_ns = start_ns + event.duration_ps // 1000
                    self.runs[(chip, len(self.runs))] = _Run(program, chip, start_ns, end_ns)
            elif line.name == "XLA Ops":
                for event in line.events:
                    meta = op_metas.get(event.metadata_id)
                    if meta is None:
                        meta = op_metas[event.metadata_id] = self._op_meta(plane, event.metadata_id, decoder, None)
                    start_ns = base_ns + event.offset_ps // 1000
                    self._op(meta, None, chip, start_ns, event.duration_ps // 1000)

    def _host_plane(self, plane: Any) -> None:
        decoder = _StatDecoder(plane)
        hlo_op_stat = decoder.ids_named("hlo_op")
        module_stat = decoder.ids_named("hlo_module")
        run_stat = decoder.ids_named("run_id")
        chip_stat = decoder.ids_named("device_ordinal")
        # Per event metadata id: (annotation origin, name sid, frame id) of an event that is no XLA op.
        annotations: dict[int, tuple[str, int, int | None]] = {}
        op_metas: dict[tuple[int, str], _OpMeta] = {}
        hlo_op_ids = set(hlo_op_stat)
        append = self.sink.append
        step_at = self.steps.step_at
        for line in plane.lines:
            base_ns = line.timestamp_ns - self.start_unix_ns
            for event in line.events:
                start_ns = base_ns + event.offset_ps // 1000
                dur_ns = event.duration_ps // 1000
                event_stats = event.stats
                if event_stats and any(stat.metadata_id in hlo_op_ids for stat in event_stats):
                    stats = {stat.metadata_id: stat for stat in event_stats}
                    hlo_op = next(decoder.value(stats[key]) for key in hlo_op_stat if key in stats)
                    module = next((decoder.value(stats[key]) for key in module_stat if key in stats), "")
                    run_id = next((decoder.value(stats[key]) for key in run_stat if key in stats), None)
                    chip = next((decoder.value(stats[key]) for key in chip_stat if key in stats), 0)
                    key = (event.metadata_id, str(module))
                    meta = op_metas.get(key)
                    if meta is None:
                        meta = self._op_meta(plane, event.metadata_id, decoder, str(module), str(hlo_op))
                        op_metas[key] = meta
                    self._op(meta, run_id, int(chip), start_ns, dur_ns)
                    continue
                annotation = annotations.get(event.metadata_id)
                if annotation is None:
                    annotation = annotations[event.metadata_id] = self._annotation(
                        plane.event_metadata[event.metadata_id].name)
                origin, name_sid, frame_id = annotation
                append("annotations", (self.rank, name_sid, origin, start_ns, dur_ns, frame_id, step_at(start_ns)))

    def _annotation(self, name: str) -> tuple[str, int, int | None]:
        """A host event that is no XLA op: a Python tracer frame (`$file:line function`) or a TraceMe range."""
        if name.startswith("$"):
            return "python", self.writer.intern(name[1:]), self._python_frame(name)
        return "traceme", self.writer.intern(name), None

    # -- ops and programs ---------------------------------------------------------------------------

    def _program(self, module_name: str) -> _Program:
        program = self.programs.get(module_name)
        if program is None:
            program = self.programs[module_name] = _Program(self.writer.next_id("programs"), module_name)
        return program

    def _op_meta(self, plane: Any, metadata_id: int, decoder: _StatDecoder, module: str | None,
                 op_name: str | None = None) -> _OpMeta:
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
        program_name = module
        if program_name is None and "program_id" in stats:
            program_name = next((p.name for p in self.programs.values()
                                 if p.name.endswith(f"({stats['program_id']})")), f"program({stats['program_id']})")
        program = self._program(program_name) if program_name else None
        return _OpMeta(
            name=name,
            category=str(stats["hlo_category"]) if "hlo_category" in stats else None,
            flops=float(stats.get("flops", 0) or 0),
            bytes_accessed=float(stats.get("bytes_accessed", 0) or 0),
            frame_id=frame_id,
            tf_op_sid=self.writer.intern(str(tf_op)) if tf_op else None,
            program=program,
        )

    def _op(self, meta: _OpMeta, run_id: Any, chip: int, start_ns: int, dur_ns: int) -> None:
        self.seq += 1
        step = self.steps.step_at(start_ns)
        program = meta.program
        self.sink.append("ops", (self.seq, self.rank, self.writer.intern(meta.name), None, None, chip, start_ns, dur_ns,
                                 meta.frame_id, meta.tf_op_sid, step, program.program_id if program else None, None))
        if meta.category in _COLLECTIVE_CATEGORIES:
            self.sink.append("collectives", (self.rank, _COLLECTIVE_CATEGORIES[meta.category], int(meta.bytes_accessed),
                                             None, None, None, meta.frame_id, start_ns, dur_ns, None, None, None, step))
        if program is None:
            return
        if run_id is not None:
            run = self.runs.get((chip, run_id))
            if run is None:
                self.runs[(chip, run_id)] = _Run(program, chip, start_ns, start_ns + dur_ns)
            else:
                run.start_ns = min(run.start_ns, start_ns)
                run.end_ns = max(run.end_ns, start_ns + dur_ns)
            if program.first_run is None:
                program.first_run = (chip, run_id)
            if program.first_run != (chip, run_id):
                return
        if meta.name in program.op_names:
            return
        program.op_names.add(meta.name)
        program.flops += meta.flops
        program.bytes_accessed += meta.bytes_accessed
        if "fusion" in meta.name or (meta.category or "").endswith(" fusion"):
            self.sink.append("fusions", (self.rank, program.program_id, self.writer.intern(meta.name),
                                         self.writer.intern(meta.category or "fusion"), None, None))

    def _python_frame(self, name: str) -> int | None:
        match = _PYTHON_FRAME.match(name)
        if match is None or match.group(1) == "<unknown>":
            return None
        return self.writer.frame(match.group(1), int(match.group(2)), match.group(3))

    def _finish_programs(self) -> None:
        for program in self.programs.values():
            name_sid = self.writer.intern(program.name)
            structure = re.sub(r"\(\d+\)$", "", program.name)
            self.sink.append("programs", (program.program_id, self.rank, "xla", name_sid, self.writer.intern(structure),
                                          None, len(program.op_names), program.flops or None,
                                          program.bytes_accessed or None, len(program.op_names) or None))
        for run in sorted(self.runs.values(), key=lambda run: run.start_ns):
            self.sink.append("executions", (self.rank, run.program.program_id, run.chip, run.start_ns,
                                            run.end_ns - run.start_ns, self.steps.step_at(run.start_ns), None))


class _StatDecoder:
    """Stat names and values of one plane (a `ref_value` resolves to the interned string it points at)."""

    def __init__(self, plane: Any) -> None:
        self._names = {key: meta.name for key, meta in plane.stat_metadata.items()}

    def name(self, metadata_id: int) -> str:
        return self._names.get(metadata_id, "")

    def ids_named(self, name: str) -> list[int]:
        return [key for key, value in self._names.items() if value == name]

    def value(self, stat: Any) -> Any:
        kind = stat.WhichOneof("value")
        if kind is None:
            return None
        if kind == "ref_value":
            return self._names.get(stat.ref_value, "")
        return getattr(stat, kind)
