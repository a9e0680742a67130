"""Export a trace as Chrome trace-event JSON (gzipped), which ui.perfetto.dev and chrome://tracing open.

Layout, per rank:
- a host process (`rank R · host H`) with one thread per kind of host activity: steps, annotated
  ranges, Python op dispatch, flushes, XLA compiles, syncs, transfers, CPU fallbacks, collectives;
- one process per chip (`rank R · tpu:N`) with a Steps thread and an `XLA programs` thread, on which
  each program execution is a slice with its ops nested inside (op times are estimates: see
  `tputrace.derived.device_runs`, the device timeline both exports draw), and an HBM counter.

Slices carry args (shapes, source line, module path, FLOPs and bytes); compiles, syncs and graph
breaks are also instants on their host process; a flow arrow goes from each flush (or, in strict
mode, each op dispatch) on the host to the program execution it caused on the chip.

Times are microseconds (`ts`, `dur`) with three decimals, so every value is a whole nanosecond,
counted from the earliest run start of the trace. Slices on one thread nest or are disjoint: slices
that would overlap partly are moved to an extra thread of the same name (`Syncs (2)`). Nothing here
imports torch or jax; strings from the trace are written as JSON data.
"""

from __future__ import annotations

import itertools
import operator
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tputrace.derived.device_runs import OpKey, ProgramRun, is_strict, scan_rank
from tputrace.derived.imported_sources import imported_device
from tputrace.derived.op_cost import TIME_ESTIMATE_NOTE, TargetChip
from tputrace.derived.op_time import op_time_kind
from tputrace.derived.projection import step_metadata
from tputrace.derived.trace_tables import DISPATCH_KEY, DUR, PROGRAM, SEQ, START, OpBatch, TraceTables, remember
from tputrace.viewers.export.collective_causes import cause_args, cause_column
from tputrace.viewers.export.hosts import host_names
from tputrace.viewers.export.perfetto_tracks import (
    CHUNK_EVENTS,
    LANE_STRIDE,
    NULL,
    SPILL_LINES,
    BackgroundWriter,
    TextTrack,
    Track,
    int_json,
    microseconds_text,
    slice_json,
    to_json,
)
from tputrace.analysis.target import DEFAULT_TARGET, target_chip

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

HOST_THREADS = ("Steps", "Annotations", "Python dispatch", "Flushes", "XLA compile", "Syncs", "Transfers",
                "CPU fallbacks", "Collectives")
CHIP_STEPS_TID, CHIP_PROGRAMS_TID = 1, 2  # a chip's threads: Steps, and programs with their ops nested
_PIDS_PER_RANK = 1000  # pid = rank * 1000 + 1 for the host, + 100 + chip for chips
_FLOW_NAME = "runs on chip"
_MAX_CACHED_OPS = 16_384  # descriptions of distinct ops kept for reuse (see `_op_tail`; run layouts are cached too)
_START_OF, _DUR_OF, _SEQ_OF = operator.itemgetter(START), operator.itemgetter(DUR), operator.itemgetter(SEQ)


class _Flows:
    """Flow arrows from slices of one track: each source slice's index, and its target's pid, tid and
    time, as columns (a trace has a flow per program execution)."""

    def __init__(self, source: Track) -> None:
        self.source = source
        self.indexes, self.pids, self.tids, self.times = array("q"), array("q"), array("q"), array("q")

    def __len__(self) -> int:
        return len(self.indexes)

    def add(self, index: int, target: tuple[int, int, int]) -> None:
        self.indexes.append(index)
        pid, tid, time = target
        self.pids.append(pid)
        self.tids.append(tid)
        self.times.append(time)


@dataclass(frozen=True)
class PerfettoExport:
    """What an export wrote: the file, and its counts of slices, instants, counters and flows."""

    path: Path
    slices: int
    instants: int
    counters: int
    flows: int


