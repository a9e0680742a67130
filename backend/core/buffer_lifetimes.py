"""Buffer lifetimes for the trace's `buffers` table: each chip buffer's allocation and free, its size, the
line and module that made it, and what it is (parameter, gradient, optimizer state, activation, temporary).

`memory.tracker` holds the active `BufferTracker` while a recording runs (None otherwise, so an unrecorded
run pays one global read per allocation). A row is written when its buffer is freed; buffers still live
when the recording stops are written then, with no free time. What a buffer is comes from two cheap
sources: the optimizer's parameters, gradients and state, labelled at each optimizer step, and the
buffer's lifetime (made inside a module's forward and alive when a backward pass began: an activation
saved for backward). A program's working memory (XLA's temporaries, outputs not yet counted) is one
zero-length `program_temporary` row at a launch that reaches the chip's peak so far.
"""

from __future__ import annotations

import os
import threading
from time import perf_counter_ns as _perf_ns
from typing import Any

from tputrace.recording.interface import Recording

PARAMETER = "parameter"
GRADIENT = "gradient"
OPTIMIZER_STATE = "optimizer_state"
ACTIVATION = "activation"
TEMPORARY = "temporary"
PROGRAM_TEMPORARY = "program_temporary"
OTHER = "other"


class BufferTracker:
    """Open lifetimes by buffer id; completed ones go to the recording as `buffers` rows."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.open: dict[int, list[Any]] = {}  # id(buffer) -> [row id, chip, bytes, shape, dtype, frame, module, alloc, step, in forward, label]
        self.next_id = 1
        self.last_ns = 0
        self.backward_started_ns = -1
        self.start_perf_ns = _perf_ns() - recording.now()  # `recording.now()` is perf_counter_ns less this
        self.main_thread = threading.get_ident()
        self.pid = os.getpid()
        self._spec_texts: dict[tuple[Any, Any], tuple[str | None, str | None]] = {}  # (shape, dtype) -> their texts
        self.parameter_modules: dict[int, str] = {}  # id(parameter) -> the path of the module that owns it

    def _now(self) -> int:
        """ns since the recording's start, strictly increasing, so allocations and frees keep their order."""
        now = _perf_ns() - self.start_perf_ns
        if now <= self.last_ns:
            now = self.last_ns + 1
        self.last_ns = now
        return now

    def origin(self) -> tuple[int | None, int | None, bool]:
        """The user line and module making a buffer now, and whether a module's forward is running on the
        main thread (what an activation is made in)."""
        recording = self.recording
        module_sid = recording.module_sid()
        return recording.frame_id(), module_sid, module_sid is not None and threading.get_ident() == self.main_thread

    def op_origin(self) -> tuple[int | None, int | None, bool]:
        """`origin` for an op's output, made right after the op was recorded: the op's line, with no stack walk."""
        recording = self.recording
        module_sid = recording.module_sid()
        return recording.last_frame_id, module_sid, module_sid is not None and threading.get_ident() == self.main_thread

    def allocated(self, buffer: Any, nbytes: int, origin: tuple[int | None, int | None, bool] | None = None) -> None:
        frame_id, module_sid, in_forward = origin if origin is not None else self.origin()
        row_id = self.next_id
        self.next_id = row_id + 1
        # Its shape and dtype only: holding the array would keep its memory alive. A JAX array's are read from
        # its `aval`, which its `shape` and `dtype` properties return them from (two Python calls saved).
        array = buffer.array
        described = getattr(array, "aval", array)
        self.open[id(buffer)] = [row_id, buffer.chip, nbytes, getattr(described, "shape", None), getattr(described, "dtype", None), frame_id,
                                 module_sid, self._now(), self.recording.step_index, in_forward, None]

    def freed(self, buffer: Any) -> None:
        entry = self.open.pop(id(buffer), None)
        if entry is not None and (self.recording.window_open or self.recording.keeps_lifetime(entry[7])):
            self._write(entry, self._now())

    def program_ran(self, chip: int, working_bytes: int) -> None:
        """A program holds `working_bytes` while it runs: one zero-length row at its launch."""
        if working_bytes <= 0 or not self.recording.window_open:
            return
        frame_id, module_sid, _ = self.origin()
        now = self._now()
        row_id = self.next_id
        self.next_id = row_id + 1
        self.recording.buffer_lifetime((row_id, chip, working_bytes, None, None, PROGRAM_TEMPORARY, frame_id, module_sid, now, now,
                                        self.recording.step_index))

    def backward_started(self) -> None:
        self.backward_started_ns = self._now()

    def label(self, buffer: Any, kind: str, module_path: str | None = None) -> None:
        """Say what a live buffer is (from the optimizer's parameters, gradients and state) and, when it was
        made outside any module's forward, which module it belongs to (a parameter's owner)."""
        entry = self.open.get(id(buffer))
        if entry is not None:
            entry[10] = kind
            if entry[6] is None and module_path is not None:
                entry[6] = self.recording.intern(module_path)

    def modules_seen(self, root: Any, root_path: str) -> None:
        """Note the owner of each parameter of a module tree whose forward ran for the first time, and label the
        parameters' buffers (a run with no optimizer has them too)."""
        owners = self.parameter_modules
        for path, module in root.named_modules(prefix=root_path):
            for parameter in module.parameters(recurse=False):
                owners.setdefault(id(parameter), path)
                _label_tensor(self, parameter, PARAMETER, owners[id(parameter)])

    def stop(self) -> None:
        """Write the buffers still live, with no free time (not in a forked child: the parent's recording is its own)."""
        entries = list(self.open.values())
        self.open.clear()
        if os.getpid() != self.pid:
            return
        for entry in entries:
            self._write(entry, None)

    def _write(self, entry: list[Any], free_ns: int | None) -> None:
        row_id, chip, nbytes, shape, dtype, frame_id, module_sid, alloc_ns, step, in_forward, label = entry
        kind = label or self._kind(alloc_ns, free_ns, in_forward)
        texts = self._spec_texts.get((shape, dtype))
        if texts is None:
            texts = self._spec_texts[(shape, dtype)] = (None if dtype is None else str(dtype),
                                                        None if shape is None else ",".join(str(size) for size in shape))
        self.recording.buffer_lifetime((row_id, chip, nbytes, texts[0], texts[1], kind, frame_id, module_sid, alloc_ns, free_ns, step))

    def _kind(self, alloc_ns: int, free_ns: int | None, in_forward: bool) -> str:
        if not in_forward:
            return TEMPORARY if free_ns is not None else OTHER
        if self.backward_started_ns > alloc_ns:
            return ACTIVATION
        return TEMPORARY if free_ns is not None else OTHER


def label_optimizer(tracker: BufferTracker, optimizer: Any) -> None:
    """Label the parameters, gradients and optimizer state an optimizer steps (DTensors by their local shard)."""
    state = optimizer.state
    owners = tracker.parameter_modules
    for group in optimizer.param_groups:
        for param in group["params"]:
            owner = owners.get(id(param))
            _label_tensor(tracker, param, PARAMETER, owner)
            _label_tensor(tracker, param.grad, GRADIENT, owner)
            for value in state.get(param, {}).values():
                _label_tensor(tracker, value, OPTIMIZER_STATE, owner)


def _label_tensor(tracker: BufferTracker, tensor: Any, kind: str, owner: str | None) -> None:
    if tensor is None:
        return
    buffer = getattr(tensor, "_buf", None)
    if buffer is None:  # a DTensor: its local shard's buffer
        buffer = getattr(getattr(tensor, "_local_tensor", None), "_buf", None)
    if buffer is not None:
        tracker.label(buffer, kind, owner)
