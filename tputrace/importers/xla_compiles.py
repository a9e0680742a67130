"""The compiles of an XProf capture, from the host's compile ranges found in the import's first pass: JAX's (one per
compiled program, on the host's Python thread: `backend_compile_and_load`, older JAX's `backend_compile`), else the
PjRt client's (`PjRtCpuClient::Compile`); each named by the backend compiler's event inside it that has a `name`
stat (`CpuCompiler::RunBackend`), else by the jitted call around it (`PjitFunction(step)`: `jit_step`, as JAX names
its XLA module), else `XLA compile`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

COMPILE_EVENTS = frozenset(("backend_compile_and_load", "backend_compile"))
CLIENT_COMPILE = re.compile(r"^PjRt\w*Client::Compile$")
BACKEND_EVENT = "::RunBackend"
# JAX's host range around a jitted function's call, in which its compile runs: `PjitFunction(step)`.
JITTED_CALL = re.compile(r"^PjitFunction\((.+)\)$")
UNNAMED = "XLA compile"


@dataclass
class CompileSpans:
    """Compile ranges met in the first pass (Unix ns): JAX's, the PjRt client's, named backend ones, and JAX's jitted
    calls (the program's name)."""

    compiles: list[tuple[int, int]] = field(default_factory=list)
    client_compiles: list[tuple[int, int]] = field(default_factory=list)
    named: list[tuple[int, int, str]] = field(default_factory=list)
    calls: list[tuple[int, int, str]] = field(default_factory=list)

    def extend(self, other: CompileSpans, offset: int) -> None:
        """Add `other`'s spans, moved by `offset` ns (onto the Unix clock)."""
        self.compiles += [(start + offset, end + offset) for start, end in other.compiles]
        self.client_compiles += [(start + offset, end + offset) for start, end in other.client_compiles]
        self.named += [(start + offset, end + offset, name) for start, end, name in other.named]
        self.calls += [(start + offset, end + offset, name) for start, end, name in other.calls]

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
