"""What every device view reads once from a trace: the interned strings, frames, programs and XLA
fusions, and the positions of the columns of a raw `ops` row."""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tputrace.derived.op_cost import OpCost, RunLayout, TargetChip, make_layout, op_cost

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


@dataclass(frozen=True, slots=True)
class ProgramInfo:
    """One compiled program: its kind, name, input signature, ATen and HLO op counts, and XLA's FLOPs and bytes."""

    id: int
    kind: str | None
    name: str
    signature: str | None
    n_ops: int | None
    flops: float | None
    bytes_accessed: float | None
    hlo_ops: int | None


@dataclass(frozen=True, slots=True)
class FusionInfo:
    """One of XLA's fusions in a program, with the ATen ops its instructions came from."""

    name: str
    kind: str | None
    hlo_ops: str | None
    aten_ops: tuple[str, ...]


# Positions in a raw `ops` row (the schema's column order).
SEQ, OP, INPUTS, OUTPUTS, CHIP, START, DUR, FRAME, MODULE, STEP, PROGRAM, FLUSH = 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
OpRow = tuple[Any, ...]
# An op row's parts, picked in C: what identifies its dispatch (op, inputs, outputs, frame, module,
# the same as `row[2:5] + row[8:10]`), its place in a program, its cost, and the flush it ran in.
DISPATCH_KEY = operator.itemgetter(OP, INPUTS, OUTPUTS, FRAME, MODULE)
_OP_SIGNATURE = operator.itemgetter(OP, INPUTS, OUTPUTS, MODULE, FRAME)
_COST_KEY = operator.itemgetter(OP, INPUTS, OUTPUTS)
OpBatch = list[OpRow]
# Run layouts kept for reuse: a trace whose flushes repeat reuses a few; one whose every flush differs
# would otherwise hold one per flush, as much memory as its ops.
MAX_CACHED_LAYOUTS = 2048


def remember(cache: dict[Any, Any], key: Any, value: Any, limit: int = MAX_CACHED_LAYOUTS) -> Any:
    """Store `value` under `key` in `cache`, dropping the oldest entry once `limit` are held; returns `value`."""
    if len(cache) >= limit:
        del cache[next(iter(cache))]
    cache[key] = value
    return value


class TraceTables:
    """The interned strings, frames, programs and fusions of a trace, read once for every device view."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.strings: dict[int, str] = dict(trace.sql("SELECT id, text FROM strings"))
        self.frames: dict[int, tuple[str, int, str]] = {
            frame_id: (self.strings.get(file_sid, "?"), line, self.strings.get(function_sid, "?"))
            for frame_id, file_sid, line, function_sid in trace.sql("SELECT id, file_sid, line, function_sid FROM frames")
        }
        self.programs: dict[int, ProgramInfo] = {}
        for program_id, kind, name_sid, signature_sid, n_ops, flops, bytes_accessed, hlo_ops in trace.sql(
            "SELECT id, kind, name_sid, signature_sid, n_ops, flops, bytes_accessed, hlo_ops FROM programs"
        ):
            name = self.strings.get(name_sid) or f"program_{program_id}"
            self.programs[program_id] = ProgramInfo(program_id, kind, name, self.strings.get(signature_sid), n_ops,
                                                    flops, bytes_accessed, hlo_ops)
        self.fusions: dict[int, list[FusionInfo]] = {}
        for program_id, name_sid, kind_sid, ops_sid, aten_sid in trace.sql(
            "SELECT program_id, name_sid, kind_sid, ops_sid, aten_sid FROM fusions ORDER BY rowid"
        ):
            aten = self.strings.get(aten_sid) or ""
            self.fusions.setdefault(program_id, []).append(FusionInfo(
                self.strings.get(name_sid) or "fusion", self.strings.get(kind_sid), self.strings.get(ops_sid),
                tuple(part.strip() for part in aten.split(",") if part.strip()),
            ))
        self._fusion_of_op: dict[tuple[int, str], FusionInfo | None] = {}
        self._costs: dict[tuple[int | None, int | None, int | None], OpCost] = {}
        self._layouts: dict[tuple[Any, ...], RunLayout] = {}
        self._layout_ids = itertools.count()

    def text(self, sid: int | None) -> str | None:
        return None if sid is None else self.strings.get(sid)

    def source(self, frame_id: int | None) -> str | None:
        """`file:line` of a frame, as XProf's `source` stat wants it."""
        frame = self.frames.get(frame_id) if frame_id is not None else None
        return None if frame is None else f"{frame[0]}:{frame[1]}"

    def program_name(self, program_id: int) -> str:
        program = self.programs.get(program_id)
        return program.name if program else f"program_{program_id}"

    def cost(self, op_sid: int | None, inputs_sid: int | None, outputs_sid: int | None) -> OpCost:
        """`op_cost` of an op given by interned ids (cached by ids)."""
        key = (op_sid, inputs_sid, outputs_sid)
        cost = self._costs.get(key)
        if cost is None:
            cost = self._costs[key] = op_cost(self.text(op_sid), self.text(inputs_sid), self.text(outputs_sid))
        return cost

    def fusion_of(self, program_id: int, op: str | None) -> FusionInfo | None:
        """The first XLA fusion of the program whose instructions came from ATen op `op`."""
        if op is None:
            return None
        cache_key = (program_id, op)
        if cache_key not in self._fusion_of_op:
            fusions = self.fusions.get(program_id, ())
            self._fusion_of_op[cache_key] = next((fusion for fusion in fusions if op in fusion.aten_ops), None)
        return self._fusion_of_op[cache_key]

    def ops_layout(self, chip: TargetChip, program_id: int, rows: OpBatch) -> RunLayout:
        """The layout of a run of `program_id` with the ops of `rows` (made once per distinct op list)."""
        signature = tuple(map(_OP_SIGNATURE, rows))
        cache_key = (chip.name, program_id, signature)
        layout = self._layouts.get(cache_key)
        if layout is None:
            cost = self.cost
            op_keys = [(program_id, position, *op, None) for position, op in enumerate(signature)]
            costs = [cost(*key) for key in map(_COST_KEY, rows)]
            layout = remember(self._layouts, cache_key, self._make_layout(program_id, op_keys, chip, costs))
        return layout

    def fusions_layout(self, chip: TargetChip, program_id: int) -> RunLayout:
        """The layout of a run of `program_id` without recorded ops: its XLA fusions, weighed by their
        instruction count (or the whole program as one op when it has none)."""
        cache_key = (chip.name, program_id, None)
        layout = self._layouts.get(cache_key)
        if layout is None:
            fusions = self.fusions.get(program_id, [])
            op_keys: list[tuple[Any, ...]] = [(program_id, index, None, None, None, None, None, index) for index in range(len(fusions))]
            costs = [OpCost(float(len((fusion.hlo_ops or "x").split(","))), 0.0, 0.0) for fusion in fusions]
            if not fusions:
                op_keys = [(program_id, 0, None, None, None, None, None, -1)]
                costs = [OpCost(1.0, 0.0, 0.0)]
            layout = remember(self._layouts, cache_key, self._make_layout(program_id, op_keys, chip, costs))
        return layout

    def _make_layout(self, program_id: int, op_keys: list[tuple[Any, ...]], chip: TargetChip, costs: list[OpCost]) -> RunLayout:
        program = self.programs.get(program_id)
        return make_layout(next(self._layout_ids), op_keys, program.flops if program is not None else None,
                           program.bytes_accessed if program is not None else None, chip, costs)
