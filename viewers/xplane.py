"""Export a trace as XProf files: `<logdir>/plugins/profile/<run>/<host>.xplane.pb`, one per rank.

TensorBoard's profile plugin and the standalone `xprof` server read these files; the format is
described in `shared/notes/xprof-format.md`. Each file holds one `XSpace` with:

- one `/device:TPU:<chip>` plane per chip, with the target chip's peaks as plane stats and three
  lines: `Steps` (one event per training step; the trailing `end` step only when there is no other),
  `XLA Modules` (one event per program execution) and
  `XLA Ops` (the ATen ops of each execution, or XLA's fusions when a program has no recorded ops);
  an op's properties (`hlo_category`, `tf_op`, `source` as `file:line`, `flops`, `bytes_accessed`,
  `memory_access_breakdown`) are stats of its event metadata, where XProf reads them;
- a `/host:CPU` plane with the Python side: op dispatch, flushes, compiles (with their reasons),
  syncs, transfers, CPU fallbacks, collectives and annotated ranges, one line each.

Two things on the chip are estimates, and say so:
- Time inside a program. The trace records when each program ran on a chip, not when each op inside
  it ran, so the program's measured time is shared out among its ops in proportion to a roofline
  estimate on the target chip (XLA's FLOPs and bytes for the program, split by each op's FLOPs and
  bytes derived from its shapes). Op metadata carries a `time_estimate` stat.
- When a program started. A recorded execution runs from when the host queued the program until it
  finished, so executions overlap; the chip runs one at a time, so each starts here when the one
  before it ended (`queued_behind_previous_ns` says by how much it moved).

The device timeline model (`device_runs`, `ProgramRun`, `TargetChip`, `op_cost`) is shared with
the Perfetto export. Nothing here imports torch or jax; strings from the trace are only ever data.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tputrace.analysis.chips import DEFAULT_TARGET, chip as chip_model
from tputrace.viewers import xplane_proto

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

TIME_ESTIMATE_NOTE = "estimate: the program's measured time split by a roofline estimate of each op on the target chip"
HOST_PLANE = "/host:CPU"
DEVICE_PLANE_PREFIX = "/device:TPU:"
_PS_PER_NS = 1000


# -- target chips -----------------------------------------------------------------------------------

# JAX's device_kind for each generation, which XProf shows as the device type.
_DEVICE_KINDS = {"v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite", "v7": "TPU7x"}


@dataclass(frozen=True)
class TargetChip:
    """The peaks of the chip an export is drawn for (from `tputrace.analysis.chips`): XProf's
    utilisation figures and the op time estimate use them. Peaks per ns: FLOPs and bytes."""

    name: str
    device_type: str
    peak_teraflops_per_second: float
    fp32_peak_teraflops_per_second: float
    hbm_gigabytes_per_second: float
    hbm_bytes: int
    source: str

    @property
    def peak_flops_per_ns(self) -> float:
        return self.peak_teraflops_per_second * 1e3

    @property
    def fp32_peak_flops_per_ns(self) -> float:
        return self.fp32_peak_teraflops_per_second * 1e3

    @property
    def hbm_bytes_per_ns(self) -> float:
        return self.hbm_gigabytes_per_second


def target_chip(name: str = DEFAULT_TARGET) -> TargetChip:
    """The chip called `name` (v5e, v5p, v6e, v7, ...); raises `TputraceError` naming the known ones."""
    model = chip_model(name)
    return TargetChip(
        name=model.name,
        device_type=_DEVICE_KINDS.get(model.name, model.label),
        peak_teraflops_per_second=model.peak_bf16_flops / 1e12,
        fp32_peak_teraflops_per_second=model.peak_fp32_flops / 1e12,
        hbm_gigabytes_per_second=model.hbm_bandwidth / 1e9,
        hbm_bytes=int(model.hbm_bytes),
        source=f"{model.label}: {model.sources.get('peak_bf16_flops', 'tputrace.analysis.chips')}",
    )


# -- op cost from shapes ----------------------------------------------------------------------------

_DTYPE_BYTES = {
    "f64": 8, "f32": 4, "tf32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u64": 8,
    "u32": 4, "u16": 2, "u8": 1, "b8": 1, "bool": 1, "c64": 8, "c128": 16, "c32": 4,
}
_TENSOR = re.compile(r"([a-z][a-z0-9]*)\[([0-9, ]*)\](?:\s*x(\d+))?")
_MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm", "dot", "mv", "addmv", "einsum"})
_ATTENTION_MARK = "scaled_dot_product"
_DATA_FORMATTING_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "transpose", "t", "permute", "expand", "slice", "select", "squeeze",
    "unsqueeze", "clone", "copy", "copy_", "_to_copy", "contiguous", "cat", "stack", "split", "split_with_sizes",
    "as_strided", "alias", "detach", "index_select", "narrow", "flatten", "unbind", "pad", "constant_pad_nd",
})
_REDUCE_OPS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "prod", "argmax",
                         "argmin", "all", "any", "norm", "linalg_vector_norm", "logsumexp", "cumsum"})
_COLLECTIVE_CATEGORIES = (
    ("all_reduce", "all-reduce"), ("allreduce", "all-reduce"), ("all_gather", "all-gather"),
    ("allgather", "all-gather"), ("reduce_scatter", "reduce-scatter"), ("all_to_all", "all-to-all"),
    ("alltoall", "all-to-all"), ("broadcast_", "collective-broadcast"), ("send", "send"), ("recv", "recv"),
)
_FUSION_CATEGORIES = {"kLoop": "loop fusion", "kInput": "input fusion", "kOutput": "output fusion",
                      "kCustom": "custom fusion"}


@dataclass(frozen=True, slots=True)
class Tensor:
    """One tensor of an op's shape string, e.g. `f32[8,128]`; `count` for `... x14` lists."""

    dtype: str
    dims: tuple[int, ...]
    count: int = 1

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int:
        return self.elements * _DTYPE_BYTES.get(self.dtype, 4) * self.count


@functools.lru_cache(maxsize=65536)
def parse_tensors(text: str | None) -> tuple[Tensor, ...]:
    """The tensors in a shape string like `'f32[64,128], f32[128]'` (scalars like `float` are skipped)."""
    if not text:
        return ()
    tensors = []
    for match in _TENSOR.finditer(text):
        dtype, dims_text, count = match.groups()
        dims = tuple(int(part) for part in dims_text.replace(" ", "").split(",") if part)
        tensors.append(Tensor(dtype, dims, int(count) if count else 1))
    return tuple(tensors)


def aten_base_name(op: str | None) -> str:
    """`aten.addmm.default` -> `addmm`; other namespaces keep only the op name too."""
    if not op:
        return ""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


class OpCost(NamedTuple):
    """An op's work estimated from its shapes: FLOPs, bytes read (inputs) and written (outputs), and
    whether it computes in 32 or 64-bit floats (slower on the MXU)."""

    flops: float
    read_bytes: float
    write_bytes: float
    wide_floats: bool = False

    @property
    def bytes_accessed(self) -> float:
        return self.read_bytes + self.write_bytes


