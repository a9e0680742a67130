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
from threading import get_ident as _thread_id
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
# Types of optimizer state values seen to hold no chip buffer (no `_buf`, no `_local_tensor`): host tensors, numbers.
_BUFFERLESS_TYPES: set[type] = set()


class BufferTracker:
    """Open lifetimes by buffer id; completed ones go to the recording as `buffers` rows."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        # id(buffer) -> [row id, chip, bytes, shape, dtype, frame, module, alloc, step, in forward, label]
        self.open: dict[int, list[Any]] = {}
        self.next_id = 1
        self.last_ns = 0
        self.backward_started_ns = -1
        self.start_perf_ns = _perf_ns() - recording.now()  # `recording.now()` is perf_counter_ns less this
        self.main_thread = threading.get_ident()
        self.pid = os.getpid()
        self.rank = recording.rank
        self._append_row = recording.buffer_rows()
        self._module_stacks = recording.module_stacks
        self._spec_texts: dict[tuple[Any, Any], tuple[str | None, int | None]] = {}  # (shape, dtype) -> dtype text, shape sid
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
        """`origin` for an op's output, made right after the op was recorded: the op's line, with no stack walk.
        Every pending output of a DEFER_AND_FUSE op asks, so the module stack is read here, not through a call."""
        thread = _thread_id()
        stack = self._module_stacks.get(thread)
        if stack:
            return self.recording.last_frame_id, stack[-1], thread == self.main_thread
        return self.recording.last_frame_id, None, False

    def allocated(self, buffer: Any, nbytes: int, origin: tuple[int | None, int | None, bool] | None = None) -> None:
        frame_id, module_sid, in_forward = origin if origin is not None else self.origin()
        self._open(buffer, nbytes, frame_id, module_sid, in_forward)

    def op_output_allocated(self, buffer: Any, nbytes: int) -> None:
        """`allocated` for an op's output, made right after the op was recorded: the op's line (no stack walk)."""
        thread = _thread_id()
        stack = self._module_stacks.get(thread)
        if stack:
            self._open(buffer, nbytes, self.recording.last_frame_id, stack[-1], thread == self.main_thread)
        else:
            self._open(buffer, nbytes, self.recording.last_frame_id, None, False)

    def _open(self, buffer: Any, nbytes: int, frame_id: int | None, module_sid: int | None, in_forward: bool) -> None:
        row_id = self.next_id
        self.next_id = row_id + 1
        # Its shape and dtype only: holding the array would keep its memory alive. A JAX array's are read from
        # its `aval`, which its `shape` and `dtype` properties return them from (two Python calls saved).
        array = buffer.array
        described = getattr(array, "aval", array)
        now = _perf_ns() - self.start_perf_ns
        if now <= self.last_ns:
            now = self.last_ns + 1
        self.last_ns = now
        self.open[id(buffer)] = [row_id, buffer.chip, nbytes, getattr(described, "shape", None), getattr(described, "dtype", None), frame_id,
                                 module_sid, now, self.recording.step_index, in_forward, None]

    def freed(self, buffer: Any) -> None:
        """A buffer was freed: its row, when it lived while the recording window was open (the hot path of
        every recorded op's temporary output, so `_write` and `_now` are inlined)."""
        entry = self.open.pop(id(buffer), None)
        if entry is None:
            return
        recording = self.recording
        row_id, chip, nbytes, shape, dtype, frame_id, module_sid, alloc_ns, step, in_forward, label = entry
        if not (recording.window_open or recording.keeps_lifetime(alloc_ns)):
            return
        free_ns = _perf_ns() - self.start_perf_ns
        if free_ns <= self.last_ns:
            free_ns = self.last_ns + 1
        self.last_ns = free_ns
        texts = self._spec_texts.get((shape, dtype))
        if texts is None:
            texts = self._spec(shape, dtype)
        if label is None:
            label = ACTIVATION if in_forward and self.backward_started_ns > alloc_ns else TEMPORARY
        self._append_row((row_id, self.rank, chip, nbytes, texts[0], texts[1], label, frame_id, module_sid, alloc_ns, free_ns, step))

    def program_ran(self, chip: int, working_bytes: int) -> None:
        """A program holds `working_bytes` while it runs: one zero-length row at its launch."""
        if working_bytes <= 0 or not self.recording.window_open:
            return
        frame_id, module_sid, _ = self.origin()
        now = self._now()
        row_id = self.next_id
        self.next_id = row_id + 1
        self._append_row((row_id, self.rank, chip, working_bytes, None, None, PROGRAM_TEMPORARY, frame_id, module_sid, now, now,
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
        keeps_lifetime = self.recording.keeps_lifetime
        for entry in entries:
            row_id, chip, nbytes, shape, dtype, frame_id, module_sid, alloc_ns, step, in_forward, label = entry
            if keeps_lifetime(alloc_ns):
                texts = self._spec(shape, dtype)
                kind = label or (ACTIVATION if in_forward and self.backward_started_ns > alloc_ns else OTHER)
                self._append_row((row_id, self.rank, chip, nbytes, texts[0], texts[1], kind, frame_id, module_sid, alloc_ns, None, step))

    def _spec(self, shape: Any, dtype: Any) -> tuple[str | None, int | None]:
        """The `dtype` text and `shape_sid` of a (shape, dtype), made once per pair."""
        texts = self._spec_texts.get((shape, dtype))
        if texts is None:
            texts = self._spec_texts[(shape, dtype)] = (None if dtype is None else str(dtype),
                                                        None if shape is None else self.recording.intern(",".join(str(size) for size in shape)))
        return texts


def label_optimizer(tracker: BufferTracker, optimizer: Any) -> None:
    """Label the parameters, gradients and optimizer state an optimizer steps (DTensors by their local shard). Each
    optimizer step's hot path: the lookups of `label` are inlined, and a tensor type that holds no buffer (the host
    tensor of Adam's `step`) is skipped by type, not by failing two attribute lookups per tensor."""
    state = optimizer.state
    owners = tracker.parameter_modules
    for group in optimizer.param_groups:
        for param in group["params"]:
            owner = owners.get(id(param))
            _label_tensor(tracker, param, PARAMETER, owner)
            grad = param.grad
            if grad is not None:
                _label_tensor(tracker, grad, GRADIENT, owner)
            param_state = state.get(param)
            if param_state:
                for value in param_state.values():
                    if type(value) not in _BUFFERLESS_TYPES:
                        _label_tensor(tracker, value, OPTIMIZER_STATE, owner)



def _label_tensor(tracker: BufferTracker, tensor: Any, kind: str, owner: str | None) -> None:
    if tensor is None:
        return
    buffer = getattr(tensor, "_buf", None)
    if buffer is None:  # a DTensor: its local shard's buffer
        local = getattr(tensor, "_local_tensor", None)
        if local is None:
            _BUFFERLESS_TYPES.add(type(tensor))
            return
        buffer = getattr(local, "_buf", None)
    if buffer is not None:
        entry = tracker.open.get(id(buffer))
        if entry is not None:
            entry[10] = kind
            if entry[6] is None and owner is not None:
                entry[6] = tracker.recording.intern(owner)
