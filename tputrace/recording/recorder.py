"""The recorder: turns what the backend reports into trace records, tied to time, chip, step, the
user's source line and the nn.Module path, and writes them through the store's `TraceWriter`.

A `Recorder` is the event sink only: the backend calls its methods through
`tputrace.recording.interface.Recording`; starting and stopping one (and the processes a recording
starts) is `tputrace.recording.lifecycle`'s. What only the backend can tell (memory in use, a tensor's
shape) comes through the `DeviceReadings` it is given, so it never imports the backend, torch or jax.
"""

from __future__ import annotations

import bisect
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Hashable
from types import CodeType
from typing import Any, Literal

from tputrace import performance_warnings, settings, sourceloc
from tputrace.forks import FORKED_FROM_META_KEY, ForkOrigin
from tputrace.recording.executions import ExecutionWatcher
from tputrace.recording.interface import DeviceReadings
from tputrace.recording.live import LiveNotes
from tputrace.recording.sharding_records import ShardingRecords
from tputrace.recording.user_frames import OP_DEFERRED, OP_RAN, VIEW_OP, UserFrames
from tputrace.recording.recording_window import WindowSpec, WindowState
from tputrace.schema import COMPILE_CACHE_META_KEY, RECORDING_WINDOW_META_KEY
from tputrace.store.writer import TraceWriter

_perf_ns = time.perf_counter_ns
_thread_id = threading.get_ident
_MEMORY_SAMPLE_INTERVAL_NS = 2_000_000
_pending_warnings = performance_warnings.pending  # checked before calling `raise_pending` (the list is only mutated)


