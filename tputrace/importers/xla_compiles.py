"""The compiles of an XProf capture, from the host's compile ranges found in the import's first pass: JAX's (one per
compiled program, on the host's Python thread: `backend_compile_and_load`, older JAX's `backend_compile`), else the
PjRt client's (`PjRtCpuClient::Compile`); each named by the backend compiler's event inside it that has a `name`
stat (`CpuCompiler::RunBackend`), else by the jitted call around it (`PjitFunction(step)`: `jit_step`, as JAX names
its XLA module), else `XLA compile`."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tputrace.importers.hlo_metadata import UserFileFrames, is_library
from tputrace.importers.xevents import EventColumns, isin_few

COMPILE_EVENTS = frozenset(("backend_compile_and_load", "backend_compile"))
CLIENT_COMPILE = re.compile(r"^PjRt\w*Client::Compile$")
BACKEND_EVENT = "::RunBackend"
# JAX's host range around a jitted function's call, in which its compile runs: `PjitFunction(step)`.
JITTED_CALL = re.compile(r"^PjitFunction\((.+)\)$")
UNNAMED = "XLA compile"
# A Python tracer frame's event name: `$file.py:LINE function`.
PYTHON_FRAME = re.compile(r"^\$(.*?):(\d+) (.*)$")


@dataclass(frozen=True)
class CallLine:
    """A host line with jitted calls (its `line` head as read, `offset` ns from the Unix clock), and the name of each
    jitted call's event metadata id."""

    space: Any
    line: Any
    names: dict[int, str]
    offset: int = 0


@dataclass
class CompileSpans:
    """Compile ranges met in the first pass (Unix ns): JAX's, the PjRt client's and named backend ones; the lines with
    JAX's jitted calls (the program's name), whose calls are read again only for compiles the backend left unnamed
    (a long capture makes a call per step); and those calls (`keep_calls`)."""

    compiles: list[tuple[int, int]] = field(default_factory=list)
    client_compiles: list[tuple[int, int]] = field(default_factory=list)
    named: list[tuple[int, int, str]] = field(default_factory=list)
    call_lines: list[CallLine] = field(default_factory=list)
    calls: list[tuple[int, int, str]] = field(default_factory=list)
    # Python tracer frames (`$train.py:12 step`) of functions that a jitted call names: the jitted function's Python
    # body as JAX traces it, just before its compile.
    frames: list[tuple[int, int, str]] = field(default_factory=list)
    frame_names: dict[int, str] = field(default_factory=dict)  # their event metadata ids on the plane last scanned

    def watch_frames(self, event_metadata: Any, calls: dict[int, str]) -> set[int]:
        """The metadata ids of a host plane's Python tracer frames named as a jitted call's function, to keep."""
        called = {_bare(name) for name in calls.values()}
        self.frame_names = {key: meta.name for key, meta in event_metadata.items() if meta.name.startswith("$")
                            and (match := PYTHON_FRAME.match(meta.name)) and _bare(match.group(3)) in called}
        return set(self.frame_names)

    def extend(self, other: CompileSpans, offset: int) -> None:
        """Add `other`'s spans, moved by `offset` ns (onto the Unix clock)."""
        self.compiles += [(start + offset, end + offset) for start, end in other.compiles]
        self.client_compiles += [(start + offset, end + offset) for start, end in other.client_compiles]
        self.named += [(start + offset, end + offset, name) for start, end, name in other.named]
        self.call_lines += [replace(line, offset=line.offset + offset) for line in other.call_lines]
        self.calls += [(start + offset, end + offset, name) for start, end, name in other.calls]
        self.frames += [(start + offset, end + offset, name) for start, end, name in other.frames]

    def unnamed(self) -> list[tuple[int, int]]:
        """The compiles that hold no named backend range."""
        return [(start, end) for start, end in self.compiles or self.client_compiles
                if not any(start <= named_start and named_end <= end for named_start, named_end, _ in self.named)]

    def keep_calls(self, read: Iterable[tuple[CallLine, EventColumns]]) -> None:
        """Keep the jitted calls around an unnamed compile, from the call lines' events (`read`: each line's windows)."""
        unnamed = self.unnamed()
        if not unnamed:
            return
        for call_line, columns in read:
            chosen = np.flatnonzero(isin_few(columns.metadata_id, list(call_line.names)))
            starts = call_line.line.timestamp_ns + columns.offset_ps[chosen] // 1000
            ends = starts + columns.duration_ps[chosen] // 1000
            around = np.zeros(len(chosen), dtype=bool)
            for start, end in unnamed:
                around |= (starts + call_line.offset <= start) & (end <= ends + call_line.offset)
            self.calls += [(start + call_line.offset, end + call_line.offset, call_line.names[metadata_id])
                           for start, end, metadata_id in zip(starts[around].tolist(), ends[around].tolist(),
                                                              columns.metadata_id[chosen][around].tolist())]

    def named_compiles(self, hlo: dict[str, list[tuple[int, dict[str, Any]]]] | None = None,
                       user_frames: UserFileFrames | None = None) -> list[
            tuple[int, int, str | None, str, tuple[str, int, str] | None, bool, int | None]]:
        """Each compile as (start, end, the backend's name for its program or None, its label, the place (file, line,
        function) of the function it compiled or None, whether it compiled again a function compiled before, XLA's id
        of the module it built (that of its proto) or None), in time order. A compile is again where an earlier compile
        of its label is in the capture, or its name has an earlier proto (JAX compiled it before the trace, as a
        warm-up call does), unless its HLO's scopes differ from every earlier one's: another function of the name, as
        `jax.jit(jax.grad(f))`'s `jvp()` and `transpose(jvp())` beside `jax.jit(f)`'s, both `jit_f`. `hlo`: each
        program's protos' instruction sources in compile order (`hlo_metadata.read_hlo`), which name the user's files in full, where the Python
        tracer names only a file's base name; where given, a frame in another file (JAX's own, `cache_key.py:140
        <lambda>`) is not the user's function, nor is one of a file of the same base name whose function the
        programs' stacks in the user's file never pass through, defined beyond every line they name there (`user_frames`:
        JAX's `pmap.py:410 _fun` beside the user's `pmap.py`)."""
        hlo = hlo or {}
        files = {name: _FileFrames(path, *(user_frames or {}).get(path, (set(), 0)))
                 for name, path in user_files(sources for protos in hlo.values() for _, sources in protos).items()}
        spans = sorted(self.compiles or self.client_compiles)
        named = sorted(self.named)
        # The capture holds the last compiles of a name (JAX writes the protos of all the process compiled when the
        # trace stops): its k-th compile of a name is the k-th of that name's last protos.
        names = [next((name for named_start, named_end, name in named if start <= named_start and named_end <= end),
                      None) for start, end in spans]
        later = Counter(name for name in names if name)
        frames = sorted(self.frames)
        calls = sorted(self.calls, key=lambda call: (call[0], -call[1]))
        result = []
        scopes_of: dict[str, list[frozenset[str] | None]] = {}  # label -> the scopes of each of its compiles' programs
        for (start, end), name in zip(spans, names):
            # The innermost jitted call around the compile (the latest started of those holding it).
            caller = next((f"jit_{name}" for call_start, call_end, name in reversed(calls)
                           if call_start <= start and end <= call_end), None)
            label = name or caller or UNNAMED
            protos = hlo.get(name or "", [])
            version: int | None = None
            proto: dict[str, Any] | None = None
            if name:
                later[name] -= 1
                if later[name] < len(protos):
                    version, proto = protos[len(protos) - 1 - later[name]]
            place = _traced_frame(frames, start, label, files) or _traced_place(proto)
            scopes = _scopes(proto)
            earlier = scopes_of.setdefault(label, [_scopes(sources) for other, sources in protos
                                                   if version is not None and other < version])
            again = bool(earlier) and not (scopes is not None and all(seen is not None and seen != scopes
                                                                      for seen in earlier))
            earlier.append(scopes)
            result.append((start, end, name, label, place, again, version))
        return result


