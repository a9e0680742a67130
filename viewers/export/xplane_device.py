"""The `/device:TPU:<n>` planes of an XProf file: Steps, XLA Modules and XLA Ops lines per chip.

An op's properties (`hlo_category`, `tf_op`, `source` as `file:line`, `flops`, `bytes_accessed`,
`memory_access_breakdown`) are stats of its event metadata, where XProf reads them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from tputrace.derived.device_runs import OpKey, ProgramRun
from tputrace.derived.op_cost import ATTENTION_MARK, MATMUL_OPS, TIME_ESTIMATE_NOTE, TargetChip, aten_base_name
from tputrace.derived.trace_tables import TraceTables, remember
from tputrace import xplane_proto
from tputrace.viewers.export.xplane_builder import PS_PER_NS, Line, PlaneBuilder, Ref

DEVICE_PLANE_PREFIX = "/device:TPU:"
MAX_CACHED_DESCRIPTIONS = 2048

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
    if base in MATMUL_OPS:
        return "matmul"
    if ATTENTION_MARK in base:
        return "attention"
    if base in _DATA_FORMATTING_OPS or base.removesuffix("_") in _DATA_FORMATTING_OPS:
        return "data formatting"
    if fusion_kind in _FUSION_CATEGORIES:
        return _FUSION_CATEGORIES[fusion_kind]
    if base in _REDUCE_OPS:
        return "reduce"
    return "non-fusion elementwise"


def _count(value: float | None) -> int | None:
    return None if value is None else int(value + 0.5)



class DevicePlanes:
    """The `/device:TPU:<n>` planes of one rank: Steps, XLA Modules and XLA Ops lines per chip."""

    def __init__(self, tables: TraceTables, chips: Sequence[int], chip: TargetChip, spill_folder: Path) -> None:
        self.tables = tables
        self.builders: dict[int, PlaneBuilder] = {}
        self.lines: dict[int, tuple[Line, Line, Line]] = {}
        self._layout_metadata: dict[tuple[int, int], list[int]] = {}  # (chip, layout) -> its ops' metadata ids
        for chip_index in chips:
            builder = self.builders[chip_index] = PlaneBuilder(chip_index, f"{DEVICE_PLANE_PREFIX}{chip_index}", spill_folder)
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
        modules.add(module_metadata, run.start_ns * PS_PER_NS, run.dur_ns * PS_PER_NS, (
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
                remember(self._layout_metadata, layout_key, metadata_ids)
        ops.extend(metadata_ids, [int(start * PS_PER_NS + 0.5) for start in run.op_starts_ns],
                   [int(duration * PS_PER_NS + 0.5) for duration in run.op_durs_ns])

    def add_steps(self, steps: Iterable[tuple[int, int, int | None]]) -> None:
        for step, start_ns, end_ns in steps:
            if end_ns is None:
                continue
            for chip_index, builder in self.builders.items():
                metadata_id = builder.add_event_metadata(("step", step), str(step))
                self.lines[chip_index][0].add(metadata_id, start_ns * PS_PER_NS, max(end_ns - start_ns, 0) * PS_PER_NS,
                                              (("group_id", step), ("step_num", step)))

    def write(self, file: BinaryIO, timestamp_ns: int) -> None:
        for builder in self.builders.values():
            builder.write(file, timestamp_ns, keep_empty_lines=True)


def _add_op_metadata(builder: PlaneBuilder, tables: TraceTables, run: ProgramRun, index: int) -> int:
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
    # program (and in every program with the same ops): encoded once per plane while it is among the
    # last `MAX_CACHED_DESCRIPTIONS` made (encoding it again gives the same bytes).
    described = (key.program_id, key.op_sid, key.inputs_sid, key.outputs_sid, key.module_sid, key.frame_id, run.estimated)
    description = builder.op_descriptions.get(described)
    if description is None:
        description = remember(builder.op_descriptions, described, _describe_op(builder, tables, key, run.estimated),
                               MAX_CACHED_DESCRIPTIONS)
    op_name, described_stats = description
    name = f"{op_name}.{key.position}" if run.estimated else op_name
    return builder.add_encoded_metadata(tuple(key), name, cost_stats + described_stats)


def _describe_op(builder: PlaneBuilder, tables: TraceTables, key: OpKey, estimated: bool) -> tuple[str, list[bytes]]:
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
