"""Importing a `TORCH_TRACE` structured log (`dedicated_log_torch_trace_*.log`, the files tlparse reads).

Each record is a glog prefix and a JSON envelope on one line, its payload (when `has_payload`) on the
tab-indented lines after it. Read line by line: payloads are kept only for the records used.
- `compilation_metrics` -> a `compiles` row (kind `dynamo_frame`, the compiled code object's first line
  as its frame, `recompile_reason` as the diff) and a `programs` row (kind `compiled`, its graph's ops);
- `dynamo_graph_break_reason` artifacts -> `graph_breaks` rows at the user frame that broke the graph;
- TorchTPU's `torchtpu_eager_aten_graph` artifacts -> `compiles` rows of kind `fused` (one per eager
  flush batch: `cache_hit`, `compile_failed` and `reason` in its detail); cache hits are not compiles
  and are counted in `meta.imported` only.
Times come from `compilation_metrics.start_time`; a graph break takes the start of its compile.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tputrace.importers.sink import ImportSink, RankClock
from tputrace.importers.sources import TORCH_TRACE, CaptureError

_ENVELOPE = re.compile(r"^[VIWEF]\d{4} [\d:.]+ +\d+ [^\]]*\] (\{.*\})\s*$")
_USER_FRAME = re.compile(r'^\s*File "(.*)", line (\d+), in (.*)$')
_BREAK_AT = re.compile(r"Graph break in user code at (.*):(\d+)")
_REASON_LINE = "Graph Break Reason: "
# A preamble that says Dynamo gave up on the whole function (it runs eagerly, no graph), and what the reason says.
_SKIPPED = "Skipping the function and falling back to eager"
_SKIPPED_NOTE = "; the function runs eagerly"
# One failed guard of a `recompile_reason`: `0/1: <guard>  # <source line>  # <short path>:<line> in <fn>`.
_GUARD_COMMENT = re.compile(r"^(\d+/\d+: .*?)\s+#\s*(.*?)\s+#\s*\S+:\d+ in \S+\s*$")


@dataclass
class _Compile:
    compile_id: str
    name: str
    file: str | None
    line: int | None
    start_s: float
    dur_s: float
    graph_ops: int | None
    recompile_reason: str | None
    kind: str = "dynamo_frame"
    detail: dict[str, Any] = field(default_factory=dict)
    frame_function: str | None = None  # the frame's function where it is not the compiled code's own


@dataclass
class _GraphBreak:
    compile_id: str
    reason: str
    file: str | None
    line: int | None
    function: str


class TorchTraceImporter:
    """Imports one TORCH_TRACE log (one process) as one rank, or into the rank of a torch.profiler capture of the
    same process (`into`: its compiles then go on that rank's clock and steps)."""

    def __init__(self, sink: ImportSink, path: Path, *, into: RankClock | None = None) -> None:
        self.sink = sink
        self.path = path
        self.into = into
        self.rank = sink.new_rank(TORCH_TRACE, str(path)) if into is None else into.rank
        self.compiles: list[_Compile] = []
        self.breaks: list[_GraphBreak] = []
        self.eager_cache_hits = 0
        self.pid: int | None = None
        self.process_rank: int | None = None  # the process's rank in torch.distributed, where it had one
        self.paths: dict[int, str] = {}  # the log's interned file names (`{"str": [path, index]}`)
        self.frame_code: dict[str, tuple[str, str | None, int | None]] = {}  # frame id -> its code's name, file, line
        self.caller: dict[str, tuple[str, str, int]] = {}  # compile id -> the innermost user frame of its stack

    def run(self) -> None:
        records = 0
        with self.path.open("r", encoding="utf-8", errors="replace") as stream:
            envelope: dict[str, Any] | None = None
            payload: list[str] = []
            for number, text in enumerate(stream, 1):
                if text.startswith("\t"):
                    if envelope is not None and self._wants_payload(envelope):
                        payload.append(text[1:].rstrip("\n"))
                    continue
                if envelope is not None:
                    self._record(envelope, payload)
                envelope, payload = self._envelope(text, number), []
                records += 1
                if self.pid is None:
                    self.pid = _pid(text)
                if self.process_rank is None and isinstance(envelope.get("rank"), int):
                    self.process_rank = envelope["rank"]
            if envelope is not None:
                self._record(envelope, payload)
        if records == 0:
            raise CaptureError(f"{self.path} holds no TORCH_TRACE records")
        self._write()

    def _envelope(self, text: str, number: int) -> dict[str, Any]:
        match = _ENVELOPE.match(text)
        if match is None and not text.endswith("\n"):
            raise CaptureError(f"{self.path}:{number}: truncated (its last record is cut off)")
        if match is None:
            raise CaptureError(f"{self.path}:{number}: not a TORCH_TRACE record (a glog prefix and a JSON object)")
        try:
            value = json.loads(match.group(1))
        except json.JSONDecodeError as error:
            raise CaptureError(f"{self.path}:{number}: damaged TORCH_TRACE record ({error.msg})") from None
        if not isinstance(value, dict):
            raise CaptureError(f"{self.path}:{number}: damaged TORCH_TRACE record (not a JSON object)")
        return value

    @staticmethod
    def _wants_payload(envelope: dict[str, Any]) -> bool:
        artifact = envelope.get("artifact")
        return isinstance(artifact, dict) and artifact.get("name") == "dynamo_graph_break_reason"

    def _record(self, envelope: dict[str, Any], payload: list[str]) -> None:
        compile_id = f"{envelope.get('frame_id')}/{envelope.get('frame_compile_id')}"
        interned = envelope.get("str")
        if isinstance(interned, list) and len(interned) == 2 and isinstance(interned[1], int):
            self.paths[interned[1]] = str(interned[0])
            return
        start = envelope.get("dynamo_start")
        if isinstance(start, dict):
            self._dynamo_start(str(envelope.get("frame_id")), compile_id, start)
            return
        metrics = envelope.get("compilation_metrics")
        if isinstance(metrics, dict):
            detail = {key: metrics[key] for key in ("guard_count", "fail_type", "cache_size")
                      if metrics.get(key) is not None}
            if metrics.get("fail_reason"):
                # Its first line says what failed ("Dynamo recompile limit exceeded"); the rest is hints.
                detail["fail_reason"] = str(metrics["fail_reason"]).strip().splitlines()[0]
            reason = metrics.get("recompile_reason")
            self.compiles.append(_Compile(
                compile_id=str(metrics.get("compile_id") or compile_id),
                name=str(metrics.get("co_name") or "?"),
                file=metrics.get("co_filename"),
                line=metrics.get("co_firstlineno"),
                start_s=float(metrics.get("start_time") or 0.0),
                dur_s=float(metrics.get("entire_frame_compile_time_s") or 0.0),
                graph_ops=metrics.get("graph_op_count"),
                recompile_reason=_recompile_diff(reason) if isinstance(reason, str) and reason else None,
                detail=detail,
            ))
            if metrics.get("co_name"):
                self.frame_code[_frame_of(self.compiles[-1].compile_id)] = (
                    str(metrics["co_name"]), metrics.get("co_filename"), metrics.get("co_firstlineno"))
            return
        artifact = envelope.get("artifact")
        if not isinstance(artifact, dict):
            return
        name = artifact.get("name")
        if name == "dynamo_graph_break_reason":
            self.breaks.append(_graph_break(compile_id, payload))
        elif name == "torchtpu_eager_aten_graph":
            if artifact.get("cache_hit"):
                self.eager_cache_hits += 1
                return
            self.compiles.append(_Compile(
                compile_id=compile_id, name=str(artifact.get("op_name") or "eager batch"), file=None, line=None,
                start_s=0.0, dur_s=0.0, graph_ops=None, recompile_reason=artifact.get("reason") or None, kind="fused",
                detail={"compile_failed": bool(artifact.get("compile_failed")), "reason": artifact.get("reason")},
            ))

    def _dynamo_start(self, frame: str, compile_id: str, start: dict[str, Any]) -> None:
        """The code object a compile starts on (the last entry of `dynamo_start`'s stack), and the innermost frame
        of the user's code on that stack."""
        stack = start.get("stack")
        if not isinstance(stack, list) or not stack:
            return
        entries = []
        for entry in stack:
            if not isinstance(entry, dict):
                return
            filename = entry.get("filename")
            file = self.paths.get(filename) if isinstance(filename, int) else filename if isinstance(filename, str) \
                else None
            line = entry.get("line")
            entries.append((str(entry.get("name") or "?"), file, line if isinstance(line, int) else None))
        self.frame_code.setdefault(frame, entries[-1])
        user = [(name, file, line) for name, file, line in entries if file and line and not _is_library(file)]
        if user:
            self.caller[compile_id] = user[-1]

    def _write(self) -> None:
        writer = self.sink.writer
        for item in self.compiles:
            # A compile that failed before tracing (e.g. the recompile limit was hit) names no code object: it is
            # the one its frame's other compiles name.
            if item.name == "?" and _frame_of(item.compile_id) in self.frame_code:
                item.name, item.file, item.line = self.frame_code[_frame_of(item.compile_id)]
            # A compiled nn.Module's code object is torch's own wrapper: its place is the user's line that
            # called the module.
            caller = self.caller.get(item.compile_id)
            if item.file and _is_library(item.file) and caller:
                item.frame_function, item.file, item.line = caller
        starts = [item.start_s for item in self.compiles if item.start_s > 0]
        start_s = min(starts) if starts else 0.0
        end_s = max((item.start_s + item.dur_s for item in self.compiles if item.start_s > 0), default=start_s)
        if self.into is None:
            writer.set_run(rank=self.rank, world_size=1, script=str(self.path), argv=[], pid=self.pid,
                           platform="cpu", chips=0, start_unix_ns=int(start_s * 1e9), end_ns=int((end_s - start_s) * 1e9))
            self.sink.note(self.rank, device="host", pid=self.pid, eager_cache_hits=self.eager_cache_hits)
        else:
            start_s = self.into.start_unix_ns / 1e9
            self.sink.note(self.rank, torch_trace=str(self.path), eager_cache_hits=self.eager_cache_hits)
        steps = self.into.steps if self.into is not None else None
        if self.process_rank is not None:
            self.sink.note(self.rank, distributed_rank=self.process_rank)
        start_of: dict[str, int] = {}
        for item in self.compiles:
            start_ns = int((item.start_s - start_s) * 1e9) if item.start_s > 0 else 0
            start_of[item.compile_id] = start_ns
            frame_id = (writer.frame(item.file, int(item.line), item.frame_function or item.name)
                        if item.file and item.line else None)
            name_sid = writer.intern(item.name)
            program_id = writer.next_id("programs")
            self.sink.append("programs", (program_id, self.rank, "compiled", name_sid, name_sid, None, item.graph_ops,
                                          None, None, None))
            reason = "recompile" if item.recompile_reason else "first"
            diff_sid = writer.intern(item.recompile_reason) if item.recompile_reason else None
            detail = json.dumps({"compile_id": item.compile_id, **item.detail}, sort_keys=True)
            self.sink.append("compiles", (writer.next_id("compiles"), self.rank, program_id, item.kind, name_sid, None,
                                          -1, start_ns, int(item.dur_s * 1e9), frame_id,
                                          steps.step_at(start_ns) if steps else 0, reason, diff_sid, detail))
        for item in self.breaks:
            frame_id = writer.frame(item.file, item.line, item.function) if item.file and item.line else None
            t_ns = start_of.get(item.compile_id, 0)
            self.sink.append("graph_breaks", (self.rank, writer.intern(item.reason), frame_id, t_ns,
                                              steps.step_at(t_ns) if steps else 0))


def _graph_break(compile_id: str, payload: list[str]) -> _GraphBreak:
    """The reason and user frame of one `dynamo_graph_break_reason` payload: the innermost frame of the user's code
    in its traceback; where the break is in a library's code (torch's optimizer), the reason names that place."""
    reason = ""
    file: str | None = None
    line: int | None = None
    function = ""
    frames: list[tuple[str, int, str]] = []
    in_user_traceback = False
    for index, text in enumerate(payload):
        at = _BREAK_AT.search(text)
        if at and file is None:
            file, line = at.group(1), int(at.group(2))
        if text.startswith(_REASON_LINE) and not reason:
            reason = text[len(_REASON_LINE):].strip()
            if not reason or reason.endswith(":"):
                # A preamble ("Encountered graph break when attempting to trace CALL: ...:", "Failed to handle
                # graph break gracefully. Skipping the function ...:"): the reason proper is the next line.
                rest = [part.strip() for part in payload[index + 1:index + 4] if part.strip()]
                skipped = _SKIPPED in reason
                reason = rest[0] if rest else reason
                if skipped:
                    reason += _SKIPPED_NOTE
        if text.startswith("User code traceback:"):
            in_user_traceback = True
        elif in_user_traceback:
            frame = _USER_FRAME.match(text)
            if frame:
                frames.append((frame.group(1), int(frame.group(2)), frame.group(3)))
            elif not text.startswith(" "):
                in_user_traceback = False
    reason = reason or "graph break"
    if frames:
        file, line, function = frames[-1]
        users = [frame for frame in frames if not _is_library(frame[0])]
        if users and users[-1] != frames[-1]:
            reason += f" (in {Path(file).name}:{line}, {function})"
            file, line, function = users[-1]
    return _GraphBreak(compile_id, reason, file, line, function)


def _recompile_diff(reason: str) -> str:
    """A `recompile_reason` as one line per failed guard: the guard, then the source line and place it guards
    (from the guard's comment and the "User stack trace" after it, whose path is not shortened)."""
    guards: list[list[str]] = []
    lines = reason.splitlines()
    for index, text in enumerate(lines):
        match = _GUARD_COMMENT.match(text)
        if match:
            guards.append([match.group(1), match.group(2)])
        elif re.match(r"^\d+/\d+: ", text):
            guards.append([text.strip(), ""])
        elif guards and text.strip() == "User stack trace:":
            frames = [_USER_FRAME.match(line) for line in lines[index + 1:]]
            place = next((frame for frame in reversed(frames) if frame), None)
            if place and guards[-1][1]:
                guards[-1][1] += f" at {place.group(1)}:{place.group(2)} in {place.group(3)}"
    if not guards:
        return reason.strip()
    return "\n".join(f"{guard} ({source})" if source else guard for guard, source in guards)


def _is_library(file: str) -> bool:
    """Whether a file is an installed library's (torch's among them), not the user's code."""
    return any(part in file for part in ("site-packages", "dist-packages", "/lib/python")) or file.startswith("<")


def _frame_of(compile_id: str) -> str:
    """The frame of a compile id (`2/3` -> `2`, ignoring a restart's `_N` suffix)."""
    return compile_id.split("/", 1)[0].lstrip("[")


def log_pid(path: Path) -> int | None:
    """The process id in the glog prefix of a TORCH_TRACE log's first line."""
    with path.open("r", encoding="utf-8", errors="replace") as stream:
        return _pid(stream.readline())


def _pid(text: str) -> int | None:
    parts = text.split()
    return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
