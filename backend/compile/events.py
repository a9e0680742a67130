"""Dynamo's compile events as trace records: frame compiles, graph breaks and recompiles.

What torch 2.13 offers without parsing log output:
- `torch._dynamo.callback_handler` calls back at the start and end of every frame compile, with the
  compile id (`"3/1"`: frame 3, its second compile, i.e. a recompile).
- `torch._dynamo.utils.get_compilation_metrics()` holds one `CompilationMetrics` per frame compile:
  the frame's code name, file and first line, the op count, the compile times and, for a
  recompile, the guard failure that caused it (`tensor 'x' size mismatch at index 0. expected 3,
  actual 5`). Dynamo appends it after the end callback, so a frame compile is written when its
  metrics appear: at the next compile's start or the next run of a compiled graph.
- `torch._dynamo.utils.graph_break_reasons` collects a `GraphCompileReason` per graph break, with
  the reason and the user's stack (its last frame is the line that broke the graph).

The backend adds what only it knows: the graphs a frame produced, and the time AOTAutograd and XLA
took, so that a frame compile's time splits into Dynamo / AOT / XLA.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tputrace.backend.core import routing
from tputrace.recording.interface import Recording

_perf_ns = time.perf_counter_ns


@dataclass
class FrameCompile:
    """What is known about one Dynamo frame compile before its metrics appear."""

    compile_id: str
    wall_start_ns: int
    step: int
    call_site: str | None
    call_frame_id: int | None = None  # the line that called the compiled function
    location: tuple[str, str, int] | None = None  # (qualified name, file, first line) of the user code
    inputs: str = ""
    graph_ids: list[int] = field(default_factory=list)
    program_ids: list[int] = field(default_factory=list)
    backend_ns: int = 0
    xla_ns: int = 0
    graph_breaks: int = 0
    break_calls: list[dict[str, Any]] = field(default_factory=list)  # where the user's code reached each break from
    mode: str | None = None
    ours: bool = False


class DynamoEvents:
    """Collects Dynamo's compile events and writes them to the active recording."""

    def __init__(self) -> None:
        self.pending: dict[str, FrameCompile] = {}
        self.lock = threading.RLock()
        self._break_index = 0
        self._installed = False

    def install(self) -> None:
        """Register the compile callbacks with Dynamo, for good: `torch._dynamo.reset()` clears every
        registered callback, and ours are registered again right after (a script that resets Dynamo
        still has its later compiles recorded)."""
        if self._installed:
            return
        import torch._dynamo

        handler = torch._dynamo.callback_handler
        clear = handler.clear

        def clear_then_register() -> None:
            clear()
            self._register(handler)

        handler.clear = clear_then_register
        self._register(handler)
        logging.getLogger("torch._dynamo.convert_frame").addHandler(_RecompileLimitLog(self.recorder))
        self._installed = True

    def _register(self, handler: Any) -> None:
        handler.register_start_callback(self._compile_started)
        handler.register_end_callback(self._compile_ended)

    @staticmethod
    def recorder() -> Recording | None:
        """The active recorder when it writes a trace, else None."""
        return routing.active().recorder

    # ----------------------------------------------------------------- Dynamo callbacks
    def _compile_started(self, args: Any) -> None:
        from torch._dynamo.callback import CallbackTrigger

        if args.callback_trigger != CallbackTrigger.DYNAMO:
            return
        recorder = self.recorder()
        if recorder is None:
            return
        self.drain()
        call_frame_id = recorder.frame_id()
        call_site = recorder.frame_text(call_frame_id)
        with self.lock:
            self.pending[args.compile_id] = FrameCompile(args.compile_id, time.time_ns(), recorder.step_index, call_site, call_frame_id)

    def _compile_ended(self, args: Any) -> None:
        from torch._dynamo.callback import CallbackTrigger

        if args.callback_trigger != CallbackTrigger.DYNAMO:
            return
        recorder = self.recorder()
        if recorder is None:
            return
        self._record_graph_breaks(recorder, args.compile_id)

    # ----------------------------------------------------------------- from the backend
    def graph_captured(self, compile_id: str | None, graph_id: int, location: tuple[str, str, int] | None, inputs: str, mode: str) -> None:
        frame = self.pending.get(compile_id) if compile_id else None
        if frame is not None:
            frame.graph_ids.append(graph_id)
            frame.location = frame.location or location
            frame.inputs = frame.inputs or inputs
            frame.mode = mode
            frame.ours = True

    def backend_finished(self, compile_id: str | None, backend_ns: int) -> None:
        frame = self.pending.get(compile_id) if compile_id else None
        if frame is not None:
            frame.backend_ns += backend_ns

    def xla_compiled(self, info: Any, compile_ns: int, program_id: int | None = None) -> None:
        frame = self.pending.get(info.compile_id) if info.compile_id else None
        if frame is not None:
            frame.xla_ns += compile_ns
            if program_id is not None:
                frame.program_ids.append(program_id)

    # ----------------------------------------------------------------- writing
    def drain(self) -> None:
        """Write every pending frame compile whose metrics Dynamo has recorded."""
        if not self.pending:
            return
        recorder = self.recorder()
        import torch._dynamo.utils

        with self.lock:
            if recorder is None:
                self.pending.clear()
                return
            for metrics in torch._dynamo.utils.get_compilation_metrics():
                frame = self.pending.get(metrics.compile_id)
                if frame is None or metrics.is_forward is False or metrics.is_runtime:
                    continue
                if metrics.start_time_us is not None and metrics.start_time_us * 1000 < max(frame.wall_start_ns - 1_000_000_000, recorder.start_unix_ns):
                    continue  # an earlier compile with the same id (before torch._dynamo.reset() or this recording)
                del self.pending[metrics.compile_id]
                if not frame.location and _is_tputrace_code(metrics.co_filename):
                    continue  # Dynamo looked at a tputrace callback run from C++ (e.g. the device guard)
                self._write_frame(recorder, frame, metrics)

    def _write_frame(self, recorder: Recording, frame: FrameCompile, metrics: Any) -> None:
        total_ns = int((metrics.dynamo_cumulative_compile_time_us or metrics.duration_us or 0) * 1000)
        backend_ns = min(frame.backend_ns, total_ns) if total_ns else frame.backend_ns
        xla_ns = min(frame.xla_ns, backend_ns)
        failed_entry, guard_failure = _split_reason(metrics.recompile_reason)
        first = metrics.compile_id is None or metrics.compile_id.endswith("/0")
        detail: dict[str, Any] = {
            "dynamo_ns": max(total_ns - backend_ns, 0),
            "aot_ns": backend_ns - xla_ns,
            "xla_ns": xla_ns,
            "compile_id": metrics.compile_id,
            "graph_ids": frame.graph_ids,
            "n_ops": metrics.graph_op_count or 0,
            "graph_breaks": frame.graph_breaks,
            "backend": "tpu" if frame.ours else "other",
        }
        if frame.break_calls:
            detail["break_calls"] = frame.break_calls
        if frame.call_site:
            detail["call_site"] = frame.call_site
        if frame.call_frame_id is not None:
            detail["call_frame_id"] = frame.call_frame_id
        if frame.mode:
            detail["mode"] = frame.mode
        if failed_entry:
            detail["failed_cache_entry"] = failed_entry
        if metrics.fail_type:
            detail["failed"] = f"{metrics.fail_type}: {(metrics.fail_reason or '').splitlines()[0] if metrics.fail_reason else ''}"
            detail["failure"] = _failure(metrics, frame.call_frame_id)
        if frame.location is not None:
            name, file, line = frame.location
            function = name.rpartition(".")[2]
        else:
            name = metrics.co_name or "<frame>"
            file, line, function = metrics.co_filename or "<unknown>", metrics.co_firstlineno or 0, name
        if metrics.co_name and metrics.co_name != function:
            detail["dynamo_frame"] = metrics.co_name
        wall_start = metrics.start_time_us * 1000 if metrics.start_time_us else frame.wall_start_ns
        recorder.dynamo_frame_compiled(
            name=name,
            signature=frame.inputs,
            file=file,
            line=line,
            function=function,
            start_ns=wall_start - recorder.start_unix_ns,
            dur_ns=total_ns,
            step=frame.step,
            reason="first" if first else "guard_failure",
            diff=None if first else (guard_failure or "unknown guard failure"),
            detail=detail,
            program_id=frame.program_ids[0] if frame.program_ids else None,
        )

    def _record_graph_breaks(self, recorder: Recording, compile_id: str) -> None:
        import torch._dynamo.utils

        reasons = torch._dynamo.utils.graph_break_reasons
        with self.lock:
            if len(reasons) < self._break_index:
                self._break_index = 0  # torch._dynamo.reset() cleared the list
            new = reasons[self._break_index :]
            self._break_index = len(reasons)
            frame = self.pending.get(compile_id)
            seen: set[tuple[str, str, int]] = set()
            for reason in new:
                user_frame = reason.user_stack[-1] if reason.user_stack else None
                text = concise_reason(reason.reason)
                key = (text, user_frame.filename if user_frame else "", user_frame.lineno if user_frame else 0)
                if key in seen:
                    continue
                seen.add(key)
                if frame is not None:
                    frame.graph_breaks += 1
                    call = calling_frame(reason.user_stack or [])
                    if call is not None and user_frame is not None:
                        frame.break_calls.append({"at": [user_frame.filename, user_frame.lineno or 0], "called_at": call})
                if user_frame is None:
                    recorder.graph_break(text, None, None, None)
                else:
                    recorder.graph_break(text, user_frame.filename, user_frame.lineno or 0, user_frame.name)