@functools.lru_cache(maxsize=65536)
def op_cost(op: str | None, inputs: str | None, outputs: str | None) -> OpCost:
    """FLOPs and bytes of one ATen op from its shape strings: 2·M·N·K for matmuls, 4·L·S·E per head for
    attention (forward; twice that backward), one FLOP per output element otherwise."""
    input_tensors = parse_tensors(inputs)
    output_tensors = parse_tensors(outputs)
    read_bytes = float(sum(tensor.nbytes for tensor in input_tensors))
    write_bytes = float(sum(tensor.nbytes for tensor in output_tensors))
    output_elements = sum(tensor.elements * tensor.count for tensor in output_tensors)
    base = aten_base_name(op)
    flops = float(output_elements)
    if base in _MATMUL_OPS and input_tensors:
        operand = input_tensors[1] if base in ("addmm", "baddbmm", "addbmm", "addmv") and len(input_tensors) > 1 else input_tensors[0]
        if operand.dims:
            flops = 2.0 * output_elements * operand.dims[-1]
    elif _ATTENTION_MARK in base and len(input_tensors) >= 2 and len(input_tensors[1].dims) >= 2:
        query, key = input_tensors[0], input_tensors[1]
        flops = 4.0 * query.elements * key.dims[-2]
        if base.endswith("backward"):
            flops *= 2
    wide_floats = bool(input_tensors) and input_tensors[0].dtype in ("f32", "f64", "tf32")
    return OpCost(flops, read_bytes, write_bytes, wide_floats)


_OP_TYPE = re.compile(r"[a-z_][a-z0-9_]*")


def framework_op(op: str, module: str | None) -> str:
    """XProf's `tf_op` for an ATen op: `module.path/aten.addmm.default:addmm`.

    XProf splits `tf_op` at the colon into the framework op's name and type, and accepts a type only
    in TensorFlow's (`MatMul`) or JAX's (`dot_general`) spelling; a dotted type like
    `aten.addmm.default` would make every op's type "Unknown". So the name is the module path and the
    full ATen op, and the type is the ATen op's base name; an op whose base name is no valid type
    keeps the full name as its type.
    """
    base = aten_base_name(op).lower()
    op_type = base if _OP_TYPE.fullmatch(base) else op
    return f"{module}/{op}:{op_type}" if module else f"{op}:{op_type}"


def hlo_category(op: str | None, fusion_kind: str | None = None) -> str:
    """The XProf op category of an ATen op: matmul, attention, a collective, data formatting, reduce,
    or the kind of XLA fusion it ended up in."""
    base = aten_base_name(op)
    lowered = (op or "").lower()
    for mark, category in _COLLECTIVE_CATEGORIES:
        if mark in lowered and not lowered.startswith("aten."):
            return category
    if base in _MATMUL_OPS:
        return "matmul"
    if _ATTENTION_MARK in base:
        return "attention"
    if base in _DATA_FORMATTING_OPS or base.removesuffix("_") in _DATA_FORMATTING_OPS:
        return "data formatting"
    if fusion_kind in _FUSION_CATEGORIES:
        return _FUSION_CATEGORIES[fusion_kind]
    if base in _REDUCE_OPS:
        return "reduce"
    return "non-fusion elementwise"


# -- the device timeline ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProgramInfo:
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
    name: str
    kind: str | None
    hlo_ops: str | None
    aten_ops: tuple[str, ...]


class OpKey(NamedTuple):
    """What identifies one op of a program (XProf's `program_id` + `symbol_id`): its position in the
    program and what was recorded for it (interned ids), or, for a program without recorded ops, the
    index of the XLA fusion it stands for (-1: the whole program)."""

    program_id: int
    position: int
    op_sid: int | None
    inputs_sid: int | None
    outputs_sid: int | None
    module_sid: int | None
    frame_id: int | None
    fusion: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceOp:
    """One op's place in one execution: (estimated) start and duration, its share of the program's
    FLOPs and bytes, and the dispatch sequence number of its `ops` row (None for a fusion)."""

    key: OpKey
    start_ns: float
    dur_ns: float
    flops: float
    read_bytes: float
    write_bytes: float
    seq: int | None

    @property
    def bytes_accessed(self) -> float:
        return self.read_bytes + self.write_bytes


@dataclass(slots=True)
class ProgramRun:
    """One program execution on a chip (an `executions` row, or a strict-mode op) and its ops.

    The ops are kept as parallel lists (`op_keys`, `op_starts_ns`, ...), which is what a million of
    them costs least as; `ops` gives them as `DeviceOp`s. `queued_ns` is how long the run waited for
    the program before it on the same chip (see `_serialized`); `estimated` is False for a single op
    whose time was measured alone (strict mode). Runs with the same `layout` (not None) share their
    `op_keys`, `op_flops`, `op_read_bytes` and `op_write_bytes` lists (the same program with the same
    ops), so that a view can build what depends only on those once per layout; nobody may change them.
    """

    chip: int
    program_id: int
    start_ns: int
    dur_ns: int
    step: int | None
    flush_id: int | None
    queued_ns: int = 0
    estimated: bool = True
    layout: int | None = None
    op_keys: list[tuple[Any, ...]] = field(default_factory=list)
    op_starts_ns: list[float] = field(default_factory=list)
    op_durs_ns: list[float] = field(default_factory=list)
    op_flops: list[float] = field(default_factory=list)
    op_read_bytes: list[float] = field(default_factory=list)
    op_write_bytes: list[float] = field(default_factory=list)
    op_seqs: list[int | None] = field(default_factory=list)

    @property
    def ops(self) -> list[DeviceOp]:
        return [
            DeviceOp(OpKey._make(key), start, dur, flops, read, write, seq)
            for key, start, dur, flops, read, write, seq in zip(
                self.op_keys, self.op_starts_ns, self.op_durs_ns, self.op_flops, self.op_read_bytes,
                self.op_write_bytes, self.op_seqs,
            )
        ]


@dataclass(frozen=True, slots=True)
class _Layout:
    """What every run of one program with the same ops shares: the op keys, each op's share of the
    program's FLOPs and bytes, and each op's roofline time (their sum is `total_ns`)."""

    id: int
    op_keys: list[tuple[Any, ...]]
    op_flops: list[float]
    op_read_bytes: list[float]
    op_write_bytes: list[float]
    roofline_ns: list[float]
    total_ns: float


# Positions in a raw `ops` row (the schema's column order).
SEQ, OP, INPUTS, OUTPUTS, CHIP, START, DUR, FRAME, MODULE, STEP, PROGRAM, FLUSH = 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
OpRow = tuple[Any, ...]
# An op row's parts, picked in C: what identifies its dispatch (op, inputs, outputs, frame, module,
# the same as `row[2:5] + row[8:10]`), its place in a program, its cost, and the flush it ran in.
DISPATCH_KEY = operator.itemgetter(OP, INPUTS, OUTPUTS, FRAME, MODULE)
_OP_SIGNATURE = operator.itemgetter(OP, INPUTS, OUTPUTS, MODULE, FRAME)
_COST_KEY = operator.itemgetter(OP, INPUTS, OUTPUTS)
_FLUSH_OF = operator.itemgetter(FLUSH)
_SEQ_OF = operator.itemgetter(SEQ)
_DUR_OF = operator.itemgetter(DUR)
OpBatch = list[OpRow]