class Recorder(ShardingRecords, UserFrames):
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
        window: WindowSpec | None = None,
    ) -> None:
        """`stopped_at_exit`: an atexit handler stops this recording, so its writer must not close itself earlier; `window`: the steps to keep."""
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
        self.window = WindowState(window)
        self.keeps_lifetime = self.window.keeps_lifetime  # whether a buffer made at `alloc_ns`, freed now, lived in the window
        self.window_open = self.enabled and self.window.open  # False: events are not recorded now
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
        # Keyed by id(code), the code objects kept alive in `_seen_code` so that an id never changes hands: hashing
        # a code object hashes its bytecode and constants, and this runs for every frame of every op's stack.
        # id(code) -> False where the code is not the user's, else the frame id of each of its call sites' lines
        # (instruction offset -> frame id): a call site's line, and so its frame, never changes.
        self._user_code: dict[int, dict[int, int] | Literal[False]] = {}
        self._seen_code: list[CodeType] = []
        # The frame ids of single calls (`by_call`): (id(code), instruction offset) -> frame id.
        self._call_frame_ids: dict[tuple[int, int], int] = {}
        self._frame_texts: dict[int, str] = {}  # line frame id -> 'file.py:LINE'
        self._view_sites: dict[Hashable, tuple[int, int, int, int]] = {}  # view op site -> (name, inputs, outputs sids, chip)
        self._cause_ids: dict[tuple[Any, ...], int] = {}  # collective cause values -> collective_causes id
        self._digested_files: set[str] = set()
        # The module paths (string ids) each thread is inside, by thread id: a dict read is cheaper than a
        # `threading.local` attribute, most of all where a thread has none (autograd's, the optimizer's ops).
        self.module_stacks: dict[int, list[int]] = {}
        self.main_thread = threading.get_ident()
        # The line that called backward() and that call on it, for what autograd's thread records.
        self.backward_frame: int | None = None
        self.backward_call_frame: int | None = None
        # Frame ids by thread id, while a thread runs a traced graph's nodes (see `recording_at`).
        self._traced_lines: dict[int, int] = {}
        self._location_frame_ids: dict[tuple[str, int, str], int] = {}
        self.module_names: dict[int, str] = {}
        self.last_frame_id: int | None = None  # what `frame_id` last returned
        self._dispatch_entry: CodeType | None = None  # the backend's dispatch entry (`dispatches_through`)
        self._entry_depths: list[list[int]] = []
        self._executions: ExecutionWatcher | None = None
        self._kept_flush: int | None = None  # the last flush written (its execution is written with it)
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
            if window is not None:
                self.writer.set_meta(RECORDING_WINDOW_META_KEY, self.window.meta_json())

    # ----------------------------------------------------------------- context
    def now(self) -> int:
        return _perf_ns() - self.t0

    def rel(self, perf_ns: int) -> int:
        return perf_ns - self.t0

    def intern(self, text: str) -> int:
        return self.writer.intern(text)

    def module_sid(self) -> int | None:
        stack = self.module_stacks.get(_thread_id())
        return stack[-1] if stack else None

    def module_stack(self) -> list[int]:
        """This thread's module stack (path string ids, innermost last), which the backend pushes and pops."""
        stack = self.module_stacks.get(_thread_id())
        if stack is None:
            stack = self.module_stacks[_thread_id()] = []
        return stack

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
        """An ATen op was dispatched (strict: and launched). The hot path of every recorded op: what it
        calls is inlined, and its strings are interned once per plan."""
        if _pending_warnings:
            performance_warnings.raise_pending()
        if not self.window_open:
            return
        ids = plan.trace_ids.get(self.token) or self._plan_ids(plan)
        seq = self.seq = self.seq + 1
        self.ops += 1
        self.recorded_in_step = True
        frame_id = self.last_frame_id = self._user_frame_id(False, 2, OP_RAN)
        stacks = self.module_stacks
        stack = stacks.get(_thread_id()) if stacks else None
        self._append_op((seq, self.rank, ids[3] if name == plan.op_name else self.writer.intern(name), ids[0], ids[1], plan.chip,
                         start_ns - self.t0, dur_ns, frame_id, stack[-1] if stack else None, self.step_index, ids[2], flush_id))
        if seq & 255 == 0:
            self.writer.relieve()
            self._maybe_sample_memory()

    def op_deferred(self, op_records: list[tuple], name: str, plan: Any, start_ns: int) -> None:
        """A DeferAndFuse op was dispatched: its record joins `op_records` (its graph's), written by
        `ops_flushed` once the flush runs it. `start_ns` is a perf_counter time."""
        dur_ns = _perf_ns() - start_ns
        seq = self.seq = self.seq + 1
        self.ops += 1
        self.recorded_in_step = True
        frame_id = self.last_frame_id = self._user_frame_id(False, 2, OP_DEFERRED)
        stacks = self.module_stacks
        stack = stacks.get(_thread_id()) if stacks else None
        op_records.append((seq, name, plan, start_ns, dur_ns, frame_id, stack[-1] if stack else None, self.step_index))

    def ops_flushed(self, op_records: list[tuple], chip: int, program_id: int | None, flush_id: int | None) -> None:
        """The ops of a DeferAndFuse flush, written once the flush (and so their program) is known.

        Each record is (seq, name, plan, start_ns, dur_ns, frame_id, module_sid, step) (`op_deferred`)."""
        if not self.enabled:
            return
        append = self._append_op
        intern = self.writer.intern
        token = self.token
        rank = self.rank
        t0 = self.t0
        for seq, name, plan, start_ns, dur_ns, frame_id, module_sid, step in op_records:
            ids = plan.trace_ids.get(token) or self._plan_ids(plan)
            append((seq, rank, ids[3] if name == plan.op_name else intern(name), ids[0], ids[1], chip, start_ns - t0, dur_ns, frame_id, module_sid,
                    step, program_id, flush_id))
        self.writer.relieve()

    def next_flush_id(self) -> int:
        """The id of the DeferAndFuse flush about to be recorded (`flushed`)."""
        return self.writer.next_id("flushes")

    def view_op(self, name: str, base: Any, results: list[Any], site: Hashable | None = None) -> None:
        """A view op: no program runs, but it is a dispatched op with a source line. `site`: a key that
        fixes the op, its input's and its outputs' dtypes and shapes and the chip (the backend's view plan
        key), so their texts are read and interned once per key. About half of a training step's records
        (the backward's included), so what `frame_id` and `module_sid` do is inlined, as in `op_deferred`."""
        if not self.window_open:
            return
        seq = self.seq = self.seq + 1
        self.ops += 1
        self.recorded_in_step = True
        described = self._view_sites.get(site) if site is not None else None
        if described is None:
            described = self._view_described(name, base, results, site)
        frame_id = self.last_frame_id = self._user_frame_id(False, 2, VIEW_OP)
        stacks = self.module_stacks
        stack = stacks.get(_thread_id()) if stacks else None
        self._append_op((seq, self.rank, described[0], described[1], described[2], described[3], _perf_ns() - self.t0, 0, frame_id,
                         stack[-1] if stack else None, self.step_index, None, None))

    def _view_described(self, name: str, base: Any, results: list[Any], site: Hashable | None) -> tuple[int, int, int, int]:
        """A view op's (name, inputs, outputs string ids, chip), kept by `site` when it has one."""
        writer = self.writer
        shape_text = self.device.shape_text
        outputs = ", ".join(shape_text(result) for result in results)
        described = (writer.intern(name), writer.intern(shape_text(base)), writer.intern(outputs), self.device.chip_of(base))
        if site is not None:
            self._view_sites[site] = described
        return described

    def compiled(self, plan: Any, kind: str, reason: str, diff: str | None, *, n_ops: int = 1, detail: dict | None = None, program_kind: str = "op") -> int | None:
        """A program was compiled: first compile, or a recompile with what changed."""
        self.compiles += 1
        self.live.compiled(plan.op_name, reason, diff)
        if not self.enabled:
            return None
        writer = self.writer
        program_id = self._define_program(plan, program_kind, n_ops)  # defined even outside the window: later flushes run it
        if kind == "op":
            plan.trace_ids[self.token] = (writer.intern(plan.inputs_text), writer.intern(plan.outputs_text), program_id, writer.intern(plan.op_name))
        if not self.window_open:
            return program_id
        self.recorded_in_step = True
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
        if not self.window_open:
            return
        self.recorded_in_step |= step == self.step_index
        writer = self.writer
        writer.append("compiles", (writer.next_id("compiles"), self.rank, program_id, "dynamo_frame", writer.intern(name), writer.intern(signature), -1,
                                   start_ns, dur_ns, self._intern_frame(file, line, function), step, reason, writer.intern(diff) if diff else None, json.dumps(detail)))

    def graph_lowered(self, name: str, signature: str, chip: int, start_ns: int, dur_ns: int, detail: dict) -> None:
        """AOTAutograd handed the backend a graph (`compiles.kind = 'aot'`): forward, backward or
        inference, with its op count; the time is the backend's lowering of it."""
        if not self.window_open:
            return
        self.recorded_in_step = True
        writer = self.writer
        writer.append("compiles", (writer.next_id("compiles"), self.rank, None, "aot", writer.intern(name), writer.intern(signature), chip,
                                   start_ns - self.t0, dur_ns, self.frame_id(by_call=True), self.step_index, "first", None, json.dumps(detail)))

    def graph_break(self, reason: str, file: str | None, line: int | None, function: str | None) -> None:
        """A torch.compile graph break, at the user's line that caused it."""
        if not self.window_open:
            return
        self.recorded_in_step = True
        writer = self.writer
        frame = self._intern_frame(file, line or 0, function or "") if file else None
        writer.append("graph_breaks", (self.rank, writer.intern(reason), frame, self.now(), self.step_index))

    def recompile_limit_hit(self, text: str) -> None:
        """Dynamo stopped compiling a function at its recompile limit (`text`: its warning): an annotation with
        source `recompile_limit`, at the user's line that called the function."""
        if not self.window_open:
            return
        self.recorded_in_step = True
        self.writer.append("annotations", (self.rank, self.writer.intern(text), "recompile_limit", self.now(), 0, self.frame_id(),
                                           self.step_index))

    def bucket_hit(self, graph: str, buckets: str, start_ns: int, dur_ns: int) -> None:
        """A compiled graph ran padded to a shape bucket (an annotation with source 'bucket')."""
        if not self.window_open:
            return
        self.writer.append("annotations", (self.rank, self.writer.intern(f"bucket {buckets} ({graph})"), "bucket", start_ns - self.t0, dur_ns, self.frame_id(), self.step_index))

    def fusion(self, program_id: int, fusion: Any) -> None:
        """One of XLA's fusions inside a compiled program."""
        writer = self.writer
        writer.append(
            "fusions",
            (self.rank, program_id, writer.intern(fusion.name), writer.intern(fusion.kind), writer.intern(",".join(fusion.hlo_ops)), writer.intern(",".join(fusion.aten_ops))),
        )

    def flushed(self, flush_id: int, program_id: int | None, trigger: str, n_ops: int, cache_hit: bool, chip: int, start_ns: int, dur_ns: int, input_bytes: int, output_bytes: int,
                replay: str | None = None, replay_break: str | None = None) -> None:
        """A DeferAndFuse flush: which ops ran as one program, why now, whether it was cached, and whether it replayed
        the previous occurrence's graph (`step_replay`: held, broke with `replay_break` saying why, or none to follow).
        Outside the window, one whose ops were dispatched while it was open (`n_ops`) is still written, with them."""
        if not self.window_open and n_ops == 0:
            return
        self._kept_flush = flush_id
        self.recorded_in_step = True
        self.writer.append(
            "flushes",
            (flush_id, self.rank, program_id, trigger, self.frame_id(), n_ops, int(cache_hit), chip, start_ns - self.t0, dur_ns, input_bytes, output_bytes, self.step_index,
             replay, None if replay_break is None else self.writer.intern(replay_break)),
        )

    def execution_started(self, program_id: int | None, chip: int, launch_ns: int, flush_id: int | None, results: Any,
                          done: Any = None) -> None:
        """A program was launched; `executions` records when its results are ready (when `done`, an output that only
        the recording holds, is ready, if the program has one)."""
        if not self.window_open and (flush_id is None or flush_id != self._kept_flush):
            return
        if self._executions is None:
            self._executions = ExecutionWatcher(self.writer, self.rank, self.t0)
        self._executions.launched(program_id, chip, launch_ns, flush_id, self.step_index, results, done)

    def synced(self, kind: str, chip: int, start_ns: int, dur_ns: int, pending_ops: int) -> None:
        self.live.synced()
        if not self.window_open:
            return
        self.recorded_in_step = True
        self.writer.append("syncs", (self.rank, kind, self.frame_id(), chip, start_ns - self.t0, dur_ns, pending_ops, self.step_index,
                                     self.library_frame_id()))
        performance_warnings.synced(kind, self.step_index)

    def transferred(self, direction: str, nbytes: int, src_chip: int, dst_chip: int, start_ns: int, dur_ns: int,
                    origin: tuple[str, int, str] | None = None) -> None:
        if not self.window_open:
            return
        self.recorded_in_step = True
        origin_frame_id = None if origin is None else self._location_frame_id(origin)
        self.writer.append("transfers", (self.rank, direction, nbytes, src_chip, dst_chip, start_ns - self.t0, dur_ns, self.frame_id(),
                                         self.step_index, origin_frame_id))
        performance_warnings.transferred(direction, nbytes, self.step_index)

    def fell_back(self, op: str, inputs: str, chip: int, start_ns: int, dur_ns: int) -> None:
        if not self.window_open:
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
        waited_after_ns: int | None = None,
        read_early_frame_id: int | None = None,
    ) -> None:
        """A collective finished (called from any thread). `start_ns` is a perf_counter time: when this
        rank's data entered the transport; `frame_id`, `step` and `cause_id` are those of the issuing call;
        `waited_after_ns`: how long after `start_ns` the user's code first waited on it (None: never);
        `read_early_frame_id`: the user's line that first read a tensor it writes before that wait."""
        if not self.window_open:
            return
        self.recorded_in_step |= step == self.step_index
        writer = self.writer
        writer.append(
            "collectives",
            (self.rank, kind, nbytes, dtype, writer.intern(group), writer.intern(ranks), frame_id, start_ns - self.t0, dur_ns, wait_ns, algorithm,
             bus_bandwidth, step, cause_id, waited_after_ns, read_early_frame_id),
        )

    def commit_soon(self) -> None:
        """Have the writer commit what is queued now, from its own thread (before a wait a peer's failure could end)."""
        if self.writer is not None:
            self.writer.commit_soon()

    def _maybe_sample_memory(self, force: bool = False) -> None:
        now = _perf_ns()
        if not force and now - self._last_memory_sample < _MEMORY_SAMPLE_INTERVAL_NS:
            return
        self._last_memory_sample = now
        for chip, live_bytes, peak_bytes in self.device.memory_in_use():
            self.writer.append("memory", (self.rank, chip, now - self.t0, live_bytes, peak_bytes))

    def buffer_rows(self) -> Callable[[tuple[Any, ...]], None]:
        """The `buffers` table's appender (the buffer tracker writes a row per buffer freed: one per strict op)."""
        return self.writer.appender("buffers")

    # ----------------------------------------------------------------- steps and annotations
    def step_boundary(self, source: str) -> None:
        """End the current step (`source`: what marked its end) and begin the next."""
        performance_warnings.raise_pending()
        end = self.now()
        if self.enabled and self.window.step_kept:
            self.writer.append("steps", (self.rank, self.step_index, self.step_start, end, source))
            self._maybe_sample_memory(force=True)
        self.live.step_ended(end - self.step_start)
        self.step_index += 1
        self.step_start = end
        self.step_opened_by = source
        self.ops_at_step_start = self.ops
        self.recorded_in_step = False
        self._step_ends.append(end)
        self._window_moved(self.window.step_began(self.step_index, end))

    def window_from_code(self, start: bool) -> None:
        """`tputrace.start()` (`start`) or `tputrace.stop()`: a `--from-code` window opens or closes (any other
        window ignores it); ops dispatched before a stop are written when they run."""
        self._window_moved(self.window.started_from_code() if start else self.window.stopped_from_code(self.now(), self.recorded_in_step))

    def _window_moved(self, open_now: bool) -> None:
        """Record now or not; a window that closes writes the steps it kept so far to `meta`."""
        was_open, self.window_open = self.window_open, self.enabled and open_now
        if was_open and not self.window_open:
            self._maybe_sample_memory(force=True)
            self.writer.set_meta(RECORDING_WINDOW_META_KEY, self.window.meta_json())

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
        if not self.window_open:
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
        if self.window.finished(self.step_index, self.recorded_in_step):
            self.writer.set_meta(RECORDING_WINDOW_META_KEY, self.window.meta_json())
        if self.window_open:
            self._maybe_sample_memory(force=True)
        self.writer.update_run(end_ns=end, exit_status=exit_status, error=error, **run_fields)
        self.writer.close()