_FAILURE_TEXT_CHARS = 4000


def calling_frame(stack: Any) -> list[Any] | None:
    """[file, line, function] of the user's line that reached a graph break in another file (a helper module's, a
    library's): the innermost frame of Dynamo's user stack outside the break's file, libraries and tputrace; None
    where the break is in that code itself or the stack has no such frame."""
    from tputrace import sourceloc

    if len(stack) < 2:
        return None
    roots = sourceloc.library_roots()
    break_file = stack[-1].filename
    for frame in reversed(stack[:-1]):
        if frame.filename != break_file and not frame.filename.startswith("<") and sourceloc.is_user_file(frame.filename, roots):
            return [frame.filename, frame.lineno or 0, frame.name]
    return None


def _failure(metrics: Any, call_frame_id: int | None) -> dict[str, Any]:
    """What a frame compile that raised says of its error, for a script that catches it (an uncaught one is also the
    run's error): the exception's class, its message (reason, explanation, hints), the user line Dynamo could not
    trace and the line that called the compiled function."""
    return {
        "kind": metrics.fail_type,
        "text": (metrics.fail_reason or "")[:_FAILURE_TEXT_CHARS],
        "file": metrics.fail_user_frame_filename,
        "line": metrics.fail_user_frame_lineno,
        "call_frame_id": call_frame_id,
    }


