"""The recorder: turns what the backend does into trace records, tied to time, chip, step, the
user's source line and the nn.Module path.

One recording is active per process at a time (`start` ... `stop`). The backend reports through the
methods of `Recorder`; `tputrace.step()` and `tputrace.annotate()` reach the active recording here.
This module imports torch only inside `start`, so the trace reader never pulls it in.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import queue
import socket
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from types import CodeType
from typing import Any

from tputrace import __version__, fork_recording, hlo_module, settings, source_digests, sourceloc, spawn_recording
from tputrace.forks import FORKED_FROM_META_KEY, ForkOrigin
from tputrace.schema import COMPILE_CACHE_META_KEY
from tputrace.store.writer import TraceWriter

_perf_ns = time.perf_counter_ns
_MEMORY_SAMPLE_INTERVAL_NS = 2_000_000

_active: "Recorder | None" = None
_explicit_steps_seen = False
_inherited_parent: str | None = None  # what a root recording found in spawn_recording.PARENT_ENV
# The eager mode (`EagerMode` value) `start` switched away from, which `stop` switches back to.
_eager_mode_before_start: str | None = None


def _finished(reference: weakref.ref) -> bool:
    """Whether a watched output is ready (or gone: freed, donated, or its program failed)."""
    try:
        return reference() is None or reference().is_ready()
    except Exception:  # noqa: BLE001 - a deleted or failed array: its program is over
        return True


class Recorder:
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
        forked_from: ForkOrigin | None = None,
        stopped_at_exit: bool = False,
    ) -> None:
        """`stopped_at_exit`: an atexit handler stops this recording, so its writer must not close itself earlier."""
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
        self._step_ends: list[int] = []  # the end of each step, ns since the run's start
        self.ops = 0
        self.compiles = 0
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
        self._executions: queue.SimpleQueue | None = None
        self._watcher: threading.Thread | None = None
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
        instruction (compiles use it, so a line with two calls of one op gives two compile sites)."""
        if self._traced_lines:
            traced = self._traced_lines.get(threading.get_ident())
            if traced is not None:
                return traced
        frame = sys._getframe(2)
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
        frame_id = self._location_frame_ids.get(location)
        if frame_id is None:  # interned once: a graph run op by op enters here for each node of each call
            frame_id = self._location_frame_ids[location] = self._intern_frame(*location)
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
        """A `programs` row for the plan's program (None without one); `hlo_ops` is NULL where no HLO was kept."""
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
                program.flops,
                program.bytes_accessed,
                program.hlo_ops if program.hlo_ops is not None else hlo_module.instruction_count(program.hlo_text) if program.hlo_text else None,
            ),
        )
        return program_id

    def op_ran(self, plan: Any, name: str, start_ns: int, dur_ns: int, flush_id: int | None) -> None:
        """An ATen op was dispatched (strict: and launched)."""
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

    def view_op(self, name: str, base: Any, results: list[Any]) -> None:
        """A view op: no program runs, but it is a dispatched op with a source line."""
        if not self.enabled:
            self.ops += 1
            return
        writer = self.writer
        self.seq += 1
        self.ops += 1
        self.recorded_in_step = True
        inputs = _shape_text(base)
        outputs = ", ".join(_shape_text(result) for result in results)
        now = _perf_ns() - self.t0
        self._append_op((self.seq, self.rank, writer.intern(name), writer.intern(inputs), writer.intern(outputs), base._buf.chip, now, 0, self.frame_id(), self.module_sid(), self.step_index, None, None))

    def compiled(self, plan: Any, kind: str, reason: str, diff: str | None, *, n_ops: int = 1, detail: dict | None = None, program_kind: str = "op") -> int | None:
        """A program was compiled: first compile, or a recompile with what changed."""
        self.compiles += 1
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
        writer.append(
            "compiles",
            (
                writer.next_id("compiles"),
                self.rank,
                program_id,
                kind,
                writer.intern(plan.op_name),
                writer.intern(plan.inputs_text),
                plan.chip,
                end - compile_ns,
                compile_ns,
                self.frame_id(by_call=True),
                self.step_index,
                reason,
                writer.intern(diff) if diff else None,
                json.dumps(detail) if detail else None,
            ),
        )
        if self.compiles == 1 and self.forked_from is not None:
            writer.create_file()
            writer.commit()  # a forked process may end through os._exit: the parent still sees it used the tpu
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
        writer.append(
            "compiles",
            (
                writer.next_id("compiles"),
                self.rank,
                program_id,
                "dynamo_frame",
                writer.intern(name),
                writer.intern(signature),
                -1,
                start_ns,
                dur_ns,
                self._intern_frame(file, line, function),
                step,
                reason,
                writer.intern(diff) if diff else None,
                json.dumps(detail),
            ),
        )

    def graph_lowered(self, name: str, signature: str, chip: int, start_ns: int, dur_ns: int, detail: dict) -> None:
        """AOTAutograd handed the backend a graph (`compiles.kind = 'aot'`): forward, backward or
        inference, with its op count; the time is the backend's lowering of it."""
        if not self.enabled:
            return
        self.recorded_in_step = True
        writer = self.writer
        writer.append(
            "compiles",
            (
                writer.next_id("compiles"),
                self.rank,
                None,
                "aot",
                writer.intern(name),
                writer.intern(signature),
                chip,
                start_ns - self.t0,
                dur_ns,
                self.frame_id(by_call=True),
                self.step_index,
                "first",
                None,
                json.dumps(detail),
            ),
        )

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
        """A program was launched; a watcher thread records when its results are ready.

        The watcher holds weak references only: a strong one would keep an output array from being
        donated to the next program (DeferAndFuse donates arrays nothing else holds), and whether it
        still held one would depend on the watcher's timing, changing the program from step to step."""
        if self._executions is None:
            self._executions = queue.SimpleQueue()
            self._watcher = threading.Thread(target=self._watch_executions, name="tputrace-executions", daemon=True)
            self._watcher.start()
        watched = [weakref.ref(value) for value in results if hasattr(value, "block_until_ready")]
        self._executions.put((program_id, chip, launch_ns, flush_id, self.step_index, watched))

    def _watch_executions(self) -> None:
        import jax

        while True:
            item = self._executions.get()
            if item is None:
                return
            program_id, chip, launch_ns, flush_id, step, watched = item
            del item
            if watched:
                # The outputs of one execution are ready together: polling one suffices. Polling
                # never holds it across a thread switch (see execution_started).
                delay = 50e-6
                while not _finished(watched[0]):
                    time.sleep(delay)
                    delay = min(delay * 2, 2e-3)
            end = _perf_ns()
            self.writer.append("executions", (self.rank, program_id, chip, launch_ns - self.t0, end - launch_ns, step, flush_id))

    def _stop_watcher(self) -> None:
        if self._executions is not None:
            self._executions.put(None)
            self._watcher.join(timeout=30)
            self._executions = None

    def synced(self, kind: str, chip: int, start_ns: int, dur_ns: int, pending_ops: int) -> None:
        if not self.enabled:
            return
        self.recorded_in_step = True
        self.writer.append("syncs", (self.rank, kind, self.frame_id(), chip, start_ns - self.t0, dur_ns, pending_ops, self.step_index))

    def transferred(self, direction: str, nbytes: int, src_chip: int, dst_chip: int, start_ns: int, dur_ns: int) -> None:
        if not self.enabled:
            return
        self.recorded_in_step = True
        self.writer.append("transfers", (self.rank, direction, nbytes, src_chip, dst_chip, start_ns - self.t0, dur_ns, self.frame_id(), self.step_index))

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

    # ----------------------------------------------------------------- sharding: meshes, placements, causes
    def device_mesh(self, shape: str, dim_names: str, ranks: str, frame_id: int | None) -> int:
        """A `device_meshes` row; returns its id."""
        writer = self.writer
        mesh_id = writer.next_id("device_meshes")
        writer.append("device_meshes", (mesh_id, self.rank, shape, dim_names, ranks, frame_id))
        return mesh_id

    def parameter_placement(self, name: str, module: str, wrapper: str, group: str | None, mesh_id: int | None, placements: str,
                            global_shape: str, local_shape: str, dtype: str, nbytes: int, bytes_per_rank: int, origin_frame_id: int | None) -> None:
        """A `parameter_placements` row: how one parameter is placed and what this rank holds."""
        writer = self.writer
        writer.append("parameter_placements", (
            self.rank, writer.intern(name), writer.intern(module), wrapper, None if group is None else writer.intern(group), mesh_id, placements,
            global_shape, local_shape, dtype, nbytes, bytes_per_rank, origin_frame_id,
        ))

    def collective_cause(self, cause: tuple[Any, ...]) -> int:
        """The id of a `collective_causes` row with these values (the table's columns after `id` and
        `rank`, texts for the `*_sid` ones), written the first time the cause is met."""
        cause_id = self._cause_ids.get(cause)
        if cause_id is None:
            writer = self.writer
            kind, phase, module, tensor, op, *rest = cause
            cause_id = writer.next_id("collective_causes")
            intern = writer.intern
            writer.append("collective_causes", (
                cause_id, self.rank, kind, phase, None if module is None else intern(module), None if tensor is None else intern(tensor),
                None if op is None else intern(op), *rest,
            ))
            self._cause_ids[cause] = cause_id
        return cause_id

    def _maybe_sample_memory(self, force: bool = False) -> None:
        now = _perf_ns()
        if not force and now - self._last_memory_sample < _MEMORY_SAMPLE_INTERVAL_NS:
            return
        self._last_memory_sample = now
        from tputrace.backend import memory

        for chip in memory.chips_in_use():
            self.writer.append("memory", (self.rank, chip, now - self.t0, memory.live_bytes(chip), memory.peak_bytes(chip)))

    # ----------------------------------------------------------------- steps and annotations
    def step_boundary(self, source: str) -> None:
        """End the current step (`source`: what marked its end) and begin the next."""
        end = self.now()
        if self.enabled:
            self.writer.append("steps", (self.rank, self.step_index, self.step_start, end, source))
            self._maybe_sample_memory(force=True)
        self.step_index += 1
        self.step_start = end
        self.step_opened_by = source
        self.ops_at_step_start = self.ops
        self.recorded_in_step = False
        self._step_ends.append(end)

    def explicit_step(self, first: bool) -> None:
        """A `tputrace.step()`. The `first` one right after an optimizer step's boundary, with no op run
        since, ends no step of its own: that boundary already ended the iteration (a loop calling both
        would otherwise get an empty extra step and every later step number one too high)."""
        if first and self.step_opened_by == "optimizer" and self.ops == self.ops_at_step_start:
            return
        self.step_boundary("explicit")

    def step_at(self, time_ns: int) -> int:
        """The step that was running at `time_ns` (ns since the run's start)."""
        later_ends = len(self._step_ends) - bisect.bisect_right(self._step_ends, time_ns)
        return self.step_index - later_ends

    def annotation(self, name: str, source: str, start_ns: int, dur_ns: int, frame_id: int | None) -> None:
        """A named range, in the step it began in (an `Optimizer.step` range ends after the boundary it marks)."""
        if not self.enabled:
            return
        self.writer.append("annotations", (self.rank, self.writer.intern(name), source, start_ns, dur_ns, frame_id, self.step_at(start_ns)))

    # ----------------------------------------------------------------- lifecycle
    def finish(self, exit_status: int | None, error: str | None, run_fields: dict[str, Any]) -> None:
        self._stop_watcher()
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