class TraceTables:
    """The interned strings, frames, programs and fusions of a trace, read once for all exports."""

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
        self._layouts: dict[tuple[Any, ...], _Layout] = {}

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

    def ops_layout(self, chip: TargetChip, program_id: int, rows: OpBatch) -> _Layout:
        """The layout of a run of `program_id` with the ops of `rows` (made once per distinct op list)."""
        signature = tuple(map(_OP_SIGNATURE, rows))
        cache_key = (chip.name, program_id, signature)
        layout = self._layouts.get(cache_key)
        if layout is None:
            cost = self.cost
            op_keys = [(program_id, position, *op, None) for position, op in enumerate(signature)]
            costs = [cost(*key) for key in map(_COST_KEY, rows)]
            layout = self._layouts[cache_key] = _make_layout(len(self._layouts), op_keys, self.programs.get(program_id), chip, costs)
        return layout

    def fusions_layout(self, chip: TargetChip, program_id: int) -> _Layout:
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
            layout = self._layouts[cache_key] = _make_layout(len(self._layouts), op_keys, self.programs.get(program_id), chip, costs)
        return layout


class FlushesInterleaved(Exception):
    """The ops of one flush are not contiguous in the file; read them sorted by flush instead."""


def device_runs(tables: TraceTables, rank: int, chip: TargetChip, *, on_ops: Callable[[OpBatch], None] | None = None,
                sorted_by_flush: bool = False) -> Iterator[ProgramRun]:
    """Every program execution of `rank`, with its ops placed inside it, in file order (not time order).

    Ranks with `executions` rows (DeferAndFuse, torch.compile) use them with the ops of their flush,
    or the program's XLA fusions when it has no recorded ops; ranks without (strict mode, where each
    op is its own program) use each op as one execution.

    The ops table is read once, in file order, in batches, and `on_ops` (when given) sees every op
    row of the rank (as `_op_batches` reads them), batch by batch, so that a caller can draw host dispatch from the same scan. A
    flush's ops are written together, so they are contiguous; when they are not,
    `FlushesInterleaved` is raised as soon as that shows (a run yielded before may lack ops), and the
    caller should drop what it got and start again with `sorted_by_flush=True` (slower; `on_ops` then
    sees only the ops that ran in flushes). `scan_rank` does all that.
    """
    trace = tables.trace
    if is_strict(trace, rank):
        yield from _strict_runs(tables, _op_batches(trace, rank, strict=True), on_ops)
        return
    executions_by_flush: dict[int, list[tuple[Any, ...]]] = {}
    unflushed: list[tuple[Any, ...]] = []
    for execution in _serialized(trace.sql(
        "SELECT chip, program_id, start_ns, dur_ns, step, flush_id FROM executions WHERE rank = ? ORDER BY chip, start_ns, rowid",
        (rank,),
    )):
        if execution[5] is None:
            unflushed.append(execution)
        else:
            executions_by_flush.setdefault(execution[5], []).append(execution)
    batches = _op_batches(trace, rank, in_flushes=sorted_by_flush)
    closed: set[int] = set()
    group: OpBatch = []
    group_flush: int | None = None
    for rows in batches:
        if on_ops is not None:
            on_ops(rows)
        in_programs = [row for row in rows if row[FLUSH] is not None and row[PROGRAM] is not None]
        for flush_id, flush_rows in groupby(in_programs, _FLUSH_OF):
            if flush_id == group_flush:
                group.extend(flush_rows)
                continue
            if group_flush is not None:
                closed.add(group_flush)
                for execution in executions_by_flush.pop(group_flush, ()):
                    yield _run_with_ops(tables, chip, execution, group)
            if flush_id in closed:
                raise FlushesInterleaved(f"the ops of flush {flush_id} are not contiguous in {trace.path}")
            group, group_flush = list(flush_rows), flush_id
    if group_flush is not None:
        for execution in executions_by_flush.pop(group_flush, ()):
            yield _run_with_ops(tables, chip, execution, group)
    for execution in [*unflushed, *(execution for executions in executions_by_flush.values() for execution in executions)]:
        yield _run_with_fusions(tables, chip, execution)


def _op_batches(trace: Trace, rank: int, *, strict: bool = False, in_flushes: bool = False) -> Iterator[OpBatch]:
    """The `ops` rows of `rank` in batches, in file order (`in_flushes`: only those that ran in a
    flush's program, by flush). Every column is read at its schema position, but `rank`, and `chip`
    and `step` outside strict mode (`strict`), come back None: nothing here needs them, and every
    column read costs time on a million rows."""
    query = (f"SELECT seq, NULL, op_sid, inputs_sid, outputs_sid, {'chip' if strict else 'NULL'}, start_ns, dur_ns, "
             f"frame_id, module_sid, {'step' if strict else 'NULL'}, program_id, flush_id FROM ops WHERE rank = ?")
    if in_flushes:
        return trace.sql_batches(query + " AND flush_id IS NOT NULL AND program_id IS NOT NULL ORDER BY flush_id, seq", (rank,))
    return trace.sql_batches(query + " ORDER BY rowid", (rank,))