def _is_tputrace_code(filename: str | None) -> bool:
    from tputrace import sourceloc

    if not filename:
        return False
    roots = [root for root in (sourceloc.TPUTRACE_DIR, sourceloc.backend_dir()) if root is not None]
    path = os.path.abspath(filename)
    return any(path.startswith(root + os.sep) for root in roots)


def concise_reason(reason: str) -> str:
    """Dynamo's graph-break text without its hint links and debug context: the kind, the
    explanation and the first hint."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    if not lines:
        return "graph break"
    parts = [lines[0]]
    hint_taken = False
    for line in lines[1:]:
        if line.startswith("Explanation:"):
            parts.append(line.removeprefix("Explanation:").strip())
        elif line.startswith("Hint:") and not hint_taken:
            parts.append("hint: " + line.removeprefix("Hint:").strip())
            hint_taken = True
    return " - ".join(parts)


# The frame of the wrapper that remembers where a host tensor was made (backend/core/host_origins.py), which Dynamo
# traces through and names in a guard's stack (`# x = f(y)  # train.py:9 in forward (<tputrace host origins>:3 in make)`).
_WRAPPER_FRAME = re.compile(r" \(<tputrace host origins>:\d+ in \w+\)|\n *File \"<tputrace host origins>\", line \d+, in \w+\n[^\n]*")


# Dynamo writes a device index in its guard text as a raw byte ("Expected device index to be \x00, actual \x01").
_RAW_BYTE = re.compile(r"[\x00-\x08\x0b-\x1f]")


def _split_reason(reason: str | None) -> tuple[str | None, str | None]:
    """'0/0: tensor 'x' size mismatch ...' -> ('0/0', "tensor 'x' size mismatch ..."), without the frames of
    tputrace's own wrappers."""
    if not reason:
        return None, None
    reason = _RAW_BYTE.sub(lambda byte: str(ord(byte.group())), _WRAPPER_FRAME.sub("", reason))
    head, separator, rest = reason.partition(": ")
    if separator and "/" in head and head.replace("/", "").isdigit():
        return head, rest
    return None, reason


events = DynamoEvents()


_LIMIT_HIT = "torch._dynamo hit config."


class _RecompileLimitLog(logging.Handler):
    """Dynamo's warning that a function hit its recompile limit (`torch._dynamo hit config.recompile_limit (8)`,
    the function, the last guard failure): no callback reports it, and the function runs uncompiled from then on."""

    def __init__(self, recorder: Any) -> None:
        super().__init__(logging.WARNING)
        self._recorder = recorder

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record whose arguments do not format: not Dynamo's warning
            return
        if not text.startswith(_LIMIT_HIT):
            return
        recorder = self._recorder()
        if recorder is not None:
            recorder.recompile_limit_hit("\n".join(text.splitlines()[:3]))