def _shape_text(tensor: Any) -> str:
    from tputrace.backend.dtypes import short_name

    return f"{short_name(tensor.dtype)}[{','.join(str(size) for size in tensor.shape)}]"


def active() -> Recorder | None:
    return _active


def start(path: str | None, *, script: str, argv: list[str], mode: str = "defer", rank: int | None = None, world_size: int | None = None) -> Recorder:
    """Load the backend, choose the eager mode (until `stop`), and start recording into `path` (None:
    record nothing).

    A recording of its own even in a process a recorded one started (a nested `tputrace run`)."""
    global _inherited_parent, _eager_mode_before_start
    if _active is not None:
        raise RuntimeError("a tputrace recording is already running in this process")
    _inherited_parent = spawn_recording.forget_parent()
    import tputrace.backend  # noqa: F401 - registers the tpu device

    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    from tputrace.backend.device_module import eager_mode

    previous_mode = eager_mode().value
    if _set_eager_mode(mode):
        _eager_mode_before_start = previous_mode
    if path is not None:
        fork_recording.clear_stale(path)
    try:
        recorder = Recorder(path, script=script, argv=argv, mode=mode, rank=rank, world_size=world_size)
    except BaseException:
        _restore_eager_mode()
        raise
    _begin(recorder)
    return recorder