def _serialized(rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """Executions as the chip ran them: one at a time, in order.

    A recorded execution spans from when the host handed the program to the chip until it finished,
    so a program queued behind another overlaps it. A chip runs one program at a time, so here each
    execution starts when the one before it on the same chip ended. Rows come sorted by chip and
    start as `(chip, program_id, start_ns, dur_ns, step, flush_id)`; each leaves with the ns it queued.
    """
    previous_chip, previous_end = None, 0
    for chip_index, program_id, start_ns, dur_ns, step, flush_id in rows:
        if chip_index != previous_chip:
            previous_chip, previous_end = chip_index, start_ns
        begin_ns = max(start_ns, previous_end)
        end_ns = max(start_ns + (dur_ns or 0), begin_ns)
        previous_end = end_ns
        yield (chip_index, program_id, begin_ns, end_ns - begin_ns, step, flush_id, begin_ns - start_ns)


def _strict_runs(tables: TraceTables, batches: Iterable[OpBatch], on_ops: Callable[[OpBatch], None] | None) -> Iterator[ProgramRun]:
    previous_end: dict[int, int] = {}
    for rows in batches:
        if on_ops is not None:
            on_ops(rows)
        for row in rows:
            program_id, chip_index = row[PROGRAM], row[CHIP]
            if program_id is None or chip_index is None or chip_index < 0:
                continue
            start_ns = row[START]
            begin_ns = max(start_ns, previous_end.get(chip_index, start_ns))
            end_ns = previous_end[chip_index] = max(start_ns + (row[DUR] or 0), begin_ns)
            program = tables.programs.get(program_id)
            cost = tables.cost(row[OP], row[INPUTS], row[OUTPUTS])
            flops = program.flops if program is not None and program.flops is not None else cost.flops
            total_bytes = program.bytes_accessed if program is not None and program.bytes_accessed is not None else cost.bytes_accessed
            read_share = cost.read_bytes / cost.bytes_accessed if cost.bytes_accessed else 0.5
            run = ProgramRun(chip_index, program_id, begin_ns, end_ns - begin_ns, row[STEP], row[FLUSH],
                             queued_ns=begin_ns - start_ns, estimated=False)
            run.op_keys.append((program_id, 0, row[OP], row[INPUTS], row[OUTPUTS], row[MODULE], row[FRAME], None))
            run.op_starts_ns.append(float(begin_ns))
            run.op_durs_ns.append(float(end_ns - begin_ns))
            run.op_flops.append(flops)
            run.op_read_bytes.append(total_bytes * read_share)
            run.op_write_bytes.append(total_bytes * (1 - read_share))
            run.op_seqs.append(row[SEQ])
            yield run


def _run_with_ops(tables: TraceTables, chip: TargetChip, execution: tuple[Any, ...], rows: OpBatch) -> ProgramRun:
    chip_index, program_id, start_ns, dur_ns, step, flush_id, queued_ns = execution
    run = ProgramRun(chip_index, program_id, start_ns, dur_ns, step, flush_id, queued_ns)
    _place(run, tables.ops_layout(chip, program_id, rows))
    run.op_seqs = list(map(_SEQ_OF, rows))
    return run


def _run_with_fusions(tables: TraceTables, chip: TargetChip, execution: tuple[Any, ...]) -> ProgramRun:
    chip_index, program_id, start_ns, dur_ns, step, flush_id, queued_ns = execution
    run = ProgramRun(chip_index, program_id, start_ns, dur_ns, step, flush_id, queued_ns)
    _place(run, tables.fusions_layout(chip, program_id))
    run.op_seqs = [None] * len(run.op_keys)
    return run


def _make_layout(layout_id: int, op_keys: list[tuple[Any, ...]], program: ProgramInfo | None, chip: TargetChip,
                 costs: list[OpCost]) -> _Layout:
    """Share the program's XLA FLOPs and bytes among its ops by their estimates, and time each op by
    its roofline on the target chip."""
    count = len(costs)
    flops_estimates, read_estimates, write_estimates, wide_floats = zip(*costs)
    flops_estimate = sum(flops_estimates)
    bytes_estimate = sum(read_estimates) + sum(write_estimates)
    program_flops = program.flops if program is not None and program.flops is not None else flops_estimate
    program_bytes = program.bytes_accessed if program is not None and program.bytes_accessed is not None else bytes_estimate
    if flops_estimate:
        scale = program_flops / flops_estimate
        flops = [value * scale for value in flops_estimates]
    else:
        flops = [program_flops / count] * count
    if bytes_estimate:
        scale = program_bytes / bytes_estimate
        read_bytes = [value * scale for value in read_estimates]
        write_bytes = [value * scale for value in write_estimates]
    else:
        read_bytes = write_bytes = [program_bytes / count / 2] * count
    ns_per_flop, ns_per_wide_flop = 1.0 / chip.peak_flops_per_ns, 1.0 / chip.fp32_peak_flops_per_ns
    ns_per_byte = 1.0 / chip.hbm_bytes_per_ns
    compute_ns = [value * (ns_per_wide_flop if wide else ns_per_flop) for value, wide in zip(flops, wide_floats)]
    memory_ns = [(read + write) * ns_per_byte for read, write in zip(read_bytes, write_bytes)]
    roofline_ns = [compute if compute > memory else memory for compute, memory in zip(compute_ns, memory_ns)]
    return _Layout(layout_id, op_keys, flops, read_bytes, write_bytes, roofline_ns, sum(roofline_ns))


def _place(run: ProgramRun, layout: _Layout) -> None:
    """The run's ops as `layout` says, with its measured time shared out by their roofline times;
    the ops follow each other in program order."""
    roofline_ns, total_ns = layout.roofline_ns, layout.total_ns
    if total_ns:
        scale = run.dur_ns / total_ns
        durations = [value * scale for value in roofline_ns]
    else:
        durations = [run.dur_ns / len(roofline_ns)] * len(roofline_ns)
    starts = list(accumulate(durations, initial=float(run.start_ns)))
    starts.pop()
    run.layout = layout.id
    run.op_keys, run.op_starts_ns, run.op_durs_ns = layout.op_keys, starts, durations
    run.op_flops, run.op_read_bytes, run.op_write_bytes = layout.op_flops, layout.op_read_bytes, layout.op_write_bytes


def scan_rank(tables: TraceTables, rank: int, chip: TargetChip, on_run: Callable[[ProgramRun], None],
              on_ops: Callable[[OpBatch], None], restart: Callable[[], None]) -> None:
    """Feed every run of `rank` to `on_run` and every op row to `on_ops` (in batches), reading the ops
    once when the trace allows; otherwise `restart()` drops what was fed and both are fed again from
    two reads."""
    try:
        for run in device_runs(tables, rank, chip, on_ops=on_ops):
            on_run(run)
    except FlushesInterleaved:
        restart()
        for run in device_runs(tables, rank, chip, sorted_by_flush=True):
            on_run(run)
        for rows in _op_batches(tables.trace, rank):
            on_ops(rows)


def is_strict(trace: Trace, rank: int) -> bool:
    """Whether `rank` ran in strict mode: each op its own program, no `executions` rows."""
    return not trace.sql("SELECT 1 FROM executions WHERE rank = ? LIMIT 1", (rank,))


# -- XSpace building --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ref:
    """A string stat stored once in the plane's stat metadata and referred to by id (`ref_value`):
    for a long string that many events or metadata repeat."""

    text: str


Stats = Sequence[tuple[str, Any]]


class _PlaneBuilder:
    """One XPlane: its name, plane stats and metadata (interned: stats by name, events by key) live in
    a protobuf message; its lines are `_Line`s, written after it by `serialize`."""

    def __init__(self, plane: Any, plane_id: int, name: str) -> None:
        self.plane = plane
        plane.id = plane_id
        plane.name = name
        self._stat_ids: dict[str, int] = {}
        self._event_ids: dict[Any, int] = {}
        self._event_metadata: list[bytes] = []  # encoded map entries, written after the plane message
        # Encoded stats of metadata: the `metadata_id` field of each stat name, and whole stats whose
        # value (a string, mostly) many metadata repeat.
        self._stat_heads: dict[str, bytes] = {}
        self._encoded_stats: dict[tuple[str, type, Any], bytes] = {}
        # An op's name and encoded stats besides its costs (see `_add_op_metadata`), by what identifies it.
        self.op_descriptions: dict[tuple[Any, ...], tuple[str, list[bytes]]] = {}
        self.lines: list[_Line] = []

    def stat_id(self, name: str) -> int:
        stat_id = self._stat_ids.get(name)
        if stat_id is None:
            stat_id = self._stat_ids[name] = len(self._stat_ids) + 1
            metadata = self.plane.stat_metadata[stat_id]
            metadata.id = stat_id
            metadata.name = name
        return stat_id

    def add_stats(self, container: Any, stats: Stats) -> None:
        for name, value in stats:
            if value is None:
                continue
            stat = container.add(metadata_id=self.stat_id(name))
            kind = type(value)
            if kind is str:
                stat.str_value = value
            elif kind is int:
                if value >= 1 << 63:
                    stat.uint64_value = value
                else:
                    stat.int64_value = value
            elif kind is float:
                stat.double_value = value
            elif kind is bool:
                stat.int64_value = int(value)
            elif kind is bytes:
                stat.bytes_value = value
            elif kind is Ref:
                stat.ref_value = self.stat_id(value.text)
            else:
                stat.str_value = str(value)

    @property
    def event_ids(self) -> dict[Any, int]:
        """Event metadata ids by key (read-only use: add through `add_event_metadata`)."""
        return self._event_ids

    def add_event_metadata(self, key: Any, name: str, stats: Stats = ()) -> int:
        """The id of the event metadata for `key`, created with `name` and `stats` the first time."""
        metadata_id = self._event_ids.get(key)
        if metadata_id is not None:
            return metadata_id
        return self.add_encoded_metadata(key, name, self.encode_stats(stats))

    def add_encoded_metadata(self, key: Any, name: str, encoded_stats: list[bytes]) -> int:
        """The id of new event metadata for `key` (not added before), with stats from `encode_stats`."""
        metadata_id = self._event_ids[key] = len(self._event_ids) + 1
        self._event_metadata.append(xplane_proto.encode_event_metadata_entry(metadata_id, name, encoded_stats))
        return metadata_id

    def encode_stats(self, stats: Stats) -> list[bytes]:
        """`stats` (None values left out) as XStat messages of this plane."""
        encoded = []
        cache, varint = self._encoded_stats, xplane_proto.encode_varint
        for stat, value in stats:
            if value is None:
                continue
            kind = type(value)
            if kind is int and 0 <= value < 1 << 63:
                # int64_value (field 4): most stats are counts, each different.
                encoded.append(self._stat_head(stat) + b"\x20" + varint(value))
                continue
            cache_key = (stat, kind, value)
            stat_bytes = cache.get(cache_key)
            if stat_bytes is None:
                stat_bytes = xplane_proto.encode_stat(self.stat_id(stat), value, self.stat_id(value.text) if kind is Ref else None)
                if kind is str or kind is Ref or kind is bool:
                    cache[cache_key] = stat_bytes
            encoded.append(stat_bytes)
        return encoded

    def _stat_head(self, name: str) -> bytes:
        """An XStat's `metadata_id` field for stat `name`, which every stat of that name starts with."""
        head = self._stat_heads.get(name)
        if head is None:
            head = self._stat_heads[name] = b"\x08" + xplane_proto.encode_varint(self.stat_id(name))
        return head

    def add_line(self, name: str) -> _Line:
        line = _Line(name)
        self.lines.append(line)
        return line

    def serialize(self, timestamp_ns: int, *, keep_empty_lines: bool) -> list[bytes]:
        """The plane's bytes, in pieces: its message, then each line as a `lines` field."""
        pieces = [self.plane.SerializeToString(), *self._event_metadata]
        line_id = 0
        for line in self.lines:
            if len(line) or keep_empty_lines:
                line_id += 1
                line_pieces = line.serialize(self, line_id, timestamp_ns)
                pieces.append(xplane_proto.length_delimited(xplane_proto.XPLANE_LINES_FIELD, sum(map(len, line_pieces))))
                pieces.extend(line_pieces)
        return pieces


class _Line:
    """One XLine's events, gathered in any order and written sorted by start: XProf walks each line in
    time order (to nest ops in programs and programs in steps) and gets them wrong when it is not.
    Times are ps from the line's timestamp; events may carry stats."""

    __slots__ = ("name", "metadata_ids", "offsets_ps", "durations_ps", "stats")

    def __init__(self, name: str) -> None:
        self.name = name
        self.clear()

    def clear(self) -> None:
        self.metadata_ids = array("q")
        self.offsets_ps = array("q")
        self.durations_ps = array("q")
        self.stats: dict[int, Stats] = {}

    def __len__(self) -> int:
        return len(self.offsets_ps)

    def add(self, metadata_id: int, offset_ps: int, duration_ps: int, stats: Stats | None = None) -> None:
        if stats:
            self.stats[len(self.offsets_ps)] = stats
        self.metadata_ids.append(metadata_id)
        self.offsets_ps.append(offset_ps)
        self.durations_ps.append(duration_ps if duration_ps > 0 else 0)

    def _order(self) -> Sequence[int] | None:
        """The event indexes sorted by start (longer first among equal starts, so that an enclosing
        event precedes what it encloses), or None when the events already are in start order."""
        offsets, durations = self.offsets_ps, self.durations_ps
        try:
            import numpy
        except ImportError:
            if all(map(int.__le__, offsets[:-1], offsets[1:])):
                return None
            return sorted(range(len(offsets)), key=lambda index: (offsets[index], -durations[index]))
        starts = numpy.frombuffer(offsets, dtype=numpy.int64)
        if len(starts) < 2 or bool((starts[1:] >= starts[:-1]).all()):
            return None
        return numpy.lexsort((-numpy.frombuffer(durations, dtype=numpy.int64), starts)).tolist()

    def serialize(self, builder: _PlaneBuilder, line_id: int, timestamp_ns: int) -> list[bytes]:
        """The line's bytes, in pieces: its header fields, then its events (in start order)."""
        messages = xplane_proto.messages()
        offsets, durations, metadata_ids = self.offsets_ps, self.durations_ps, self.metadata_ids
        header = messages["XLine"](id=line_id, display_id=line_id, name=self.name, timestamp_ns=timestamp_ns,
                                   duration_ps=_line_end_ps(offsets, durations))
        order = self._order()
        if not self.stats:
            if order is not None:
                metadata_ids = array("q", (metadata_ids[index] for index in order))
                offsets = array("q", (offsets[index] for index in order))
                durations = array("q", (durations[index] for index in order))
            encoded = xplane_proto.encode_events(metadata_ids, offsets, durations)
            if encoded is not None:
                return [header.SerializeToString(), encoded]
        # XEvent{metadata_id = 1, offset_ps = 2, duration_ps = 3, stats = 4}, written field by field.
        varint, stats = xplane_proto.encode_varint, self.stats
        pieces = [header.SerializeToString()]
        for index in order if order is not None else range(len(offsets)):
            duration = durations[index]
            event = b"\x08" + varint(metadata_ids[index]) + b"\x10" + varint(offsets[index])
            if duration:
                event += b"\x18" + varint(duration)
            event_stats = stats.get(index)
            if event_stats:
                event += b"".join([b"\x22" + varint(len(stat)) + stat for stat in builder.encode_stats(event_stats)])
            pieces.append(b"\x22" + varint(len(event)) + event)
        return pieces


def _line_end_ps(offsets: array[int], durations: array[int]) -> int:
    """When a line's last event ends (0 for none)."""
    if not offsets:
        return 0
    try:
        import numpy
    except ImportError:
        return max(map(int.__add__, offsets, durations))
    return int((numpy.frombuffer(offsets, dtype=numpy.int64) + numpy.frombuffer(durations, dtype=numpy.int64)).max())


def _count(value: float | None) -> int | None:
    return None if value is None else int(value + 0.5)


@dataclass(frozen=True)
class RankExport:
    """What one host file holds: the rank, its host name (the file stem), its path and event counts."""

    rank: int
    host: str
    path: Path
    device_events: int
    host_events: int


class _DevicePlanes:
    """The `/device:TPU:<n>` planes of one rank: Steps, XLA Modules and XLA Ops lines per chip."""

    def __init__(self, space: Any, tables: TraceTables, chips: Sequence[int], chip: TargetChip) -> None:
        self.tables = tables
        self.builders: dict[int, _PlaneBuilder] = {}
        self.lines: dict[int, tuple[_Line, _Line, _Line]] = {}
        self._layout_metadata: dict[tuple[int, int], list[int]] = {}  # (chip, layout) -> its ops' metadata ids
        for chip_index in chips:
            builder = self.builders[chip_index] = _PlaneBuilder(space.planes.add(), chip_index, f"{DEVICE_PLANE_PREFIX}{chip_index}")
            builder.add_stats(builder.plane.stats, (
                ("device_type_string", chip.device_type),
                ("peak_teraflops_per_second", chip.peak_teraflops_per_second),
                ("peak_hbm_bw_gigabytes_per_second", chip.hbm_gigabytes_per_second),
                ("device_capacity_bytes", chip.hbm_bytes),
                ("target_chip", f"{chip.name}: peaks of the target chip ({chip.source}); times as recorded"),
            ))
            self.lines[chip_index] = (builder.add_line("Steps"), builder.add_line("XLA Modules"), builder.add_line("XLA Ops"))

    @property
    def event_count(self) -> int:
        return sum(len(line) for lines in self.lines.values() for line in lines)

    def clear(self) -> None:
        for lines in self.lines.values():
            for line in lines:
                line.clear()

    def add_run(self, run: ProgramRun) -> None:
        chip_index = run.chip if run.chip in self.builders else min(self.builders)
        builder = self.builders[chip_index]
        _, modules, ops = self.lines[chip_index]
        module_key = ("program", run.program_id)
        module_metadata = builder.event_ids.get(module_key)
        if module_metadata is None:
            program = self.tables.programs.get(run.program_id)
            module_metadata = builder.add_event_metadata(module_key, f"{self.tables.program_name(run.program_id)}({run.program_id})", (
                ("program_id", run.program_id),
                ("program_kind", program.kind if program else None),
                ("flops", _count(program.flops) if program else None),
                ("bytes_accessed", _count(program.bytes_accessed) if program else None),
                ("hlo_ops", program.hlo_ops if program else None),
                ("aten_ops", program.n_ops if program else None),
                ("signature", program.signature if program else None),
            ))
        modules.add(module_metadata, run.start_ns * _PS_PER_NS, run.dur_ns * _PS_PER_NS, (
            ("group_id", run.step if run.step is not None else 0),
            ("run_id", run.flush_id),
            ("flush_id", run.flush_id),
            ("queued_behind_previous_ns", run.queued_ns or None),
        ))
        layout_key = (chip_index, run.layout)
        metadata_ids = self._layout_metadata.get(layout_key) if run.layout is not None else None
        if metadata_ids is None:
            event_ids = builder.event_ids
            metadata_ids = [event_ids.get(key) for key in run.op_keys]  # type: ignore[misc]
            if None in metadata_ids:
                for index, key in enumerate(run.op_keys):
                    if metadata_ids[index] is None:
                        metadata_ids[index] = _add_op_metadata(builder, self.tables, run, index)
            if run.layout is not None:
                self._layout_metadata[layout_key] = metadata_ids
        ops.metadata_ids.extend(metadata_ids)
        ops.offsets_ps.extend([int(start * _PS_PER_NS + 0.5) for start in run.op_starts_ns])
        ops.durations_ps.extend([int(duration * _PS_PER_NS + 0.5) for duration in run.op_durs_ns])

    def add_steps(self, steps: Iterable[tuple[int, int, int | None]]) -> None:
        for step, start_ns, end_ns in steps:
            if end_ns is None:
                continue
            for chip_index, builder in self.builders.items():
                metadata_id = builder.add_event_metadata(("step", step), str(step))
                self.lines[chip_index][0].add(metadata_id, start_ns * _PS_PER_NS, max(end_ns - start_ns, 0) * _PS_PER_NS,
                                              (("group_id", step), ("step_num", step)))

    def serialize(self, timestamp_ns: int) -> list[list[bytes]]:
        return [builder.serialize(timestamp_ns, keep_empty_lines=True) for builder in self.builders.values()]


def _add_op_metadata(builder: _PlaneBuilder, tables: TraceTables, run: ProgramRun, index: int) -> int:
    """The event metadata of op `index` of `run`: XProf reads an op's properties from here."""
    key = OpKey._make(run.op_keys[index])
    symbol_id = len(builder.event_ids) + 1
    flops, read_bytes, write_bytes = run.op_flops[index], run.op_read_bytes[index], run.op_write_bytes[index]
    costs: list[tuple[str, Any]] = [
        ("program_id", key.program_id),
        ("symbol_id", symbol_id),
        ("flops", _count(flops)),
        ("bytes_accessed", _count(read_bytes + write_bytes)),
        ("memory_access_breakdown", _breakdown(read_bytes, write_bytes)),
    ]
    if key.fusion is not None:
        fusions = tables.fusions.get(key.program_id, [])
        fusion = fusions[key.fusion] if 0 <= key.fusion < len(fusions) else None
        name = fusion.name if fusion else tables.program_name(key.program_id)
        aten = fusion.aten_ops[0] if fusion and fusion.aten_ops else None
        return builder.add_event_metadata(tuple(key), name, (
            *costs,
            ("hlo_category", _FUSION_CATEGORIES.get(fusion.kind or "", "non-fusion elementwise") if fusion else "unknown"),
            ("tf_op", framework_op(aten, None) if aten else None),
            ("long_name", f"{name}: {fusion.kind} fusion of {fusion.hlo_ops}" if fusion else name),
            ("aten_ops", ", ".join(fusion.aten_ops) if fusion else None),
            ("time_estimate", Ref(TIME_ESTIMATE_NOTE)),
        ))
    cost_stats = builder.encode_stats(costs)
    # What an op's metadata says besides its costs is the same at every position of the op in the
    # program (and in every program with the same ops): encoded once per plane.
    described = (key.program_id, key.op_sid, key.inputs_sid, key.outputs_sid, key.module_sid, key.frame_id, run.estimated)
    description = builder.op_descriptions.get(described)
    if description is None:
        description = builder.op_descriptions[described] = _describe_op(builder, tables, key, run.estimated)
    op_name, described_stats = description
    name = f"{op_name}.{key.position}" if run.estimated else op_name
    return builder.add_encoded_metadata(tuple(key), name, cost_stats + described_stats)


def _describe_op(builder: _PlaneBuilder, tables: TraceTables, key: OpKey, estimated: bool) -> tuple[str, list[bytes]]:
    """An ATen op's name and its metadata stats other than its costs, encoded for `builder`'s plane."""
    text = tables.text
    op_name = text(key.op_sid) or "op"
    module = text(key.module_sid)
    inputs, outputs = text(key.inputs_sid), text(key.outputs_sid)
    fusion = tables.fusion_of(key.program_id, op_name)
    return op_name, builder.encode_stats((
        ("hlo_category", hlo_category(op_name, fusion.kind if fusion else None)),
        ("tf_op", framework_op(op_name, module)),
        ("source", tables.source(key.frame_id)),
        ("long_name", f"{op_name}({inputs or ''}) -> {outputs or ''}"),
        ("xla_fusion", f"{fusion.name} ({fusion.kind})" if fusion else None),
        ("time_estimate", Ref(TIME_ESTIMATE_NOTE) if estimated else None),
    ))


def _breakdown(read_bytes: float, write_bytes: float) -> bytes | None:
    if read_bytes + write_bytes <= 0:
        return None
    return xplane_proto.memory_access_breakdown(int(read_bytes + 0.5), int(write_bytes + 0.5))


class _HostPlane:
    """The `/host:CPU` plane of one rank: one line per kind of host activity."""

    LINE_NAMES = ("Steps", "Annotations", "Python dispatch", "Flushes", "XLA Compile", "Syncs", "Transfers",
                  "CPU fallbacks", "Collectives", "Graph breaks")

    def __init__(self, space: Any, tables: TraceTables, plane_id: int) -> None:
        self.tables = tables
        self.builder = _PlaneBuilder(space.planes.add(), plane_id, HOST_PLANE)
        self.lines = {name: self.builder.add_line(name) for name in self.LINE_NAMES}
        self.dispatch = self.lines["Python dispatch"]
        self._dispatch_metadata: dict[tuple[Any, ...], int] = {}

    @property
    def event_count(self) -> int:
        return sum(len(line) for line in self.lines.values())

    def add_dispatches(self, rows: OpBatch) -> None:
        """Ops' dispatch on the host (`ops` rows); each op's event metadata holds shapes, module and line."""
        keys = list(map(DISPATCH_KEY, rows))
        metadata = self._dispatch_metadata
        metadata_ids = list(map(metadata.get, keys))
        if None in metadata_ids:
            for index, metadata_id in enumerate(metadata_ids):
                if metadata_id is None:
                    metadata_ids[index] = self._dispatch_metadata_id(keys[index])
        dispatch = self.dispatch
        dispatch.metadata_ids.extend(metadata_ids)  # type: ignore[arg-type]
        dispatch.offsets_ps.extend([row[START] * _PS_PER_NS for row in rows])
        dispatch.durations_ps.extend([dur * _PS_PER_NS if dur and dur > 0 else 0 for dur in map(_DUR_OF, rows)])

    def _dispatch_metadata_id(self, key: tuple[Any, ...]) -> int:
        metadata_id = self._dispatch_metadata.get(key)
        if metadata_id is None:
            op_sid, inputs_sid, outputs_sid, frame_id, module_sid = key
            text = self.tables.text
            metadata_id = self._dispatch_metadata[key] = self.builder.add_event_metadata(("dispatch", *key), text(op_sid) or "op", (
                ("inputs", text(inputs_sid)), ("outputs", text(outputs_sid)), ("module", text(module_sid)),
                ("source", self.tables.source(frame_id)),
            ))
        return metadata_id

    def clear_dispatch(self) -> None:
        self.dispatch.clear()

    def add(self, line: str, key: Any, name: str, start_ns: int, dur_ns: int | None,
            metadata_stats: Stats = (), event_stats: Stats | None = None) -> None:
        metadata_id = self.builder.add_event_metadata(key, name, metadata_stats)
        self.lines[line].add(metadata_id, start_ns * _PS_PER_NS, (dur_ns or 0) * _PS_PER_NS, event_stats)

    def add_records(self, rank: int) -> None:
        """Everything on the host but op dispatch, from the rank's rows."""
        trace, text, source, add = self.tables.trace, self.tables.text, self.tables.source, self.add
        # No root (`_r`) stat on host steps: the device Steps lines define the steps for XProf.
        for step, start_ns, end_ns, origin in trace.sql(
            "SELECT step, start_ns, end_ns, source FROM steps WHERE rank = ? ORDER BY step", (rank,)
        ):
            add("Steps", ("host step", step), f"step {step}", start_ns, (end_ns - start_ns) if end_ns is not None else 0,
                (("marked_by", origin),), (("step_num", step),))
        for name_sid, origin, start_ns, dur_ns, frame_id, step in trace.sql(
            "SELECT name_sid, source, start_ns, dur_ns, frame_id, step FROM annotations WHERE rank = ? "
            "ORDER BY start_ns, dur_ns DESC", (rank,)
        ):
            add("Annotations", ("annotation", name_sid, origin, frame_id), text(name_sid) or "range", start_ns, dur_ns,
                (("origin", origin), ("source", source(frame_id))), (("step", step),))
        for flush_id, program_id, trigger, frame_id, n_ops, cache_hit, chip_index, start_ns, dur_ns, input_bytes, output_bytes, step in trace.sql(
            "SELECT id, program_id, trigger, frame_id, n_ops, cache_hit, chip, start_ns, dur_ns, input_bytes, output_bytes, step "
            "FROM flushes WHERE rank = ?", (rank,)
        ):
            add("Flushes", ("flush", trigger, frame_id, program_id), f"flush ({trigger})", start_ns, dur_ns, (
                ("trigger", trigger), ("source", source(frame_id)), ("program_id", program_id),
                ("program", self.tables.program_name(program_id) if program_id is not None else None),
            ), (
                ("flush_id", flush_id), ("ops", n_ops), ("cache_hit", bool(cache_hit)), ("chip", chip_index),
                ("input_bytes", input_bytes), ("output_bytes", output_bytes), ("step", step),
            ))
        for compile_id, program_id, kind, name_sid, signature_sid, chip_index, start_ns, dur_ns, frame_id, step, reason, diff_sid, detail in trace.sql(
            "SELECT id, program_id, kind, name_sid, signature_sid, chip, start_ns, dur_ns, frame_id, step, reason, diff_sid, detail "
            "FROM compiles WHERE rank = ?", (rank,)
        ):
            add("XLA Compile", ("compile", compile_id), f"compile {text(name_sid) or kind or ''}".strip(), start_ns, dur_ns, (
                ("reason", reason), ("what_changed", text(diff_sid)), ("kind", kind), ("signature", text(signature_sid)),
                ("source", source(frame_id)), ("program_id", program_id), ("chip", chip_index), ("step", step),
                ("detail", detail),
            ))
        for kind, frame_id, chip_index, start_ns, dur_ns, pending_ops, step in trace.sql(
            "SELECT kind, frame_id, chip, start_ns, dur_ns, pending_ops, step FROM syncs WHERE rank = ?", (rank,)
        ):
            add("Syncs", ("sync", kind, frame_id), f"sync ({kind})", start_ns, dur_ns,
                (("kind", kind), ("source", source(frame_id))),
                (("pending_ops", pending_ops), ("chip", chip_index), ("step", step)))
        for direction, nbytes, src_chip, dst_chip, start_ns, dur_ns, frame_id, step in trace.sql(
            "SELECT direction, bytes, src_chip, dst_chip, start_ns, dur_ns, frame_id, step FROM transfers WHERE rank = ?", (rank,)
        ):
            add("Transfers", ("transfer", direction, frame_id, src_chip, dst_chip), f"transfer {direction}", start_ns, dur_ns,
                (("direction", direction), ("source", source(frame_id)), ("src_chip", src_chip), ("dst_chip", dst_chip)),
                (("bytes", nbytes), ("step", step)))
        for op_sid, inputs_sid, chip_index, start_ns, dur_ns, frame_id, step in trace.sql(
            "SELECT op_sid, inputs_sid, chip, start_ns, dur_ns, frame_id, step FROM fallbacks WHERE rank = ?", (rank,)
        ):
            add("CPU fallbacks", ("fallback", op_sid, inputs_sid, frame_id), f"{text(op_sid) or 'op'} (CPU fallback)",
                start_ns, dur_ns, (("aten_op", text(op_sid)), ("inputs", text(inputs_sid)), ("source", source(frame_id))),
                (("chip", chip_index), ("step", step)))
        for kind, nbytes, dtype, group_sid, ranks_sid, frame_id, start_ns, dur_ns, wait_ns, algorithm, bus_bandwidth, step in trace.sql(
            "SELECT kind, bytes, dtype, group_sid, ranks_sid, frame_id, start_ns, dur_ns, wait_ns, algorithm, bus_bandwidth, step "
            "FROM collectives WHERE rank = ?", (rank,)
        ):
            add("Collectives", ("collective", kind, group_sid, ranks_sid, frame_id, dtype, algorithm), kind or "collective",
                start_ns, dur_ns,
                (("kind", kind), ("group", text(group_sid)), ("ranks", text(ranks_sid)), ("source", source(frame_id)),
                 ("dtype", dtype), ("algorithm", algorithm)),
                (("bytes", nbytes), ("wait_ns", wait_ns), ("bus_bandwidth_bytes_per_second", bus_bandwidth), ("step", step)))
        for reason_sid, frame_id, t_ns, step in trace.sql(
            "SELECT reason_sid, frame_id, t_ns, step FROM graph_breaks WHERE rank = ?", (rank,)
        ):
            add("Graph breaks", ("graph break", reason_sid, frame_id), "graph break", t_ns, 0,
                (("reason", text(reason_sid)), ("source", source(frame_id))), (("step", step),))

    def serialize(self, timestamp_ns: int) -> list[bytes]:
        return self.builder.serialize(timestamp_ns, keep_empty_lines=False)


def build_xspace(tables: TraceTables, rank: int, chip: TargetChip, host: str) -> tuple[list[bytes], int, int]:
    """The serialized XSpace of one rank (in pieces, to be written in order), and its device and host
    event counts."""
    trace = tables.trace
    space = xplane_proto.messages()["XSpace"]()
    space.hostnames.append(host)
    run_rows = trace.sql("SELECT start_unix_ns, chips FROM runs WHERE rank = ?", (rank,))
    start_unix_ns = run_rows[0][0] if run_rows and run_rows[0][0] is not None else 0
    chip_count = run_rows[0][1] if run_rows and run_rows[0][1] else 0
    used = trace.sql(
        "SELECT DISTINCT chip FROM executions WHERE rank = ? UNION SELECT DISTINCT chip FROM ops WHERE rank = ? AND chip >= 0",
        (rank, rank),
    )
    chips = sorted(set(range(chip_count)) | {max(row[0], 0) for row in used if row[0] is not None}) or [0]
    device = _DevicePlanes(space, tables, chips, chip)
    host_plane = _HostPlane(space, tables, max(chips) + 1)

    def restart() -> None:
        device.clear()
        host_plane.clear_dispatch()

    scan_rank(tables, rank, chip, device.add_run, host_plane.add_dispatches, restart)
    # The device Steps line is what XProf's step-time figures count: the loop's steps, without the `end`
    # step (the work after the last optimizer step) unless the run has no other.
    device.add_steps(trace.sql(
        "SELECT step, start_ns, end_ns FROM steps WHERE rank = ? AND (source IS NOT 'end' OR NOT EXISTS "
        "(SELECT 1 FROM steps WHERE rank = ? AND source IS NOT 'end')) ORDER BY step", (rank, rank),
    ))
    host_plane.add_records(rank)
    device_events, host_events = device.event_count, host_plane.event_count
    planes = [*device.serialize(start_unix_ns), host_plane.serialize(start_unix_ns)]
    # The planes were added to `space` only to create them; they are written from their pieces.
    del space.planes[:]
    pieces = [space.SerializeToString()]
    for plane_pieces in planes:
        pieces.append(xplane_proto.length_delimited(xplane_proto.XSPACE_PLANES_FIELD, sum(map(len, plane_pieces))))
        pieces.extend(plane_pieces)
    return pieces, device_events, host_events


# -- files ------------------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str, fallback: str) -> str:
    """`text` as a file or folder name: only letters, digits, `_`, `-` and `.`; never empty or dotted-only."""
    cleaned = _UNSAFE.sub("_", text).strip("._")
    return cleaned or fallback


def host_names(trace: Trace) -> dict[int, str]:
    """The file stem of each rank's host file: the run's host name when every rank has its own, else
    `<host>-rank<N>` (or `rank<N>`)."""
    rows = trace.sql("SELECT rank, host FROM runs ORDER BY rank")
    if not rows:
        return {rank: f"rank{rank}" for rank in trace.ranks}
    hosts = [host for _, host in rows]
    distinct = all(hosts) and len(set(hosts)) == len(hosts)
    names = {}
    for rank, host in rows:
        if distinct:
            names[rank] = safe_name(host, f"rank{rank}")
        else:
            names[rank] = safe_name(f"{host}-rank{rank}" if host else f"rank{rank}", f"rank{rank}")
    return names


def default_run_name(trace: Trace) -> str:
    return safe_name(trace.path.stem, "tputrace")


def export_tensorboard(trace: Trace, logdir: str | Path, *, run: str | None = None, target: str = DEFAULT_TARGET) -> list[RankExport]:
    """Write `<logdir>/plugins/profile/<run>/<host>.xplane.pb` for every rank and return what was written."""
    chip = target_chip(target)
    run_name = safe_name(run, "run") if run else default_run_name(trace)
    run_dir = Path(logdir) / "plugins" / "profile" / run_name
    new_folders = _missing_folders(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    exports: list[RankExport] = []
    try:
        tables = TraceTables(trace)
        for rank, host in host_names(trace).items():
            pieces, device_events, host_events = build_xspace(tables, rank, chip, host)
            path = run_dir / f"{host}.xplane.pb"
            temporary = path.with_name(path.name + ".partial")
            try:
                with temporary.open("wb") as file:
                    file.writelines(pieces)
                temporary.replace(path)
            finally:
                temporary.unlink(missing_ok=True)
            exports.append(RankExport(rank, host, path, device_events, host_events))
    except BaseException:
        _undo_export(exports, new_folders)
        raise
    return exports


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and those above it that do not exist yet, deepest first."""
    missing = []
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    return missing


def _undo_export(exports: list[RankExport], new_folders: list[Path]) -> None:
    """After a failed export: remove the ranks' files it wrote and the folders it made, so that a
    logdir does not show TensorBoard a run with some ranks or none."""
    for export in exports:
        export.path.unlink(missing_ok=True)
    for folder in new_folders:
        try:
            folder.rmdir()
        except OSError:
            break
