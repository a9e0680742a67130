"""Importing a `TORCH_TRACE` structured log (`dedicated_log_torch_trace_*.log`, the files tlparse reads).

Each record is a glog prefix and a JSON envelope on one line, its payload (when `has_payload`) on the
tab-indented lines after it. Read line by line: payloads are kept only for the records used.
- `compilation_metrics` -> a `compiles` row (kind `dynamo_frame`, the compiled code object's first line
  as its frame, `recompile_reason` or the `recompile_reasons` artifact as the diff, the FX graph and
  AOTAutograd cache outcomes in its detail) and a `programs` row (kind `compiled`, its graph's ops);
- `dynamo_graph_break_reason` artifacts -> `graph_breaks` rows at the user frame that broke the graph (a log
  without them: a break at the line each resume function `torch_dynamo_resume_in_<fn>_at_<line>` names);
- TorchTPU's `torchtpu_eager_aten_graph` artifacts -> `compiles` rows of kind `fused` (one per eager
  flush batch: `cache_hit`, `compile_failed` and `reason` in its detail); cache hits are not compiles
  and are counted in `meta.imported` only.
A compile's time is its metrics' `start_time_us`/`duration_us` (`start_time`/`entire_frame_compile_time_s`),
else its `dynamo` chromium event's, else the glog times of its `dynamo_start` and metrics records. A graph
break takes the start of its compile. A line that is not a record is skipped, counted, and warned about once.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tputrace.importers.sink import ImportSink, RankClock
from tputrace.importers.sources import TORCH_TRACE, CaptureError
from tputrace.importers.torch_trace_text import (
    failure_place,
    ENVELOPE,
    GraphBreak,
    first_sentence,
    glog_seconds,
    graph_break,
    is_library,
    limit_hit,
    limit_warning,
    recompile_diff,
    resumed_break,
)

_CACHE_ARTIFACT = re.compile(r"^(fx_graph|aotautograd)_cache_(hit|miss|bypass)$")
# torch's wrapper around a compiled callable that Dynamo would skip (`torch.compile(nn.Sequential(...))`): the
# compile's code object is `inner` in `torch/_dynamo/external_utils.py`, not the user's.
_WRAPPER, _WRAPPER_FILE = "inner", "external_utils.py"
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
# Records whose payload is read: graph breaks, recompile reasons (a JSON list), chromium events (`dynamo` spans).
_PAYLOAD_ARTIFACTS = ("dynamo_graph_break_reason", "recompile_reasons")


@dataclass
class _Compile:
    compile_id: str
    name: str
    file: str | None
    line: int | None
    start_s: float | None  # Unix seconds, where the metrics say
    dur_s: float | None
    graph_ops: int | None
    recompile_reason: str | None
    kind: str = "dynamo_frame"
    detail: dict[str, Any] = field(default_factory=dict)
    frame_function: str | None = None  # the frame's function where it is not the compiled code's own
    span: list[float | None] = field(default_factory=lambda: [None, None])  # its `dynamo` chromium event (Unix s)
    clock: tuple[float | None, float | None] = (None, None)  # glog times of its dynamo_start and metrics records
    caller: tuple[str, str | None, int | None] | None = None  # the innermost user frame of its dynamo_start stack
    called: str | None = None  # what the caller's line calls (`net` in `out = net(x)`), where the stack gives its text
    restart_reasons: list[str] = field(default_factory=list)


class TorchTraceImporter:
    """Imports one TORCH_TRACE log (one process) as one rank, or into the rank of a torch.profiler capture of the
    same process (`into`: its compiles then go on that rank's clock and steps)."""

    def __init__(self, sink: ImportSink, path: Path, *, into: RankClock | None = None) -> None:
        self.sink = sink
        self.path = path
        self.into = into
        self.rank = sink.new_rank(TORCH_TRACE, str(path)) if into is None else into.rank
        self.compiles: list[_Compile] = []
        self.breaks: list[GraphBreak] = []
        self.eager_cache_hits = 0
        self.pid: int | None = None
        self.process_rank: int | None = None  # the process's rank in torch.distributed, where it had one
        self.paths: dict[int, str] = {}  # the log's interned file names (`{"str": [path, index]}`)
        self.frame_code: dict[str, tuple[str, str | None, int | None]] = {}  # frame id -> its code's name, file, line
        self.caller: dict[str, tuple[str, str | None, int | None]] = {}  # compile id -> the innermost user frame
        # of its dynamo_start stack, until its metrics
        self.called: dict[str, str] = {}  # compile id -> what that frame's line calls, until its metrics
        self.skipped_lines = 0
        self.first_skipped: int | None = None
        self.clock = 0.0  # the glog time of the record being read
        self.clock_offset: float | None = None  # Unix time less glog time, from the first record that has both
        self.started: dict[str, float] = {}  # compile id -> glog time of its latest dynamo_start
        self.begun: dict[str, float] = {}  # compile id -> Unix time its latest `dynamo` chromium span began
        self.caches: dict[str, dict[str, list[str]]] = {}  # compile id -> cache -> outcomes, until its metrics
        self.reasons: dict[str, str] = {}  # compile id -> its `recompile_reasons` artifact, until its metrics

    def run(self) -> None:
        records = 0
        with self.path.open("r", encoding="utf-8", errors="replace") as stream:
            envelope: dict[str, Any] | None = None
            clock = 0.0
            payload: list[str] = []
            for number, text in enumerate(stream, 1):
                if text.startswith("\t") or not text.strip():
                    if envelope is not None and self._wants_payload(envelope):
                        payload.append(text[1:].rstrip("\n") if text.startswith("\t") else "")
                    continue
                if envelope is not None:
                    self.clock = clock
                    self._record(envelope, payload)
                envelope, payload = None, []
                parsed = self._envelope(text, number)
                if parsed is None:
                    self.skipped_lines += 1
                    self.first_skipped = self.first_skipped or number
                    continue
                envelope, clock = parsed
                records += 1
                if self.pid is None:
                    self.pid = _pid(text)
                if self.process_rank is None and isinstance(envelope.get("rank"), int):
                    self.process_rank = envelope["rank"]
            if envelope is not None:
                self.clock = clock
                self._record(envelope, payload)
        if records == 0:
            raise CaptureError(f"{self.path}: not a TORCH_TRACE log (no line is a glog prefix and a JSON object)"
                               if self.skipped_lines else f"{self.path} holds no TORCH_TRACE records")
        if self.skipped_lines:
            self.sink.warn(f"{self.path}: skipped {self.skipped_lines} line(s) that are not TORCH_TRACE records "
                           f"(the first at line {self.first_skipped})")
        self._write()

    def _envelope(self, text: str, number: int) -> tuple[dict[str, Any], float] | None:
        """A record line's envelope and glog time; None for a line that is not a record (or a damaged one)."""
        match = ENVELOPE.match(text)
        if match is None and not text.endswith("\n"):
            raise CaptureError(f"{self.path}:{number}: truncated (its last record is cut off)")
        if match is None:
            return None
        try:
            value = json.loads(match.group(7))
        except json.JSONDecodeError:
            return None
        return (value, glog_seconds(match)) if isinstance(value, dict) else None

    @staticmethod
    def _wants_payload(envelope: dict[str, Any]) -> bool:
        if "chromium_event" in envelope:
            return True
        artifact = envelope.get("artifact")
        return isinstance(artifact, dict) and artifact.get("name") in _PAYLOAD_ARTIFACTS

    def _record(self, envelope: dict[str, Any], payload: list[str]) -> None:
        compile_id = _compile_id(envelope)
        interned = envelope.get("str")
        if isinstance(interned, list) and len(interned) == 2 and isinstance(interned[1], int):
            self.paths[interned[1]] = str(interned[0])
            return
        if "chromium_event" in envelope:
            self._chromium_event(payload)
            return
        start = envelope.get("dynamo_start")
        if isinstance(start, dict):
            self.started[compile_id] = self.clock
            self._dynamo_start(_frame_of(compile_id), compile_id, start)
            return
        if compile_id in self.started and compile_id not in self.caller:
            self._record_stack(compile_id, envelope)
        metrics = envelope.get("compilation_metrics")
        if isinstance(metrics, dict):
            self._metrics(envelope, compile_id, metrics)
            return
        artifact = envelope.get("artifact")
        if not isinstance(artifact, dict):
            return
        name = str(artifact.get("name"))
        cache = _CACHE_ARTIFACT.match(name)
        if cache:
            self.caches.setdefault(compile_id, {}).setdefault(cache.group(1), []).append(cache.group(2))
        elif name == "recompile_reasons":
            self.reasons[compile_id] = _reason_list(payload)
        elif name == "dynamo_graph_break_reason":
            self.breaks.append(graph_break(compile_id, payload))
        elif name == "torchtpu_eager_aten_graph":
            if artifact.get("cache_hit"):
                self.eager_cache_hits += 1
                return
            self.compiles.append(_Compile(
                compile_id=compile_id, name=str(artifact.get("op_name") or "eager batch"), file=None, line=None,
                start_s=None, dur_s=0.0, graph_ops=None, recompile_reason=artifact.get("reason") or None,
                kind="fused", detail={"compile_failed": bool(artifact.get("compile_failed")),
                                      "reason": artifact.get("reason")},
            ))

    def _metrics(self, envelope: dict[str, Any], compile_id: str, metrics: dict[str, Any]) -> None:
        """One `compilation_metrics` record: a Dynamo frame compile."""
        if envelope.get("frame_id") is None and metrics.get("compile_id"):
            compile_id = str(metrics["compile_id"])
        detail: dict[str, Any] = {key: metrics[key] for key in ("guard_count", "fail_type", "cache_size")
                                  if metrics.get(key) is not None}
        if metrics.get("fail_reason"):
            # What failed ("Dynamo recompile limit exceeded", "backend='x' raised: RuntimeError: ..."); the rest
            # is a traceback or hints.
            detail["fail_reason"] = first_sentence(str(metrics["fail_reason"]))
            limit = limit_hit(str(metrics["fail_reason"]))
            if limit is not None:
                detail["limit"], detail["limit_value"] = limit
        if metrics.get("fail_user_frame_filename") and metrics.get("fail_user_frame_lineno"):
            detail["fail_at"] = f"{metrics['fail_user_frame_filename']}:{metrics['fail_user_frame_lineno']}"
        elif metrics.get("fail_reason"):
            detail.update(failure_place(str(metrics["fail_reason"])))
        if isinstance(envelope.get("attempt"), int) and envelope["attempt"] > 0:
            detail["attempt"] = envelope["attempt"]
        restarts = [first_sentence(str(reason)).strip("'\"") for reason in metrics.get("restart_reasons") or []]
        if restarts:
            detail["restart_reasons"] = restarts
        caches = self.caches.pop(compile_id, {})
        if caches:
            detail["cache"] = {cache: ", ".join(dict.fromkeys(outcomes)) for cache, outcomes in caches.items()}
            outcomes = [outcome for values in caches.values() for outcome in values]
            if "hit" in outcomes and "miss" not in outcomes:
                detail["loaded_from_disk"] = True
        reason = metrics.get("recompile_reason") or self.reasons.pop(compile_id, None)
        start_s, dur_s = _metrics_times(metrics)
        if self.clock_offset is None and start_s is not None and dur_s is not None:
            self.clock_offset = start_s + dur_s - self.clock  # the metrics are written as the compile ends
        item = _Compile(
            compile_id=compile_id,
            name=str(metrics.get("co_name") or "?"),
            file=metrics.get("co_filename"),
            line=metrics.get("co_firstlineno"),
            start_s=start_s,
            dur_s=dur_s,
            graph_ops=metrics.get("graph_op_count"),
            recompile_reason=recompile_diff(reason) if isinstance(reason, str) and reason else None,
            detail=detail,
            span=[self.begun.pop(compile_id, None), None],
            clock=(self.started.pop(compile_id, None), self.clock),
            restart_reasons=restarts,
            caller=self.caller.pop(compile_id, None),
            called=self.called.pop(compile_id, None),
        )
        if not metrics.get("co_name") and envelope.get("frame_id") is None:
            # A compile outside Dynamo (AOTInductor's `aoti_compile_and_package`): named by the call the user's
            # code made, at that line.
            entries = self._stack(envelope.get("stack"))
            user = _innermost_user(entries)
            if user is not None:
                item.kind, item.caller = "aot", entries[user]
                item.name = entries[user + 1][0] if user + 1 < len(entries) else "compile"
        self.compiles.append(item)
        if metrics.get("co_name"):
            self.frame_code[_frame_of(compile_id)] = (
                str(metrics["co_name"]), metrics.get("co_filename"), metrics.get("co_firstlineno"))

    def _chromium_event(self, payload: list[str]) -> None:
        """A `dynamo` chromium event: where a compile's metrics have no times, its span gives them."""
        if not any('"dynamo"' in line for line in payload[:4]):
            return
        try:
            event = json.loads("\n".join(payload))
        except json.JSONDecodeError:
            return
        if not isinstance(event, dict) or not isinstance(event.get("ts"), (int, float)):
            return
        ts = float(event["ts"]) / 1e6
        if self.clock_offset is None:
            self.clock_offset = ts - self.clock
        if event.get("name") != "dynamo":
            return
        args = event.get("args")
        compile_id = str(args.get("compile_id")) if isinstance(args, dict) else "None"
        phase = event.get("ph")
        if phase in ("B", "X"):
            self.begun[compile_id] = ts
        if phase in ("E", "X"):
            end = ts + float(event.get("dur") or 0.0) / 1e6 if phase == "X" else ts
            for item in reversed(self.compiles):
                if item.compile_id == compile_id and item.span[1] is None:
                    item.span[1] = end
                    break
            else:
                if phase == "X":  # its metrics come after it
                    self.begun[compile_id] = ts

    def _dynamo_start(self, frame: str, compile_id: str, start: dict[str, Any]) -> None:
        """The code object a compile starts on (the last entry of `dynamo_start`'s stack), and the innermost frame
        of the user's code on that stack (kept for the compile's metrics, as ids repeat after `dynamo.reset()`)."""
        entries = self._stack(start.get("stack"))
        if not entries:
            return
        self.frame_code.setdefault(frame, entries[-1])
        user = _innermost_user(entries)
        if user is not None:
            self.caller[compile_id] = entries[user]
            called = _called(start["stack"][user].get("loc"))
            if called:
                self.called[compile_id] = called

    def _record_stack(self, compile_id: str, envelope: dict[str, Any]) -> None:
        """The caller of a compile whose `dynamo_start` stack holds no frame of the user's (a library function compiled
        whole, `torch.compile(F.silu)`: its stack is torch's wrapper alone), from another record of the compile that
        has the process's stack (`create_symbol` of a dynamic size, `guard_added`): its innermost user frame."""
        for value in envelope.values():
            stack = value.get("stack") if isinstance(value, dict) else None
            entries = self._stack(stack)
            user = _innermost_user(entries)
            if user is not None and isinstance(stack, list):
                self.caller[compile_id] = entries[user]
                called = _called(stack[user].get("loc"))
                if called:
                    self.called[compile_id] = called
                return

    def _stack(self, stack: Any) -> list[tuple[str, str | None, int | None]]:
        """A record's stack as (function, file, line), outermost first; file names interned by `str` records."""
        if not isinstance(stack, list):
            return []
        entries = []
        for entry in stack:
            if not isinstance(entry, dict):
                return []
            filename = entry.get("filename")
            file = self.paths.get(filename) if isinstance(filename, int) else filename if isinstance(filename, str) \
                else None
            line = entry.get("line")
            entries.append((str(entry.get("name") or "?"), file, line if isinstance(line, int) else None))
        return entries

    def _times(self, item: _Compile) -> tuple[float | None, float]:
        """A compile's start (Unix s, or the glog clock where the log has no Unix time at all) and duration."""
        begin, end = item.span
        started, ended = item.clock
        offset = self.clock_offset or 0.0
        start = item.start_s
        if start is None:
            start = begin if begin is not None else started + offset if started is not None else None
        dur = item.dur_s
        if dur is None:
            if begin is not None and end is not None:
                dur = end - begin
            elif started is not None and ended is not None:
                dur = ended - started
        return start, max(dur or 0.0, 0.0)

    def _write(self) -> None:
        writer = self.sink.writer
        timed: list[tuple[_Compile, float | None, float]] = []
        # A compile whose records name no caller takes that of another compile of its frame (the same callable).
        callers: dict[str, tuple[tuple[str, str | None, int | None], str | None]] = {}
        for item in self.compiles:
            if item.caller:
                callers.setdefault(_frame_of(item.compile_id), (item.caller, item.called))
        for item in self.compiles:
            if item.caller is None and item.kind == "dynamo_frame" and (not item.file or is_library(item.file)):
                item.caller, item.called = callers.get(_frame_of(item.compile_id), (None, None))
            # A compile that failed before tracing (e.g. the recompile limit was hit) names no code object: it is
            # the one its frame's other compiles name.
            if item.name == "?" and _frame_of(item.compile_id) in self.frame_code:
                item.name, item.file, item.line = self.frame_code[_frame_of(item.compile_id)]
            # A compiled nn.Module's code object is torch's own wrapper: its place is the user's line that
            # called the module.
            if item.caller and (not item.file or is_library(item.file)):
                if item.name == _WRAPPER and (item.file or "").endswith(_WRAPPER_FILE):
                    # named by what the user's line called (`net` of `out = net(x)`), not torch's wrapper
                    item.name = item.called or f"compiled call in {item.caller[0]}"
                elif item.file:  # a library's function Dynamo compiled (`helper` in contextlib.py, under DDP's forward)
                    item.name = f"{item.name} ({item.file.rsplit('/', 1)[-1]})"
                item.frame_function, item.file, item.line = item.caller
            timed.append((item, *self._times(item)))
        starts = [start for _, start, _ in timed if start is not None]
        start_s = min(starts) if starts else 0.0
        end_s = max((start + dur for _, start, dur in timed if start is not None), default=start_s)
        if self.into is None:
            writer.set_run(rank=self.rank, world_size=1, script=str(self.path), argv=[], pid=self.pid,
                           platform="cpu", chips=0, start_unix_ns=int(start_s * 1e9), end_ns=int((end_s - start_s) * 1e9))
            self.sink.note(self.rank, device="host", pid=self.pid, eager_cache_hits=self.eager_cache_hits)
        else:
            start_s = self.into.start_unix_ns / 1e9
            self.sink.note(self.rank, torch_trace=str(self.path), eager_cache_hits=self.eager_cache_hits)
        if self.skipped_lines:
            self.sink.note(self.rank, skipped_lines=self.skipped_lines)
        steps = self.into.steps if self.into is not None else None
        # torch names a distributed process's log `dedicated_log_torch_trace_rank_N_*.log`; its records carry `rank`.
        named = re.search(r"_rank_(\d+)", self.path.name)
        distributed_rank = int(named.group(1)) if named else self.process_rank
        if distributed_rank is not None:
            self.sink.note(self.rank, distributed_rank=distributed_rank)
        start_of: dict[str, int] = {}
        for item, start, dur in timed:
            start_ns = int((start - start_s) * 1e9) if start is not None else 0
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
            step = steps.step_at(start_ns) if steps else 0
            self.sink.append("compiles", (writer.next_id("compiles"), self.rank, program_id, item.kind, name_sid, None,
                                          -1, start_ns, int(dur * 1e9), frame_id, step, reason, diff_sid, detail))
            if "limit" in item.detail:  # Dynamo compiles the function no more: later calls run uncompiled
                warning = limit_warning(item.detail["limit"], item.detail.get("limit_value"), item.name,
                                        f"{item.file}:{item.line}" if item.file and item.line else None,
                                        item.recompile_reason)
                self.sink.append("annotations", (self.rank, writer.intern(warning), "recompile_limit", start_ns, 0,
                                                 frame_id, step))
        for brk in self.breaks or self._resumed_breaks():
            frame_id = writer.frame(brk.file, brk.line, brk.function) if brk.file and brk.line else None
            t_ns = start_of.get(brk.compile_id, 0)
            self.sink.append("graph_breaks", (self.rank, writer.intern(brk.reason), frame_id, t_ns,
                                              steps.step_at(t_ns) if steps else 0))

    def _resumed_breaks(self) -> list[GraphBreak]:
        """For a log that writes no `dynamo_graph_break_reason` (torch before 2.5): a break at the line each resume
        function names, its reason the restart reason of the function's compile that broke, where it has one."""
        breaks = []
        for index, item in enumerate(self.compiles):
            found = resumed_break(item.compile_id, item.name, item.file)
            if found is None:
                continue
            # The compile that broke: the latest before it of the function or of a frame resumed in it.
            resumed = f"torch_dynamo_resume_in_{found.function}_at_"
            broken = [other for other in self.compiles[:index]
                      if other.name == found.function or other.name.startswith(resumed)]
            if broken and broken[-1].restart_reasons:
                found.reason = broken[-1].restart_reasons[0]
            breaks.append(found)
        return breaks


def _compile_id(envelope: dict[str, Any]) -> str:
    """The id tlparse shows a record's compile by: `frame/compile`, after `!N/` for compiled autograd's graph N;
    empty for a record of no Dynamo frame."""
    if envelope.get("frame_id") is None:
        return ""
    compile_id = f"{envelope.get('frame_id')}/{envelope.get('frame_compile_id')}"
    autograd = envelope.get("compiled_autograd_id")
    return f"!{autograd}/{compile_id}" if autograd is not None else compile_id


def _called(loc: Any) -> str | None:
    """The callable a line of source calls (`net` in `out = net(x)`, `self.encoder` in `h = self.encoder(x)`): the
    first name called that is not torch's own (`torch.ones(4)` in the arguments)."""
    if not isinstance(loc, str):
        return None
    return next((name for name in _CALL.findall(loc) if name != "torch" and not name.startswith("torch.")), None)


def _innermost_user(entries: list[tuple[str, str | None, int | None]]) -> int | None:
    """The index of the innermost frame of the user's code on a stack (None: none is the user's)."""
    users = [index for index, (_, file, line) in enumerate(entries) if file and line and not is_library(file)]
    return users[-1] if users else None


def _metrics_times(metrics: dict[str, Any]) -> tuple[float | None, float | None]:
    """A compile's start (Unix s) and duration from its metrics, where they have them."""
    start = metrics.get("start_time_us")
    start_s = start / 1e6 if isinstance(start, (int, float)) else metrics.get("start_time")
    end = metrics.get("end_time_us")
    if not isinstance(metrics.get("duration_us"), (int, float)) and isinstance(start, (int, float)) and isinstance(end, (int, float)):
        return start / 1e6, (end - start) / 1e6
    for key, scale in (("duration_us", 1e-6), ("entire_frame_compile_time_s", 1.0),
                       ("dynamo_cumulative_compile_time_us", 1e-6)):
        if isinstance(metrics.get(key), (int, float)):
            return (float(start_s) if isinstance(start_s, (int, float)) else None), float(metrics[key]) * scale
    return (float(start_s) if isinstance(start_s, (int, float)) else None), None


def _reason_list(payload: list[str]) -> str:
    """A `recompile_reasons` artifact's failed guards (a JSON list of strings), one a line."""
    try:
        value = json.loads("\n".join(payload))
    except json.JSONDecodeError:
        return "\n".join(payload)
    return "\n".join(str(item) for item in value) if isinstance(value, list) else str(value)


def _frame_of(compile_id: str) -> str:
    """The frame of a compile id (`2/3` -> `2`, ignoring a restart's `_N` suffix; `!0/2/3` -> `!0/2`, a frame of
    compiled autograd's graph 0)."""
    parts = compile_id.lstrip("[").split("/")
    return "/".join(parts[:2]) if parts[0].startswith("!") else parts[0]


def log_pid(path: Path) -> int | None:
    """The process id in the glog prefix of a TORCH_TRACE log's first line."""
    with path.open("r", encoding="utf-8", errors="replace") as stream:
        return _pid(stream.readline())


def _pid(text: str) -> int | None:
    parts = text.split()
    return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None


def place_backward_compiles(path: Path) -> int:
    """Give each backward compile that a torch.profiler capture recorded (`entire_backward_compile`, kind `aot`) the
    place and name of its forward's compile in the process's TORCH_TRACE log (the same `compile_id`), in the trace at
    `path`: without `with_stack` the profile knows neither (with it, only the function that called `backward()`), and
    the log has no backward compiles. How many got one."""
    connection = sqlite3.connect(path)
    try:
        forwards: dict[tuple[int, str], tuple[int | None, str | None]] = {}
        backwards = []
        for row_id, rank, kind, frame_id, detail, name in connection.execute(
                "SELECT c.id, c.rank, c.kind, c.frame_id, c.detail, s.text FROM compiles c "
                "LEFT JOIN strings s ON s.id = c.name_sid WHERE c.kind IN ('dynamo_frame', 'aot')"):
            facts = _detail(detail)
            compile_id = facts.get("compile_id")
            if not isinstance(compile_id, str) or not compile_id:
                continue
            if kind == "dynamo_frame" and "event" not in facts:  # a log's compile, not the profile's own
                forwards.setdefault((rank, compile_id), (frame_id, name))
            elif kind == "aot" and facts.get("event") == "entire_backward_compile":
                backwards.append((row_id, rank, compile_id, frame_id))
        placed = 0
        for row_id, rank, compile_id, frame_id in backwards:
            forward = forwards.get((rank, compile_id))
            if forward is None:
                continue
            forward_frame, forward_name = forward
            if forward_name:
                name_sid = _string_id(connection, f"backward of {forward_name}")
                connection.execute("UPDATE compiles SET name_sid = ? WHERE id = ?", (name_sid, row_id))
                connection.execute("UPDATE programs SET name_sid = ?, structure_sid = ? WHERE id = "
                                   "(SELECT program_id FROM compiles WHERE id = ?)", (name_sid, name_sid, row_id))
            if forward_frame is not None and forward_frame != frame_id:
                connection.execute("UPDATE compiles SET frame_id = ? WHERE id = ?", (forward_frame, row_id))
            placed += 1
        connection.commit()
        return placed
    finally:
        connection.close()


def _detail(text: str | None) -> dict[str, Any]:
    try:
        facts = json.loads(text) if text else {}
    except ValueError:
        return {}
    return facts if isinstance(facts, dict) else {}


def _string_id(connection: sqlite3.Connection, text: str) -> int:
    found = connection.execute("SELECT id FROM strings WHERE text = ?", (text,)).fetchone()
    if found:
        return int(found[0])
    return int(connection.execute("INSERT INTO strings (text) VALUES (?)", (text,)).lastrowid or 0)
