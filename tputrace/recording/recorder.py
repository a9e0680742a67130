"""The recorder: turns what the backend reports into trace records, tied to time, chip, step, the
user's source line and the nn.Module path, and writes them through the store's `TraceWriter`.

A `Recorder` is the event sink only: the backend calls its methods through
`tputrace.recording.interface.Recording`; starting and stopping one (and the processes a recording
starts) is `tputrace.recording.lifecycle`'s. What only the backend can tell (memory in use, a tensor's
shape) comes through the `DeviceReadings` it is given, so it never imports the backend, torch or jax.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from types import CodeType
from typing import Any, Protocol

from tputrace import performance_warnings, settings, source_digests, sourceloc
from tputrace.forks import FORKED_FROM_META_KEY, ForkOrigin
from tputrace.recording.executions import ExecutionWatcher
from tputrace.recording.live import LiveNotes
from tputrace.recording.sharding_records import ShardingRecords
from tputrace.schema import COMPILE_CACHE_META_KEY
from tputrace.store.writer import TraceWriter

_perf_ns = time.perf_counter_ns
_MEMORY_SAMPLE_INTERVAL_NS = 2_000_000


class DeviceReadings(Protocol):
    """What the recorder reads from the device it records."""

    def memory_in_use(self) -> Iterable[tuple[int, int, int]]:
        """(chip, live bytes, peak bytes) of each chip in use."""
        ...

    def shape_text(self, tensor: Any) -> str:
        """A tensor's dtype and shape as the trace writes them: `f32[2,3]`."""
        ...

    def chip_of(self, tensor: Any) -> int:
        """The chip a tensor is on."""
        ...


