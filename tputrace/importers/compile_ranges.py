"""torch.compile's ranges in a torch.profiler capture, beyond its compiles' own (`entire_frame_compile`).

The runtime's ranges around each call of compiled code (`TorchDynamo Cache Lookup`, `Torch-Compiled Region: 0/0`,
AOTAutograd's `CompiledFunction` and `CompiledFunctionBackward`, its wrapper's prologue, `Pregraph bytecode`) are
profiler `cpu_op` events, but no op: they are the calls of a compiled graph, whose ops (or Inductor's kernels) run
inside them. And what a frame compile's phases and the later calls show of its outcome: the compile ids whose
compiled region ran, and the phases each compile went through (`backend_compile_data: ..., compile_id=0/0`)."""

from __future__ import annotations

import json
import re
from typing import Any

# The runtime's ranges around a compiled graph's call.
COMPILED_CALL = re.compile(
    r"^(?:Torch-Compiled Region: |TorchDynamo Cache Lookup$|CompiledFunction(?:Backward)?$|"
    r"autograd::engine::evaluate_function: CompiledFunctionBackward$|AOTDispatcher Runtime Wrapper |Pregraph bytecode$)")
_REGION = re.compile(r"^Torch-Compiled Region: ([\w/\[\]-]+)")
# A compile phase's annotation (`dynamo_timed`): `backend_compile_data: fn_name=..., compile_id=0/0`.
_PHASE_DATA = re.compile(r"^(\w+)_data: (?:.*[ ,])?compile_id=([\w/\[\]-]+)")


class CompileOutcomes:
    """The compiled regions that ran and the phases of each compile, to tell whether a frame compile's code ran."""

    def __init__(self) -> None:
        self.regions_ran: set[str] = set()
        self.phases: dict[str, set[str]] = {}

    def call(self, name: str) -> None:
        """A compiled-call range (`COMPILED_CALL`); its region's compile id, where it names one."""
        region = _REGION.match(name)
        if region:
            self.regions_ran.add(region.group(1))

    def annotation(self, name: str) -> None:
        """A `user_annotation`: a compile phase's data names the phase and its compile."""
        phase = _PHASE_DATA.match(name)
        if phase:
            self.phases.setdefault(phase.group(2), set()).add(phase.group(1))

    def detail(self, compile_id: str, compile_end_ns: int, capture_end_ns: int) -> dict[str, Any]:
        """What the capture shows of a frame compile's outcome: whether its compiled region ran (known only where the
        capture went on after the compile and its torch marks regions: some region ran, or the compile's phases are
        named), whether Dynamo handed a graph to the backend and built the compiled code's guards."""
        phases = self.phases.get(compile_id, set())
        if capture_end_ns <= compile_end_ns or not (self.regions_ran or phases):
            return {}
        return {"region_ran": compile_id in self.regions_ran, "backend_called": "backend_compile" in phases,
                "guards_built": "build_guards" in phases}


def compile_detail(compile_id: str | None, event: str, outcome: dict[str, Any]) -> str:
    """A profiler compile's `compiles.detail` JSON."""
    return json.dumps({"compile_id": compile_id, "event": event, **outcome} if compile_id else {"event": event})
