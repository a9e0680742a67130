"""The compiles of an XProf capture, from the host's compile ranges found in the import's first pass: JAX's (one per
compiled program, on the host's Python thread: `backend_compile_and_load`, older JAX's `backend_compile`), else the
PjRt client's (`PjRtCpuClient::Compile`); each named by the backend compiler's event inside it that has a `name`
stat (`CpuCompiler::RunBackend`), else by the jitted call around it (`PjitFunction(step)`: `jit_step`, as JAX names
its XLA module), else `XLA compile`."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tputrace.importers.xevents import EventColumns

COMPILE_EVENTS = frozenset(("backend_compile_and_load", "backend_compile"))
CLIENT_COMPILE = re.compile(r"^PjRt\w*Client::Compile$")
BACKEND_EVENT = "::RunBackend"
# JAX's host range around a jitted function's call, in which its compile runs: `PjitFunction(step)`.
JITTED_CALL = re.compile(r"^PjitFunction\((.+)\)$")
UNNAMED = "XLA compile"


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

    def extend(self, other: CompileSpans, offset: int) -> None:
        """Add `other`'s spans, moved by `offset` ns (onto the Unix clock)."""
        self.compiles += [(start + offset, end + offset) for start, end in other.compiles]
        self.client_compiles += [(start + offset, end + offset) for start, end in other.client_compiles]
        self.named += [(start + offset, end + offset, name) for start, end, name in other.named]
        self.call_lines += [replace(line, offset=line.offset + offset) for line in other.call_lines]
        self.calls += [(start + offset, end + offset, name) for start, end, name in other.calls]

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
            chosen = np.flatnonzero(np.isin(columns.metadata_id, list(call_line.names)))
            starts = call_line.line.timestamp_ns + columns.offset_ps[chosen] // 1000
            ends = starts + columns.duration_ps[chosen] // 1000
            around = np.zeros(len(chosen), dtype=bool)
            for start, end in unnamed:
                around |= (starts + call_line.offset <= start) & (end <= ends + call_line.offset)
            self.calls += [(start + call_line.offset, end + call_line.offset, call_line.names[metadata_id])
                           for start, end, metadata_id in zip(starts[around].tolist(), ends[around].tolist(),
                                                              columns.metadata_id[chosen][around].tolist())]

    def named_compiles(self) -> list[tuple[int, int, str | None, str]]:
        """Each compile as (start, end, the backend's name for its program or None, its label), in time order."""
        named = sorted(self.named)
        calls = sorted(self.calls, key=lambda call: (call[0], -call[1]))
        result = []
        for start, end in sorted(self.compiles or self.client_compiles):
            name = next((name for named_start, named_end, name in named
                         if start <= named_start and named_end <= end), None)
            # The innermost jitted call around the compile (the latest started of those holding it).
            caller = next((f"jit_{name}" for call_start, call_end, name in reversed(calls)
                           if call_start <= start and end <= call_end), None)
            result.append((start, end, name, name or caller or UNNAMED))
        return result