def start_child(parent: spawn_recording.ParentRecording, start_method: str, *, script: str, argv: list[str]) -> None:
    """In a process a recorded one started as a fresh interpreter (the backend is loaded): run in the
    parent's eager mode and record as its child, unless the parent records nothing."""
    _set_eager_mode(parent.mode)
    if parent.trace is None:
        fork_recording.install()  # its own spawn children still get the tpu
        return
    recorder = fork_recording.child_recorder(parent, start_method, script=script, argv=argv)
    _begin(recorder)
    fork_recording.save_rows_at_os_exit()
    if start_method == "command":  # no multiprocessing `run` to wrap: its interpreter's exit ends it
        _stop_at_interpreter_exit()


def _stop_at_interpreter_exit() -> None:
    """End a command's recording when its interpreter exits. The exit status is not known there (the
    process waiting on the command writes it, `tputrace.command_exits`) except after an uncaught
    exception, whose traceback is kept: 1, or 130 for a KeyboardInterrupt (SIGINT), as a shell reports it."""
    import atexit
    import traceback

    uncaught: list[tuple[int, str]] = []
    previous_hook = sys.excepthook

    def remember_uncaught(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        status = 130 if issubclass(kind, KeyboardInterrupt) else 1
        uncaught.append((status, "".join(traceback.format_exception(kind, error, trace))))
        previous_hook(kind, error, trace)

    def stop_with_what_was_seen() -> None:
        exit_status, error = uncaught[-1] if uncaught else (None, None)
        stop(exit_status, error)

    sys.excepthook = remember_uncaught
    atexit.register(stop_with_what_was_seen)


def _set_eager_mode(mode: str) -> bool:
    """Switch to the eager mode a `--mode` names; False for one that names none (`compile`)."""
    from tputrace.backend.device_module import EagerMode, set_eager_mode

    eager = {"defer": EagerMode.DEFER_AND_FUSE, "strict": EagerMode.DEFER_NEVER, "blocking": EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING}.get(mode)
    if eager is None:
        return False
    set_eager_mode(eager)
    return True


def _restore_eager_mode() -> None:
    """Switch back to the eager mode `start` switched away from (none: `start` kept the mode)."""
    global _eager_mode_before_start
    if _eager_mode_before_start is None:
        return
    from tputrace.backend.device_module import set_eager_mode

    previous, _eager_mode_before_start = _eager_mode_before_start, None
    set_eager_mode(previous)


def _begin(recorder: Recorder) -> None:
    """Make `recorder` this process's recording and tell the processes it starts about it."""
    global _active, _explicit_steps_seen
    from tputrace.backend import hooks

    _active = recorder
    _explicit_steps_seen = False
    hooks.attach(recorder)
    fork_recording.install()
    spawn_recording.export(recorder)


def continue_in_forked_child(recorder: Recorder | None) -> None:
    """In a process just forked from a recording one: record into `recorder` (None: record nothing)
    instead of the parent's recording, whose writer this process must never use."""
    global _active
    from tputrace.backend import hooks

    hooks.detach()
    _active = recorder
    if recorder is not None:
        hooks.attach(recorder)


def stop(exit_status: int | None, error: str | None = None) -> None:
    """Flush pending work, finish the trace (run end, exit status, error) and close it; then switch back
    to the eager mode that was active before `start`, so a recording run in-process (`main(["run", ...])`,
    a benchmark) leaves the tpu ops that follow it running as they ran before it.

    `exit_status` None: not known (a command's recording, stopped at its interpreter's exit)."""
    global _active
    recorder = _active
    if recorder is None:
        return
    if recorder.pid != os.getpid():  # inherited through a fork that started no recording: the parent's to finish
        _active = None
        return
    if recorder.forked_from is None:
        spawn_recording.restore(_inherited_parent)
    from tputrace.backend import hooks

    try:
        hooks.flush_pending("exit")
    except Exception as flush_error:  # noqa: BLE001 - a failing flush must not lose the trace
        error = error or f"flush at exit failed: {flush_error}"
    hooks.detach()
    _active = None
    try:
        _finish_trace(recorder, exit_status, error)
    finally:
        _restore_eager_mode()


def _finish_trace(recorder: Recorder, exit_status: int | None, error: str | None) -> None:
    """Write the run's end fields and close the trace, then merge in the traces of the processes it started."""
    from tputrace.backend import chips
    from tputrace.backend.device_module import eager_mode

    if recorder.forked_from is not None and not (recorder.ops or recorder.compiles):
        recorder.writer.close()  # a child process that never used the tpu: no file was created
        return
    import jax
    import torch

    try:
        chip_count, platform = chips.count(), chips.platform()
    except chips.ChipError:  # TPUTRACE_PLATFORM or TPUTRACE_CHIPS asks for chips this host lacks; the script has raised it
        chip_count, platform = None, None
    run_fields = {
        "chips": chip_count,
        "platform": platform,
        "eager_mode": "COMPILE" if recorder.mode == "compile" else eager_mode().value,
        "torch_version": torch.__version__,
        "jax_version": jax.__version__,
        "tputrace_version": __version__,
    }
    recorder.finish(exit_status, error, run_fields)
    if recorder.path is not None and recorder.forked_from is None:
        fork_recording.merge_forked(recorder.path, recorder.rank)


def live_counts() -> dict[str, int]:
    recorder = _active
    if recorder is None:
        return {"steps": 0, "ops": 0, "compiles": 0}
    return {"steps": recorder.step_index, "ops": recorder.ops, "compiles": recorder.compiles}


def step() -> None:
    """An explicit step boundary (`tputrace.step()`); from then on optimizer steps do not mark steps."""
    global _explicit_steps_seen
    first = not _explicit_steps_seen
    _explicit_steps_seen = True
    recorder = _active
    from tputrace.backend import hooks

    hooks.flush_pending("step")
    if recorder is not None:
        recorder.explicit_step(first)


def optimizer_stepped() -> None:
    """Called after each optimizer.step(): a step boundary unless the script marks steps itself."""
    recorder = _active
    if recorder is not None and not _explicit_steps_seen:
        recorder.step_boundary("optimizer")


class annotate(contextlib.ContextDecorator):  # noqa: N801 - used like a function: tputrace.annotate("name")
    """Records a named range: `with tputrace.annotate("data"): ...` or as a decorator."""

    def __init__(self, name: str) -> None:
        self.name = str(name)
        self.start = 0
        self.frame: int | None = None

    def __enter__(self) -> "annotate":
        recorder = _active
        if recorder is not None and recorder.enabled:
            self.start = recorder.now()
            self.frame = recorder.frame_id()
        return self

    def __exit__(self, *exc: object) -> None:
        recorder = _active
        if recorder is not None and recorder.enabled:
            recorder.annotation(self.name, "annotate", self.start, recorder.now() - self.start, self.frame)