@dataclass(frozen=True)
class _FileFrames:
    """A user's file as its programs' stacks name it: its full path, the functions they pass through there and the
    last line they name."""

    path: str
    functions: set[str]
    last_line: int

    def holds(self, line: int, function: str) -> bool:
        """Whether a function defined at `line` can be this file's: one the stacks pass through, or, where they name
        none of its lines (deep stacks keep only their innermost frames), one defined before the last line they name."""
        return not self.functions or function in self.functions or line <= self.last_line


def _traced_frame(frames: list[tuple[int, int, str]], start: int, label: str,
                  user_files: dict[str, _FileFrames] | None) -> tuple[str, int, str] | None:
    """The frame of the function a compile labelled `label` (`jit_step`: JAX names a program `jit_` and its function's
    name) compiled: the latest Python tracer frame of that function to start before the compile, JAX's trace of its
    body (`$train.py:12 step`, at its `def` line). A compile made at a script's top level has no frame of the user's
    around it (the tracer records no frame already running when it started); this one is the user's function."""
    function = _bare(re.sub(r"\(\d+\)$", "", label).removeprefix("jit_").removeprefix("pmap_"))
    found = None
    for frame_start, _, frame in frames:
        if frame_start > start:
            break
        match = PYTHON_FRAME.match(frame)
        if match is None or _bare(match.group(3)) != function:
            continue
        file, line = match.group(1), int(match.group(2))
        if user_files:
            known = user_files.get(file)
            if known is None or not known.holds(line, match.group(3)):
                continue
            file = known.path
        found = (file, line, match.group(3))
    return found


def user_files(sources: Iterable[dict[str, Any]]) -> dict[str, str]:
    """The user's files that the programs' HLO names (each instruction's innermost frame of the user's code), by their
    base name."""
    return {file.rsplit("/", 1)[-1]: file for instructions in sources for source in instructions.values()
            if (file := getattr(source, "file", None)) and not is_library(file)}


def _scopes(sources: dict[str, Any] | None) -> frozenset[str] | None:
    """The scopes of a program's instructions (each `op_name` less its primitive: `jit(f)/transpose(jvp())`), which
    a retrace of the same function for other shapes keeps; None where its HLO is not known."""
    if not sources:
        return None
    return frozenset(op_name.rsplit("/", 1)[0] for source in sources.values()
                     if (op_name := getattr(source, "op_name", None)) and "/" in op_name)


def _traced_place(sources: dict[str, Any] | None) -> tuple[str, int, str] | None:
    """Where a program was traced, from its HLO (for a compile whose function the Python tracer did not record, or
    whose function is a library's, as `jnp.ones(n) * 2` at a script's top level compiles JAX's `multiply`): the
    earliest line of the user's file that most of its instructions came from."""
    places = [(source.file, source.line, source.function) for source in (sources or {}).values()
              if getattr(source, "file", None) and source.line and not is_library(source.file)]
    if not places:
        return None
    files = Counter(file for file, _, _ in places)
    file = max(files, key=lambda name: files[name])
    return min(place for place in places if place[0] == file)


def _bare(name: str) -> str:
    """A function's name without the characters JAX replaces in a program's name (`<lambda>`: `jit__lambda`)."""
    return re.sub(r"[^0-9A-Za-z]", "", name)