class _Export:
    """Builds the events of one trace: tracks of slices, instants, counters, flows and the names."""

    def __init__(self, tables: TraceTables, chip: TargetChip, spill_lines: int = SPILL_LINES) -> None:
        self.tables = tables
        self.chip = chip
        self.spill_lines = spill_lines
        self.tracks: dict[tuple[int, int], Track | TextTrack] = {}
        self.fragments: list[tuple[str, str]] = []
        self._fragment_ids: dict[Any, int] = {}
        self.instants: list[str] = []
        self.counters: list[str] = []
        self.flows: list[_Flows] = []
        self.process_names: dict[int, tuple[str, int]] = {}
        self._json_by_sid: dict[int, str] = {}
        self._json_by_frame: dict[int, str] = {}
        self._op_parts: dict[tuple[Any, ...], tuple[str, str, str]] = {}  # see `_op_fragment`
        self._layout_tails: dict[int, list[str]] = {}  # a run layout's op slices' JSON tails (see `ProgramRun.layout`)
        runs = tables.trace.sql("SELECT rank, start_unix_ns FROM runs")
        self.rank_offsets = {rank: start or 0 for rank, start in runs}
        self.origin_unix_ns = min(self.rank_offsets.values(), default=0)
        self.step_metadata = step_metadata(tables.trace, tables.trace.run.rank, chip)  # the first run's, as the summary
        self.estimated_op_times = False  # whether any program's op times are a roofline split (see `TIME_ESTIMATE_NOTE`)

    # -- building blocks --------------------------------------------------------------------------

    def fragment(self, key: Any, name: str, category: str, args: dict[str, Any]) -> int:
        """The id of the shared part of slices with `key`: name, category (a plain word of ours) and args."""
        fragment_id = self._fragment_ids.get(key)
        if fragment_id is None:
            fragment_id = self._fragment_ids[key] = len(self.fragments)
            members = to_json({name: value for name, value in args.items() if value is not None})[1:-1]
            self.fragments.append((f'"name":{to_json(name)},"cat":"{category}"', members))
        return fragment_id

    def track(self, pid: int, tid: int, name: str, columns: tuple[str, ...] = (), spill: bool = False) -> Track:
        """A thread's track; `spill`: one that grows with the ops, whose columns move to a file as it grows."""
        track = self.tracks.get((pid, tid))
        if track is None:
            track = self.tracks[(pid, tid)] = Track(pid, tid, name, columns, spill_slices=self.spill_lines if spill else None)
        assert isinstance(track, Track)
        return track

    def programs_track(self, pid: int) -> TextTrack:
        """A chip's `XLA programs` thread: programs follow each other and their ops nest inside them."""
        track = self.tracks.get((pid, CHIP_PROGRAMS_TID))
        if track is None:
            track = self.tracks[(pid, CHIP_PROGRAMS_TID)] = TextTrack(pid, CHIP_PROGRAMS_TID, "XLA programs", self.spill_lines)
        assert isinstance(track, TextTrack)
        return track

    def tail(self, fragment: int, extra: str = "") -> str:
        """A slice's name, category and args as JSON, from its fragment and its own args (`extra`)."""
        head, shared = self.fragments[fragment]
        if extra:
            return f'{head},"args":{{{extra}{"," + shared if shared else ""}}}}}'
        return f'{head},"args":{{{shared}}}}}'

    def instant(self, pid: int, tid: int, ts_ns: int, name: str, category: str, args: dict[str, Any]) -> None:
        members = to_json({key: value for key, value in args.items() if value is not None})
        self.instants.append(f'{{"ph":"i","s":"p","pid":{pid},"tid":{tid},"ts":{microseconds_text(ts_ns)},"name":{to_json(name)},'
                             f'"cat":{to_json(category)},"args":{members}}}')

    def counter(self, pid: int, ts_ns: int, name: str, values: dict[str, float]) -> None:
        self.counters.append(f'{{"ph":"C","pid":{pid},"tid":0,"ts":{microseconds_text(ts_ns)},"name":{to_json(name)},"args":{to_json(values)}}}')

    # -- one rank ---------------------------------------------------------------------------------

    def add_rank(self, rank: int, host: str) -> None:
        tables, trace = self.tables, self.tables.trace
        offset = self.rank_offsets.get(rank, self.origin_unix_ns) - self.origin_unix_ns
        host_pid = rank * _PIDS_PER_RANK + 1
        self.process_names[host_pid] = (f"rank {rank} · host {host}", host_pid)
        # An imported capture's chips are the devices it measured (XLA:CPU's, a GPU's), named as the summary names them.
        device = imported_device(trace, rank) or "tpu"
        # An XProf import's ops are the device's op times, not Python's dispatch.
        ops_track = "Device ops" if op_time_kind(trace, rank, programs_costed=False).device_ops else "Python dispatch"
        host_tracks = {
            name: self.track(host_pid, index + 1, ops_track if name == "Python dispatch" else name,
                             *((("seq",), True) if name == "Python dispatch" else ((), False)))
            for index, name in enumerate(HOST_THREADS)
        }
        chip_pids: dict[int, int] = {}
        strict = is_strict(trace, rank)

        def chip_pid(chip_index: int) -> int:
            pid = chip_pids.get(chip_index)
            if pid is None:
                pid = chip_pids[chip_index] = rank * _PIDS_PER_RANK + 100 + max(chip_index, 0)
                self.process_names[pid] = (f"rank {rank} · {device}:{chip_index}", pid)
            return pid

        chips = trace.sql("SELECT chips FROM runs WHERE rank = ?", (rank,))
        for chip_index in range(chips[0][0] if chips and chips[0][0] else 0):
            chip_pid(chip_index)
        dispatch = host_tracks["Python dispatch"]
        dispatch_index: dict[int, int] = {}
        text, source = tables.text, tables.source
        dispatch_fragments: dict[tuple[Any, ...], int] = {}

        def new_dispatch_fragment(key: tuple[Any, ...]) -> int:
            op_sid, inputs_sid, outputs_sid, frame_id, module_sid = key
            fragment = dispatch_fragments[key] = self.fragment(("dispatch", *key), text(op_sid) or "op", "dispatch", {
                "inputs": text(inputs_sid), "outputs": text(outputs_sid), "module": text(module_sid),
                "source": source(frame_id),
            })
            return fragment

        def on_ops(rows: OpBatch) -> None:
            keys = list(map(DISPATCH_KEY, rows))
            fragments = list(map(dispatch_fragments.get, keys))
            if None in fragments:
                for index, fragment in enumerate(fragments):
                    if fragment is None:
                        key = keys[index]
                        fragments[index] = dispatch_fragments.get(key)
                        if fragments[index] is None:
                            fragments[index] = new_dispatch_fragment(key)
            if strict:
                first = len(dispatch)
                for index, row in enumerate(rows):
                    if row[PROGRAM] is not None:
                        dispatch_index[row[SEQ]] = first + index
                        dispatch.watched.add(first + index)
            starts = [start + offset for start in map(_START_OF, rows)]
            dispatch.starts.extend(starts)
            dispatch.ends.extend([start + (dur or 0) for start, dur in zip(starts, map(_DUR_OF, rows))])
            dispatch.fragments.extend(fragments)  # type: ignore[arg-type]
            dispatch.values[0].extend(map(_SEQ_OF, rows))
            dispatch.settle()

        # Per run, what its flow arrow starts from (strict: its op's seq; else its flush id) and where it
        # ends (its slice's pid, tid and time, in `targets`): the run itself is written as text when it comes
        # (see `_add_run`).
        origins = array("q")
        targets = (array("q"), array("q"), array("q"))

        def on_run(run: ProgramRun) -> None:
            programs = self.programs_track(chip_pid(run.chip))
            origin = (run.op_seqs[0] if run.op_seqs else None) if strict else run.flush_id
            origins.append(NULL if origin is None else origin)
            for column, value in zip(targets, self._add_run(run, programs, offset)):
                column.append(value)

        def restart() -> None:
            dispatch.clear()
            for pid in chip_pids.values():
                self.programs_track(pid).clear()
            for column in (origins, *targets):
                del column[:]
            dispatch_index.clear()

        scan_rank(tables, rank, self.chip, on_run, on_ops, restart)
        flush_index = self._add_host_records(rank, host_pid, host_tracks, offset)
        flows = _Flows(dispatch if strict else host_tracks["Flushes"])
        source_indexes = dispatch_index if strict else flush_index
        for origin, pid, tid, time in zip(origins, *targets):
            source_index = source_indexes.get(origin) if origin != NULL else None
            if source_index is not None:
                flows.add(source_index, (pid, tid, time))
        self.flows.append(flows)
        for step, start_ns, end_ns in trace.sql("SELECT step, start_ns, end_ns FROM steps WHERE rank = ? ORDER BY step", (rank,)):
            if end_ns is None:
                continue
            fragment = self.fragment(("step", step), f"step {step}", "step", {"step": step})
            for pid in chip_pids.values():
                self.track(pid, CHIP_STEPS_TID, "Steps").add(start_ns + offset, end_ns + offset, fragment)
        memory_name = "HBM bytes" if device == "tpu" else f"{device} memory bytes"
        for chip_index, t_ns, live, peak in trace.sql(
            "SELECT chip, t_ns, live_bytes, peak_bytes FROM memory WHERE rank = ? ORDER BY t_ns", (rank,)
        ):
            values = {"live": live or 0, "peak": peak or 0}
            if chip_index is not None and chip_index < 0:  # a host-only row (chip -1): an import's host memory
                self.counter(host_pid, t_ns + offset, "host memory bytes", values)
            else:
                self.counter(chip_pid(chip_index or 0), t_ns + offset, memory_name, values)

    def _add_run(self, run: ProgramRun, programs: TextTrack, offset: int) -> tuple[int, int, int]:
        """Write a run and its ops on `programs`; returns the run's slice as a flow's target (pid, tid, time)."""
        tables = self.tables
        self.estimated_op_times |= run.estimated
        program = tables.programs.get(run.program_id)
        fragment = self.fragment(("program", run.program_id), f"{tables.program_name(run.program_id)} ({run.program_id})", "program", {
            "program_id": run.program_id,
            "kind": program.kind if program else None,
            "flops": program.flops if program else None,
            "bytes_accessed": program.bytes_accessed if program else None,
            "signature": program.signature if program else None,
            "aten_ops": program.n_ops if program else None,
            "hlo_ops": program.hlo_ops if program else None,
            "op_times": TIME_ESTIMATE_NOTE if run.estimated else "measured",
        })
        start = run.start_ns + offset
        end = start + run.dur_ns
        extra = (f'"flush_id":{int_json(run.flush_id)},"step":{int_json(run.step)},'
                 f'"queued_behind_previous_ns":{int_json(run.queued_ns or None)}')
        pid, tid = programs.pid, programs.tid
        lines = [slice_json(pid, tid, start, end, self.tail(fragment, extra))]
        # Op bounds in whole ns, inside the program's: the ops nest in it on the same thread.
        tails = self._layout_tails.get(run.layout) if run.layout is not None else None
        if tails is None:
            tails = [self._op_tail(OpKey._make(key), flops, read + write, run.estimated)
                     for key, flops, read, write in zip(run.op_keys, run.op_flops, run.op_read_bytes, run.op_write_bytes)]
            if run.layout is not None:
                remember(self._layout_tails, run.layout, tails)
        # Ops follow each other: each ends where the next begins, the last where the program ends.
        begins = [int(op_start + 0.5) + offset for op_start in run.op_starts_ns]
        if begins:
            begins[0] = start
            lines += map(slice_json, itertools.repeat(pid), itertools.repeat(tid), begins, [*begins[1:], end], tails)
        programs.add_lines(lines)
        return pid, tid, (start + max(end, start)) // 2

    def _op_tail(self, key: OpKey, flops: float, bytes_accessed: float, estimated: bool) -> str:
        """An op slice's name, category and args as JSON (see `tail`)."""
        tables = self.tables
        if key.fusion is not None:
            fusions = tables.fusions.get(key.program_id, [])
            fusion = fusions[key.fusion] if 0 <= key.fusion < len(fusions) else None
            name = fusion.name if fusion else tables.program_name(key.program_id)
            return self.tail(self.fragment(tuple(key), name, "xla op", {
                "fusion_kind": fusion.kind if fusion else None,
                "hlo_ops": fusion.hlo_ops if fusion else None,
                "aten_ops": ", ".join(fusion.aten_ops) if fusion else None,
                "flops": round(flops), "bytes_accessed": round(bytes_accessed), "time": "estimated",
            }))
        # One per distinct op of a program (a million-op trace can have a hundred thousand): all but
        # the FLOPs and bytes is the same for every position of the op in the program, made once.
        described = (key.program_id, key.op_sid, key.inputs_sid, key.outputs_sid, key.module_sid, key.frame_id, estimated)
        parts = self._op_parts.get(described)
        if parts is None:
            parts = remember(self._op_parts, described, self._describe_op(key, estimated), _MAX_CACHED_OPS)
        head, before, after = parts
        return f'{head},"args":{{{before}"flops":{round(flops)},"bytes_accessed":{round(bytes_accessed)}{after}}}}}'


    def _describe_op(self, key: OpKey, estimated: bool) -> tuple[str, str, str]:
        """An ATen op's slice head, and its args before and after its FLOPs and bytes (as JSON text)."""
        tables = self.tables
        op = tables.text(key.op_sid) or "op"
        fusion = tables.fusion_of(key.program_id, op)
        as_json = self._string_json
        before = "".join(
            f'"{name}":{as_json(sid)},'
            for name, sid in (("inputs", key.inputs_sid), ("outputs", key.outputs_sid), ("module", key.module_sid))
            if sid is not None and tables.text(sid) is not None
        )
        if key.frame_id is not None and tables.source(key.frame_id) is not None:
            before += f'"source":{self._frame_json(key.frame_id)},'
        after = f',"xla_fusion":{to_json(f"{fusion.name} ({fusion.kind})")}' if fusion else ""
        after += ',"time":"estimated"' if estimated else ',"time":"measured"'
        return f'"name":{to_json(op)},"cat":"aten op"', before, after

    def _string_json(self, sid: int) -> str:
        cached = self._json_by_sid.get(sid)
        if cached is None:
            cached = self._json_by_sid[sid] = to_json(self.tables.text(sid))
        return cached

    def _frame_json(self, frame_id: int) -> str:
        cached = self._json_by_frame.get(frame_id)
        if cached is None:
            cached = self._json_by_frame[frame_id] = to_json(self.tables.source(frame_id))
        return cached

    def _add_host_records(self, rank: int, pid: int, tracks: dict[str, Track], offset: int) -> dict[int, int]:
        """Everything on the host but op dispatch; returns each flush's slice index."""
        tables, trace = self.tables, self.tables.trace
        text, source, fragment = tables.text, tables.source, self.fragment
        for step, start_ns, end_ns, origin in trace.sql("SELECT step, start_ns, end_ns, source FROM steps WHERE rank = ?", (rank,)):
            if end_ns is not None:
                tracks["Steps"].add(start_ns + offset, end_ns + offset,
                                    fragment(("step", step), f"step {step}", "step", {"step": step}), f'"marked_by":{to_json(origin)}')
        for name_sid, origin, start_ns, dur_ns, frame_id, step in trace.sql(
            "SELECT name_sid, source, start_ns, dur_ns, frame_id, step FROM annotations WHERE rank = ?", (rank,)
        ):
            tracks["Annotations"].add(start_ns + offset, start_ns + (dur_ns or 0) + offset, fragment(
                ("annotation", name_sid, origin, frame_id), text(name_sid) or "range", "annotation",
                {"origin": origin, "source": source(frame_id)}), f'"step":{to_json(step)}')
        flush_index: dict[int, int] = {}
        for flush_id, program_id, trigger, frame_id, n_ops, cache_hit, chip_index, start_ns, dur_ns, input_bytes, output_bytes, step in trace.sql(
            "SELECT id, program_id, trigger, frame_id, n_ops, cache_hit, chip, start_ns, dur_ns, input_bytes, output_bytes, step "
            "FROM flushes WHERE rank = ?", (rank,)
        ):
            flush_index[flush_id] = tracks["Flushes"].add(start_ns + offset, start_ns + (dur_ns or 0) + offset, fragment(
                ("flush", trigger, frame_id, program_id), f"flush ({trigger})", "flush",
                {"trigger": trigger, "source": source(frame_id), "program_id": program_id,
                 "program": tables.program_name(program_id) if program_id is not None else None}),
                to_json({"flush_id": flush_id, "ops": n_ops, "cache_hit": bool(cache_hit), "chip": chip_index,
                       "input_bytes": input_bytes, "output_bytes": output_bytes, "step": step})[1:-1])
        for compile_id, program_id, kind, name_sid, signature_sid, chip_index, start_ns, dur_ns, frame_id, step, reason, diff_sid, detail in trace.sql(
            "SELECT id, program_id, kind, name_sid, signature_sid, chip, start_ns, dur_ns, frame_id, step, reason, diff_sid, detail "
            "FROM compiles WHERE rank = ?", (rank,)
        ):
            name = text(name_sid) or kind or "program"
            args = {"reason": reason, "what_changed": text(diff_sid), "kind": kind, "signature": text(signature_sid),
                    "source": source(frame_id), "program_id": program_id, "chip": chip_index, "step": step, "detail": detail}
            track = tracks["XLA compile"]
            track.add(start_ns + offset, start_ns + (dur_ns or 0) + offset, fragment(("compile", compile_id), f"compile {name}", "compile", args))
            self.instant(pid, track.tid, start_ns + offset, f"{reason or 'compile'}: {name}", "compile", args)
        for kind, frame_id, chip_index, start_ns, dur_ns, pending_ops, step in trace.sql(
            "SELECT kind, frame_id, chip, start_ns, dur_ns, pending_ops, step FROM syncs WHERE rank = ?", (rank,)
        ):
            track = tracks["Syncs"]
            track.add(start_ns + offset, start_ns + (dur_ns or 0) + offset,
                      fragment(("sync", kind, frame_id), f"sync ({kind})", "sync", {"kind": kind, "source": source(frame_id)}),
                      to_json({"stall_ns": dur_ns, "pending_ops": pending_ops, "chip": chip_index, "step": step})[1:-1])
            self.instant(pid, track.tid, start_ns + offset, f"sync: {kind}", "sync",
                         {"source": source(frame_id), "stall_ns": dur_ns, "pending_ops": pending_ops})
        for direction, nbytes, src_chip, dst_chip, start_ns, dur_ns, frame_id, step in trace.sql(
            "SELECT direction, bytes, src_chip, dst_chip, start_ns, dur_ns, frame_id, step FROM transfers WHERE rank = ?", (rank,)
        ):
            tracks["Transfers"].add(start_ns + offset, start_ns + (dur_ns or 0) + offset, fragment(
                ("transfer", direction, frame_id, src_chip, dst_chip), f"transfer {direction}", "transfer",
                {"direction": direction, "source": source(frame_id), "src_chip": src_chip, "dst_chip": dst_chip}),
                to_json({"bytes": nbytes, "step": step})[1:-1])
        for op_sid, inputs_sid, chip_index, start_ns, dur_ns, frame_id, step in trace.sql(
            "SELECT op_sid, inputs_sid, chip, start_ns, dur_ns, frame_id, step FROM fallbacks WHERE rank = ?", (rank,)
        ):
            tracks["CPU fallbacks"].add(start_ns + offset, start_ns + (dur_ns or 0) + offset, fragment(
                ("fallback", op_sid, inputs_sid, frame_id), f"{text(op_sid) or 'op'} (CPU fallback)", "fallback",
                {"inputs": text(inputs_sid), "source": source(frame_id), "chip": chip_index}), f'"step":{to_json(step)}')
        causes = cause_args(trace, rank)
        for kind, nbytes, dtype, group_sid, ranks_sid, frame_id, start_ns, dur_ns, wait_ns, algorithm, bus_bandwidth, step, cause_id in trace.sql(
            "SELECT kind, bytes, dtype, group_sid, ranks_sid, frame_id, start_ns, dur_ns, wait_ns, algorithm, bus_bandwidth, step, "
            f"{cause_column(trace)} FROM collectives WHERE rank = ?", (rank,)
        ):
            tracks["Collectives"].add(start_ns + offset, start_ns + (dur_ns or 0) + offset, fragment(
                ("collective", kind, group_sid, ranks_sid, frame_id, dtype, algorithm, cause_id), kind or "collective", "collective",
                {"group": text(group_sid), "ranks": text(ranks_sid), "source": source(frame_id), "dtype": dtype,
                 "algorithm": algorithm, **dict(causes.get(cause_id, ()) if cause_id is not None else ())}),
                to_json({"bytes": nbytes, "wait_ns": wait_ns, "bus_bandwidth_bytes_per_second": bus_bandwidth, "step": step})[1:-1])
        for reason_sid, frame_id, t_ns, step in trace.sql(
            "SELECT reason_sid, frame_id, t_ns, step FROM graph_breaks WHERE rank = ?", (rank,)
        ):
            self.instant(pid, tracks["XLA compile"].tid, t_ns + offset, "graph break", "graph break",
                         {"reason": text(reason_sid), "source": source(frame_id), "step": step})
        return flush_index

    # -- writing ----------------------------------------------------------------------------------

    def write(self, stream: IO[str] | BackgroundWriter) -> tuple[int, int]:
        """Write the JSON document; returns (slices, flows)."""
        tracks = [track for track in self.tracks.values() if len(track)]
        lanes = {id(track): track.assign_lanes() for track in tracks}
        stream.write('{"displayTimeUnit":"ns","otherData":')
        stream.write(to_json({"exporter": "tputrace", "time_origin_unix_ns": self.origin_unix_ns,
                            "target_chip": self.chip.name,
                            "op_times": TIME_ESTIMATE_NOTE if self.estimated_op_times else "measured",
                            "step_times": self.step_metadata}))
        stream.write(',"traceEvents":[\n')
        first = True

        def emit(chunks: Iterable[list[str]]) -> None:
            nonlocal first
            for chunk in chunks:
                if chunk:
                    stream.write(("" if first else ",\n") + ",\n".join(chunk))
                    first = False

        emit([list(self._name_events(tracks, lanes))])
        slices = 0
        heads = [head for head, _ in self.fragments]
        fragment_args = [args for _, args in self.fragments]
        fragment_tails = [f'{head},"args":{{{args}}}}}' for head, args in self.fragments]
        for track in tracks:
            emit(track.lines(heads, fragment_args, fragment_tails))
            slices += len(track)
        emit([self.instants, self.counters])
        flows = self._flow_events()
        emit(iter(lambda: list(islice(flows, CHUNK_EVENTS)), []))
        stream.write("\n]}\n")
        return slices, sum(map(len, self.flows))

    def _name_events(self, tracks: list[Track], lanes: dict[int, int]) -> Iterator[str]:
        for pid, (name, sort_index) in sorted(self.process_names.items()):
            yield f'{{"ph":"M","pid":{pid},"tid":0,"name":"process_name","args":{{"name":{to_json(name)}}}}}'
            yield f'{{"ph":"M","pid":{pid},"tid":0,"name":"process_sort_index","args":{{"sort_index":{sort_index}}}}}'
        for track in tracks:
            for lane in range(lanes[id(track)]):
                tid = track.tid + lane * LANE_STRIDE
                name = track.name if lane == 0 else f"{track.name} ({lane + 1})"
                yield f'{{"ph":"M","pid":{track.pid},"tid":{tid},"name":"thread_name","args":{{"name":{to_json(name)}}}}}'
                yield f'{{"ph":"M","pid":{track.pid},"tid":{tid},"name":"thread_sort_index","args":{{"sort_index":{tid}}}}}'

    def _flow_events(self) -> Iterator[str]:
        """Flow v1 arrows: `s` inside the source slice, `f` (bound to its enclosing slice) inside the
        target, both at the slice's middle so that neither sits on another slice's edge."""
        flow_id = 0
        for flows in self.flows:
            source = flows.source
            for source_index, target_pid, target_tid, target_ts in zip(flows.indexes, flows.pids, flows.tids, flows.times):
                flow_id += 1
                source_tid, source_ts = source.flow_point(source_index)
                yield (f'{{"ph":"s","id":{flow_id},"pid":{source.pid},"tid":{source_tid},'
                       f'"ts":{microseconds_text(source_ts)},"name":"{_FLOW_NAME}","cat":"flow"}}')
                yield (f'{{"ph":"f","bp":"e","id":{flow_id},"pid":{target_pid},"tid":{target_tid},'
                       f'"ts":{microseconds_text(target_ts)},"name":"{_FLOW_NAME}","cat":"flow"}}')


def export_perfetto(trace: Trace, path: str | Path, *, target: str = DEFAULT_TARGET, compresslevel: int = 1,
                    spill_lines: int = SPILL_LINES) -> PerfettoExport:
    """Write the trace as Chrome trace-event JSON to `path` (gzipped when it ends in `.gz`; level 1
    by default: trace-event JSON is large and repetitive, and compresses nearly as well at level 1 as
    at zlib's default level, in less time). A chip's programs and ops past `spill_lines` slices wait
    in a temporary file, not in memory."""
    out = Path(path)
    tables = TraceTables(trace)
    export = _Export(tables, target_chip(target), spill_lines)
    hosts = dict(trace.sql("SELECT rank, host FROM runs"))
    for rank in host_names(trace):
        export.add_rank(rank, hosts.get(rank) or "?")
    temporary = out.with_name(out.name + ".partial")
    try:
        with BackgroundWriter(temporary, compresslevel if out.suffix == ".gz" else None) as stream:
            slices, flows = export.write(stream)
        temporary.replace(out)
    finally:
        temporary.unlink(missing_ok=True)
    return PerfettoExport(out, slices, len(export.instants), len(export.counters), flows)