class Recorder(ShardingRecords):
    """One recording: a trace writer plus the context (step, module path, source) of each record."""

    def __init__(
        self,
        path: str | None,
        *,
        script: str,
        argv: list[str],
        mode: str,
        rank: int = 0,
        world_size: int = 1,
        fork_root: str | None = None,
        root_rank: int | None = None,
        device: DeviceReadings,
        forked_from: ForkOrigin | None = None,
        stopped_at_exit: bool = False,
    ) -> None:
        """`stopped_at_exit`: an atexit handler stops this recording, so its writer must not close itself earlier."""
        self.device = device
        self.path = path
        self.rank = rank
        self.world_size = world_size
        self.script = script
        self.argv = list(argv)
        self.mode = mode
        self.pid = os.getpid()
        # The trace that processes forked during this recording are merged into, and its rank.
        self.fork_root = fork_root if fork_root is not None else path
        self.root_rank = rank if root_rank is None else root_rank
        self.forked_from = forked_from
        self.t0 = _perf_ns()
        self.start_unix_ns = time.time_ns()
        # A forked process's file is created once it uses the tpu (most forked processes never do).
        self.writer = (
            TraceWriter(path, rank=rank, created_unix_ns=self.start_unix_ns, create_file=forked_from is None, close_at_exit=not stopped_at_exit)
            if path
            else None
        )
        self.enabled = self.writer is not None
        self.token = object()
        self.step_index = 0
        self.step_start = 0
        self.step_opened_by: str | None = None  # the `steps.source` of the boundary that began this step
        self.ops_at_step_start = 0
        self.recorded_in_step = False  # whether a record (op, flush, sync, copy, ...) fell in this step
        self.explicit_steps_seen = False  # whether the script marks steps itself (`tputrace.step()`)
        self._step_ends: list[int] = []  # the end of each step, ns since the run's start
        self.ops = 0
        self.compiles = 0
        self.live = LiveNotes()
        self.seq = 0
        self._last_memory_sample = 0
        self._library_roots = sourceloc.library_roots()
        self._user_code: dict[Any, bool] = {}
        self._frame_ids: dict[tuple[Any, int], int] = {}  # (code, line) -> frame id
        self._cause_ids: dict[tuple[Any, ...], int] = {}  # collective cause values -> collective_causes id
        self._call_frame_ids: dict[tuple[CodeType, int], int] = {}  # (code, instruction offset) -> frame id
        self._digested_files: set[str] = set()
        self._local = threading.local()
        self.main_thread = threading.get_ident()
        # The line that called backward() and that call on it, for what autograd's thread records.
        self.backward_frame: int | None = None
        self.backward_call_frame: int | None = None
        # Frame ids by thread id, while a thread runs a traced graph's nodes (see `recording_at`).
        self._traced_lines: dict[int, int] = {}
        self._location_frame_ids: dict[tuple[str, int, str], int] = {}
        self.module_names: dict[int, str] = {}
        self.last_frame_id: int | None = None  # what `frame_id` last returned
        self._executions: ExecutionWatcher | None = None
        if self.writer is not None:
            self._append_op = self.writer.appender("ops")
            self.writer.set_run(
                rank=rank,
                world_size=world_size,
                script=script,
                argv=list(argv),
                cwd=os.getcwd(),
                host=socket.gethostname(),
                pid=self.pid,
                start_unix_ns=self.start_unix_ns,
            )
            if forked_from is not None:
                self.writer.set_meta(FORKED_FROM_META_KEY, forked_from.to_json())
            compile_cache_directory = settings.compile_cache_path()
            if compile_cache_directory is not None:
                self.writer.set_meta(COMPILE_CACHE_META_KEY, compile_cache_directory)

    # ----------------------------------------------------------------- context
    def now(self) -> int:
        return _perf_ns() - self.t0

    def rel(self, perf_ns: int) -> int:
        return perf_ns - self.t0

    def frame_id(self, by_call: bool = False) -> int | None:
        """Interned id of the first frame in the user's code (outside torch, tputrace and libraries).

        `by_call` tells apart the calls on one line: the frame also has the column span of the calling
        instruction (compiles use it, so a line with two calls of one op gives two compile sites).
        The result is kept as `last_frame_id`: an op's output buffer takes its op's line from it."""
        frame_id = self.last_frame_id = self._user_frame_id(by_call)
        return frame_id

    def _user_frame_id(self, by_call: bool) -> int | None:
        if self._traced_lines:
            traced = self._traced_lines.get(threading.get_ident())
            if traced is not None:
                return traced
        frame = sys._getframe(3)
        user_code = self._user_code
        while frame is not None:
            code = frame.f_code
            try:
                is_user = user_code.get(code)
                if is_user is None:
                    is_user = user_code[code] = self._is_user_file(code.co_filename)
            except TypeError:  # code Dynamo rewrote can hold a dict among its constants: it does not hash
                if self._is_user_file(code.co_filename):
                    return self._intern_frame(code.co_filename, frame.f_lineno, code.co_name)
                frame = frame.f_back
                continue
            if is_user:
                line = frame.f_lineno
                if line == code.co_firstlineno:  # maybe an instruction torch.compile added
                    line = sourceloc.dynamo_line(code, frame.f_lasti, line)
                if by_call:
                    return self._call_frame_id(code, frame.f_lasti, line)
                key = (code, line)
                frame_id = self._frame_ids.get(key)
                if frame_id is None:
                    frame_id = self._frame_ids[key] = self._intern_frame(code.co_filename, line, code.co_name)
                return frame_id
            frame = frame.f_back
        if threading.get_ident() != self.main_thread:
            return self.backward_call_frame if by_call else self.backward_frame
        return None

    @contextlib.contextmanager
    def recording_at(self, location: tuple[str, int, str] | None) -> Iterator[None]:
        """Record what this thread does inside at `location` (file, line, function): the line a graph's node
        was traced from, for code that runs a traced graph (whose stack holds only the compiled call)."""
        if location is None:
            yield
            return
        frame_id = self._location_frame_id(location)
        thread = threading.get_ident()
        previous = self._traced_lines.get(thread)
        self._traced_lines[thread] = frame_id
        try:
            yield
        finally:
            if previous is None:
                del self._traced_lines[thread]
            else:
                self._traced_lines[thread] = previous

    def _location_frame_id(self, location: tuple[str, int, str]) -> int:
        """The frame id of a (file, line, function), interned once: a graph run op by op asks for each node of
        each call, a transfer for the line that made each batch."""
        frame_id = self._location_frame_ids.get(location)
        if frame_id is None:
            frame_id = self._location_frame_ids[location] = self._intern_frame(*location)
        return frame_id

    def _call_frame_id(self, code: CodeType, lasti: int, line: int) -> int:
        key = (code, lasti)
        frame_id = self._call_frame_ids.get(key)
        if frame_id is None:
            col, end_line, end_col = sourceloc.call_columns(code, lasti, line)
            frame_id = self._call_frame_ids[key] = self._intern_frame(code.co_filename, line, code.co_name, col, end_col, end_line)
        return frame_id

    def _intern_frame(self, file: str, line: int, function: str, col: int | None = None, end_col: int | None = None,
                      end_line: int | None = None) -> int:
        """The frame id of a user source location (of one call starting on its line with `col`, `end_col` and
        `end_line`); the first location in a file also records the file's digest (`source_files`), as the run saw it.
        A relative path (code compiled from one) is stored absolute, against the current directory."""
        if not file.startswith("<"):
            file = os.path.abspath(file)
        if file not in self._digested_files:
            self._digested_files.add(file)
            digest = source_digests.digest_file(file)
            if digest is not None:
                self.writer.append("source_files", (self.rank, self.writer.intern(file), digest.sha256, digest.size))
        return self.writer.frame(file, line, function, col, end_col, end_line)

    def frame_text(self, frame_id: int | None) -> str | None:
        """'file.py:LINE' for an interned frame id (recorded in this session)."""
        if frame_id is None:
            return None
        for (code, line), known_id in self._frame_ids.items():
            if known_id == frame_id:
                return f"{os.path.basename(code.co_filename)}:{line}"
        return None

    def _is_user_file(self, filename: str) -> bool:
        return sourceloc.is_user_file(filename, self._library_roots)

    def module_sid(self) -> int | None:
        stack = getattr(self._local, "modules", None)
        if not stack:
            return None
        return stack[-1]

    def push_module(self, path: str) -> None:
        stack = getattr(self._local, "modules", None)
        if stack is None:
            stack = self._local.modules = []
        stack.append(self.writer.intern(path))

    def pop_module(self) -> None:
        stack = getattr(self._local, "modules", None)
        if stack:
            stack.pop()

    # ----------------------------------------------------------------- records from the backend
    def _plan_ids(self, plan: Any) -> tuple[int, int, int, int]:
        ids = plan.trace_ids.get(self.token)
        if ids is None:
            writer = self.writer
            program_id = self._define_program(plan, "op", 1)
            ids = (writer.intern(plan.inputs_text), writer.intern(plan.outputs_text), program_id, writer.intern(plan.op_name))
            plan.trace_ids[self.token] = ids
        return ids

    def _define_program(self, plan: Any, kind: str, n_ops: int) -> int | None:
        """A `programs` row for the plan's program (None without one); `hlo_ops` is NULL where the backend read no HLO."""
        program = plan.program
        if program is None:
            return None
        writer = self.writer
        program_id = writer.next_id("programs")
        writer.append(
            "programs",
            (
                program_id,
                self.rank,
                kind,
                writer.intern(program.name),
                writer.intern(repr(plan.structure_key)),
                writer.intern(plan.inputs_text),
                n_ops,
                program.flops, program.bytes_accessed, program.hlo_ops,
            ),
        )
        return program_id

    def op_ran(self, plan: Any, name: str, start_ns: int, dur_ns: int, flush_id: int | None) -> None:
        """An ATen op was dispatched (strict: and launched)."""
        performance_warnings.raise_pending()
        if not self.enabled:
            self.ops += 1
            return
        inputs_sid, outputs_sid, program_id, _ = self._plan_ids(plan)
        self.seq += 1
        self.ops += 1
        self.recorded_in_step = True
        self._append_op(
            (
                self.seq,
                self.rank,
                self.writer.intern(name),
                inputs_sid,
                outputs_sid,
                plan.chip,
                start_ns - self.t0,
                dur_ns,
                self.frame_id(),
                self.module_sid(),
                self.step_index,
                program_id,
                flush_id,
            )
        )
        if self.seq & 255 == 0:
            self._maybe_sample_memory()

    def ops_flushed(self, op_records: list[tuple], chip: int, program_id: int | None, flush_id: int | None) -> None:
        """The ops of a DeferAndFuse flush, written once the flush (and so their program) is known.

        Each record is (seq, name, plan, start_ns, dur_ns, frame_id, module_sid, step)."""
        if not self.enabled:
            return
        append = self._append_op
        intern = self.writer.intern
        token = self.token
        rank = self.rank
        t0 = self.t0
        for seq, name, plan, start_ns, dur_ns, frame_id, module_sid, step in op_records:
            ids = plan.trace_ids.get(token) or self._plan_ids(plan)
            append((seq, rank, intern(name), ids[0], ids[1], chip, start_ns - t0, dur_ns, frame_id, module_sid, step, program_id, flush_id))

    def next_seq(self) -> int:
        self.seq += 1
        self.ops += 1
        self.recorded_in_step = True
        return self.seq

    def next_flush_id(self) -> int:
        """The id of the DeferAndFuse flush about to be recorded (`flushed`)."""
        return self.writer.next_id("flushes")

    def view_op(self, name: str, base: Any, results: list[Any]) -> None:
        """A view op: no program runs, but it is a dispatched op with a source line."""
        if not self.enabled:
            self.ops += 1
            return
        writer = self.writer
        self.seq += 1
        self.ops += 1
        self.recorded_in_step = True
        shape_text = self.device.shape_text
        inputs = shape_text(base)
        outputs = ", ".join(shape_text(result) for result in results)
        now = _perf_ns() - self.t0
        self._append_op((self.seq, self.rank, writer.intern(name), writer.intern(inputs), writer.intern(outputs), self.device.chip_of(base), now, 0, self.frame_id(), self.module_sid(), self.step_index, None, None))

    def compiled(self, plan: Any, kind: str, reason: str, diff: str | None, *, n_ops: int = 1, detail: dict | None = None, program_kind: str = "op") -> int | None:
        """A program was compiled: first compile, or a recompile with what changed."""
        self.compiles += 1
        self.live.compiled(plan.op_name, reason, diff)
        if not self.enabled:
            return None
        self.recorded_in_step = True
        writer = self.writer
        program_id = self._define_program(plan, program_kind, n_ops)
        if kind == "op":
            plan.trace_ids[self.token] = (writer.intern(plan.inputs_text), writer.intern(plan.outputs_text), program_id, writer.intern(plan.op_name))
        compile_ns = plan.program.compile_ns if plan.program is not None else 0
        if plan.program is not None and plan.program.loaded_from_disk:
            detail = {**(detail or {}), "loaded_from_disk": True}
        end = self.now()
        writer.append("compiles", (writer.next_id("compiles"), self.rank, program_id, kind, writer.intern(plan.op_name), writer.intern(plan.inputs_text), plan.chip,
                                   end - compile_ns, compile_ns, self.frame_id(by_call=True), self.step_index, reason, writer.intern(diff) if diff else None, json.dumps(detail) if detail else None))
        if self.compiles == 1 and self.forked_from is not None:
            writer.create_file()
            writer.commit()  # a forked process may end through os._exit: the parent still sees it used the tpu
        performance_warnings.recompiled(plan.op_name, reason, diff)
        return program_id

    # ----------------------------------------------------------------- torch.compile records
    def dynamo_frame_compiled(
        self,
        *,
        name: str,
        signature: str,
        file: str,
        line: int,
        function: str,
        start_ns: int,
        dur_ns: int,
        step: int,
        reason: str,
        diff: str | None,
        detail: dict,
        program_id: int | None,
    ) -> None:
        """A Dynamo frame compile (`compiles.kind = 'dynamo_frame'`): the frame's source location, a
        first compile or a recompile with its guard failure, and the Dynamo/AOT/XLA time split."""
        self.compiles += 1
        if not self.enabled:
            return
        self.recorded_in_step |= step == self.step_index
        writer = self.writer
        writer.append("compiles", (writer.next_id("compiles"), self.rank, program_id, "dynamo_frame", writer.intern(name), writer.intern(signature), -1,
                                   start_ns, dur_ns, self._intern_frame(file, line, function), step, reason, writer.intern(diff) if diff else None, json.dumps(detail)))

    def graph_lowered(self, name: str, signature: str, chip: int, start_ns: int, dur_ns: int, detail: dict) -> None:
        """AOTAutograd handed the backend a graph (`compiles.kind = 'aot'`): forward, backward or
        inference, with its op count; the time is the backend's lowering of it."""
        if not self.enabled:
            return
        self.recorded_in_step = True
        writer = self.writer
        writer.append("compiles", (writer.next_id("compiles"), self.rank, None, "aot", writer.intern(name), writer.intern(signature), chip,
                                   start_ns - self.t0, dur_ns, self.frame_id(by_call=True), self.step_index, "first", None, json.dumps(detail)))

    def graph_break(self, reason: str, file: str | None, line: int | None, function: str | None) -> None:
        """A torch.compile graph break, at the user's line that caused it."""
        if not self.enabled:
            return
        self.recorded_in_step = True
        writer = self.writer
        frame = self._intern_frame(file, line or 0, function or "") if file else None
        writer.append("graph_breaks", (self.rank, writer.intern(reason), frame, self.now(), self.step_index))

    def bucket_hit(self, graph: str, buckets: str, start_ns: int, dur_ns: int) -> None:
        """A compiled graph ran padded to a shape bucket (an annotation with source 'bucket')."""
        if not self.enabled:
            return
        self.writer.append("annotations", (self.rank, self.writer.intern(f"bucket {buckets} ({graph})"), "bucket", start_ns - self.t0, dur_ns, self.frame_id(), self.step_index))

    def fusion(self, program_id: int, fusion: Any) -> None:
        """One of XLA's fusions inside a compiled program."""
        writer = self.writer
        writer.append(
            "fusions",
            (self.rank, program_id, writer.intern(fusion.name), writer.intern(fusion.kind), writer.intern(",".join(fusion.hlo_ops)), writer.intern(",".join(fusion.aten_ops))),
        )

    def flushed(self, flush_id: int, program_id: int | None, trigger: str, n_ops: int, cache_hit: bool, chip: int, start_ns: int, dur_ns: int, input_bytes: int, output_bytes: int) -> None:
        """A DeferAndFuse flush: which ops ran as one program, why now, and whether it was cached."""
        self.recorded_in_step = True
        self.writer.append(
            "flushes",
            (flush_id, self.rank, program_id, trigger, self.frame_id(), n_ops, int(cache_hit), chip, start_ns - self.t0, dur_ns, input_bytes, output_bytes, self.step_index),
        )

    def execution_started(self, program_id: int | None, chip: int, launch_ns: int, flush_id: int | None, results: Any) -> None:
        """A program was launched; `executions` records when its results are ready."""
        if self._executions is None:
            self._executions = ExecutionWatcher(self.writer, self.rank, self.t0)
        self._executions.launched(program_id, chip, launch_ns, flush_id, self.step_index, results)

    def synced(self, kind: str, chip: int, start_ns: int, dur_ns: int, pending_ops: int) -> None:
        self.live.synced()
        if not self.enabled:
            return
        self.recorded_in_step = True
        self.writer.append("syncs", (self.rank, kind, self.frame_id(), chip, start_ns - self.t0, dur_ns, pending_ops, self.step_index))
        performance_warnings.synced(kind, self.step_index)

    def transferred(self, direction: str, nbytes: int, src_chip: int, dst_chip: int, start_ns: int, dur_ns: int,
                    origin: tuple[str, int, str] | None = None) -> None:
        if not self.enabled:
            return
        self.recorded_in_step = True
        origin_frame_id = None if origin is None else self._location_frame_id(origin)
        self.writer.append("transfers", (self.rank, direction, nbytes, src_chip, dst_chip, start_ns - self.t0, dur_ns, self.frame_id(),
                                         self.step_index, origin_frame_id))
        performance_warnings.transferred(direction, nbytes, self.step_index)

    def fell_back(self, op: str, inputs: str, chip: int, start_ns: int, dur_ns: int) -> None:
        if not self.enabled:
            return
        self.recorded_in_step = True
        writer = self.writer
        writer.append("fallbacks", (self.rank, writer.intern(op), writer.intern(inputs), chip, start_ns - self.t0, dur_ns, self.frame_id(), self.step_index))

    def collective(
        self,
        kind: str,
        nbytes: int,
        dtype: str,
        group: str,
        ranks: str,
        frame_id: int | None,
        start_ns: int,
        dur_ns: int,
        wait_ns: int | None,
        algorithm: str | None,
        bus_bandwidth: float | None,
        step: int,
        cause_id: int | None = None,
    ) -> None:
        """A collective finished (called from any thread). `start_ns` is a perf_counter time: when this
        rank's data entered the transport; `frame_id`, `step` and `cause_id` are those of the issuing call."""
        if not self.enabled:
            return
        self.recorded_in_step |= step == self.step_index
        writer = self.writer
        writer.append(
            "collectives",
            (self.rank, kind, nbytes, dtype, writer.intern(group), writer.intern(ranks), frame_id, start_ns - self.t0, dur_ns, wait_ns, algorithm,
             bus_bandwidth, step, cause_id),
        )

    def _maybe_sample_memory(self, force: bool = False) -> None:
        now = _perf_ns()
        if not force and now - self._last_memory_sample < _MEMORY_SAMPLE_INTERVAL_NS:
            return
        self._last_memory_sample = now
        for chip, live_bytes, peak_bytes in self.device.memory_in_use():
            self.writer.append("memory", (self.rank, chip, now - self.t0, live_bytes, peak_bytes))

    def buffer_lifetime(self, row: tuple[Any, ...]) -> None:
        """A `buffers` row: the backend's row with the rank, and its shape interned."""
        if not self.enabled or self.writer.closed:
            return
        row_id, chip, nbytes, dtype, shape, kind, frame_id, module_sid, alloc_ns, free_ns, step = row
        shape_sid = None if shape is None else self.writer.intern(shape)
        self.writer.append("buffers", (row_id, self.rank, chip, nbytes, dtype, shape_sid, kind, frame_id, module_sid, alloc_ns, free_ns, step))

    # ----------------------------------------------------------------- steps and annotations
    def step_boundary(self, source: str) -> None:
        """End the current step (`source`: what marked its end) and begin the next."""
        performance_warnings.raise_pending()
        end = self.now()
        if self.enabled:
            self.writer.append("steps", (self.rank, self.step_index, self.step_start, end, source))
            self._maybe_sample_memory(force=True)
        self.live.step_ended(end - self.step_start)
        self.step_index += 1
        self.step_start = end
        self.step_opened_by = source
        self.ops_at_step_start = self.ops
        self.recorded_in_step = False
        self._step_ends.append(end)

    def explicit_step(self) -> None:
        """A `tputrace.step()`; from then on optimizer steps do not mark steps. The first one right after
        an optimizer step's boundary, with no op run since, ends no step of its own: that boundary already
        ended the iteration (a loop calling both would otherwise get an empty extra step and every later
        step number one too high)."""
        first = not self.explicit_steps_seen
        self.explicit_steps_seen = True
        if first and self.step_opened_by == "optimizer" and self.ops == self.ops_at_step_start:
            return
        self.step_boundary("explicit")

    def optimizer_stepped(self) -> None:
        """After each optimizer.step(): a step boundary unless the script marks steps itself."""
        if not self.explicit_steps_seen:
            self.step_boundary("optimizer")

    def step_at(self, time_ns: int) -> int:
        """The step that was running at `time_ns` (ns since the run's start)."""
        later_ends = len(self._step_ends) - bisect.bisect_right(self._step_ends, time_ns)
        return self.step_index - later_ends

    def annotation(self, name: str, source: str, start_ns: int, dur_ns: int, frame_id: int | None) -> None:
        """A named range, in the step it began in (an `Optimizer.step` range ends after the boundary it marks)."""
        if not self.enabled:
            return
        self.writer.append("annotations", (self.rank, self.writer.intern(name), source, start_ns, dur_ns, frame_id, self.step_at(start_ns)))

    # ----------------------------------------------------------------- the end
    def finish(self, exit_status: int | None, error: str | None, run_fields: dict[str, Any]) -> None:
        """Write the last step, a memory sample and the run's end fields (`run_fields`: chips, versions, ...),
        then close the trace."""
        if self._executions is not None:
            self._executions.stop()
        end = self.now()
        if not self.enabled:
            return
        if self.ops or self.compiles:
            self.writer.create_file()
        if self.recorded_in_step:
            self.writer.append("steps", (self.rank, self.step_index, self.step_start, end, "end"))
        self._maybe_sample_memory(force=True)
        self.writer.update_run(end_ns=end, exit_status=exit_status, error=error, **run_fields)
        self.writer.close()
