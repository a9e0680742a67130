"""Typed records: one frozen dataclass per table of the trace, with interned values resolved.

A record's fields follow its table's columns in order, with these renames: a `*_sid` column becomes
the resolved text without the suffix (`op_sid` -> `op`), `frame_id` becomes `source` and
`origin_frame_id` becomes `origin` and `library_frame_id` `library` (each a `SourceLocation`), and the `annotations.source` text column
becomes `origin` (so that `source` is a location everywhere). `runs.argv` is decoded from JSON into a
tuple. A test keeps these classes in step with `tputrace.schema`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tputrace.schema import Column, RecordKind


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """A user source location: the first frame outside torch, tputrace and other libraries.

    `col`, `end_line` and `end_col` (0-based character offsets, None when not recorded) say where the
    call is: it starts at `col` on `line` and ends before `end_col` on `end_line` (None when a file from
    before `end_line` does not say where a call that goes on past `line` ends). They take no part in
    equality or hashing: two calls on one line are one location, so per-line views stay per line; code
    that tells calls apart keys on `call_key`. `columns_unchecked` is True where the trace stored the
    columns as UTF-8 bytes and the file here is not the one the run saw, so they could not be turned into
    characters and read as None (the call counts as its whole line)."""

    file: str
    line: int
    function: str
    col: int | None = field(default=None, compare=False)
    end_col: int | None = field(default=None, compare=False)
    end_line: int | None = field(default=None, compare=False)
    columns_unchecked: bool = field(default=False, compare=False)

    @property
    def short(self) -> str:
        """`file.py:12` with the file's directory left out."""
        return f"{os.path.basename(self.file)}:{self.line}"

    @property
    def call_key(self) -> tuple[str, int, str, int | None, int | None, int | None]:
        """What tells one call on a line from another: the location and the call's span (`a @ b @ c` has two
        calls starting at one column)."""
        return (self.file, self.line, self.function, self.col, self.end_line, self.end_col)

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


@dataclass(frozen=True, slots=True)
class StringRecord:
    id: int
    text: str


@dataclass(frozen=True, slots=True)
class FrameRecord:
    id: int
    file: str | None
    line: int
    function: str | None
    col: int | None
    end_col: int | None
    end_line: int | None


@dataclass(frozen=True, slots=True)
class RunInfo:
    """Facts about one recorded process (rank)."""

    rank: int
    world_size: int | None
    script: str | None
    argv: tuple[str, ...]
    cwd: str | None
    host: str | None
    pid: int | None
    chips: int | None
    platform: str | None
    eager_mode: str | None
    torch_version: str | None
    jax_version: str | None
    tputrace_version: str | None
    start_unix_ns: int | None
    end_ns: int | None
    exit_status: int | None
    error: str | None

    @property
    def finished(self) -> bool:
        """False when the run has no end record: still running, or killed."""
        return self.end_ns is not None


@dataclass(frozen=True, slots=True)
class OpRecord:
    seq: int
    rank: int
    op: str | None
    inputs: str | None
    outputs: str | None
    chip: int | None
    start_ns: int
    dur_ns: int | None
    source: SourceLocation | None
    module: str | None
    step: int | None
    program_id: int | None
    flush_id: int | None


@dataclass(frozen=True, slots=True)
class ProgramRecord:
    id: int
    rank: int
    kind: str | None
    name: str | None
    structure: str | None
    signature: str | None
    n_ops: int | None
    flops: float | None
    bytes_accessed: float | None
    hlo_ops: int | None


@dataclass(frozen=True, slots=True)
class CompileRecord:
    id: int
    rank: int
    program_id: int | None
    kind: str | None
    name: str | None
    signature: str | None
    chip: int | None
    start_ns: int
    dur_ns: int | None
    source: SourceLocation | None
    step: int | None
    reason: str | None
    diff: str | None
    detail: str | None

    @property
    def is_recompile(self) -> bool:
        return self.reason not in (None, "first")


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    rank: int
    program_id: int | None
    chip: int | None
    start_ns: int
    dur_ns: int | None
    step: int | None
    flush_id: int | None


@dataclass(frozen=True, slots=True)
class FusionRecord:
    rank: int
    program_id: int | None
    name: str | None
    kind: str | None
    ops: str | None
    aten: str | None


@dataclass(frozen=True, slots=True)
class FlushRecord:
    id: int
    rank: int
    program_id: int | None
    trigger: str | None
    source: SourceLocation | None
    n_ops: int | None
    cache_hit: int | None
    chip: int | None
    start_ns: int
    dur_ns: int | None
    input_bytes: int | None
    output_bytes: int | None
    step: int | None
    replay: str | None = None
    replay_break: str | None = None


@dataclass(frozen=True, slots=True)
class SyncRecord:
    rank: int
    kind: str | None
    source: SourceLocation | None
    chip: int | None
    start_ns: int
    dur_ns: int | None
    pending_ops: int | None
    step: int | None
    library: SourceLocation | None = None


@dataclass(frozen=True, slots=True)
class TransferRecord:
    rank: int
    direction: str | None
    bytes: int | None
    src_chip: int | None
    dst_chip: int | None
    start_ns: int
    dur_ns: int | None
    source: SourceLocation | None
    step: int | None
    origin: SourceLocation | None = None


@dataclass(frozen=True, slots=True)
class FallbackRecord:
    rank: int
    op: str | None
    inputs: str | None
    chip: int | None
    start_ns: int
    dur_ns: int | None
    source: SourceLocation | None
    step: int | None


@dataclass(frozen=True, slots=True)
class MemorySample:
    rank: int
    chip: int | None
    t_ns: int
    live_bytes: int | None
    peak_bytes: int | None


@dataclass(frozen=True, slots=True)
class BufferRecord:
    buffer_id: int
    rank: int
    chip: int | None
    bytes: int | None
    dtype: str | None
    shape: str | None
    kind: str | None
    source: SourceLocation | None
    module: str | None
    alloc_ns: int
    free_ns: int | None
    step: int | None


@dataclass(frozen=True, slots=True)
class AnnotationRecord:
    rank: int
    name: str | None
    origin: str | None
    start_ns: int
    dur_ns: int | None
    source: SourceLocation | None
    step: int | None


@dataclass(frozen=True, slots=True)
class StepRecord:
    rank: int
    step: int
    start_ns: int
    end_ns: int | None
    source: str | None

    @property
    def dur_ns(self) -> int | None:
        return None if self.end_ns is None else self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    rank: int
    kind: str | None
    bytes: int | None
    dtype: str | None
    group: str | None
    ranks: str | None
    source: SourceLocation | None
    start_ns: int
    dur_ns: int | None
    wait_ns: int | None
    algorithm: str | None
    bus_bandwidth: float | None
    step: int | None
    cause_id: int | None = None
    waited_after_ns: int | None = None
    read_early: SourceLocation | None = None


@dataclass(frozen=True, slots=True)
class DeviceMeshRecord:
    id: int
    rank: int
    shape: str | None
    dim_names: str | None
    ranks: str | None
    source: SourceLocation | None


@dataclass(frozen=True, slots=True)
class ParameterPlacementRecord:
    rank: int
    name: str | None
    module: str | None
    wrapper: str | None
    group: str | None
    mesh_id: int | None
    placements: str | None
    global_shape: str | None
    local_shape: str | None
    dtype: str | None
    bytes: int | None
    bytes_per_rank: int | None
    origin: SourceLocation | None


@dataclass(frozen=True, slots=True)
class KernelLaunchRecord:
    rank: int
    op_seq: int | None
    program_id: int | None
    chip: int | None
    start_ns: int
    dur_ns: int | None


@dataclass(frozen=True, slots=True)
class CollectiveCauseRecord:
    id: int
    rank: int
    kind: str | None
    phase: str | None
    module: str | None
    tensor: str | None
    op: str | None
    mesh_id: int | None
    src_placements: str | None
    dst_placements: str | None
    global_shape: str | None
    local_shape: str | None
    bucket_index: int | None
    bucket_bytes: int | None
    prefetch: int | None
    origin: SourceLocation | None


@dataclass(frozen=True, slots=True)
class GraphBreakRecord:
    rank: int
    reason: str | None
    source: SourceLocation | None
    t_ns: int
    step: int | None


@dataclass(frozen=True, slots=True)
class SourceFileRecord:
    rank: int
    file: str | None
    sha256: str
    size: int


Record = (
    StringRecord
    | FrameRecord
    | RunInfo
    | OpRecord
    | ProgramRecord
    | CompileRecord
    | ExecutionRecord
    | FusionRecord
    | FlushRecord
    | SyncRecord
    | TransferRecord
    | FallbackRecord
    | MemorySample
    | BufferRecord
    | AnnotationRecord
    | StepRecord
    | CollectiveRecord
    | GraphBreakRecord
    | SourceFileRecord
    | DeviceMeshRecord
    | ParameterPlacementRecord
    | CollectiveCauseRecord
    | KernelLaunchRecord
)

RECORD_TYPES: dict[str, type] = {
    "strings": StringRecord,
    "frames": FrameRecord,
    "runs": RunInfo,
    "ops": OpRecord,
    "programs": ProgramRecord,
    "compiles": CompileRecord,
    "executions": ExecutionRecord,
    "fusions": FusionRecord,
    "flushes": FlushRecord,
    "syncs": SyncRecord,
    "transfers": TransferRecord,
    "fallbacks": FallbackRecord,
    "memory": MemorySample,
    "buffers": BufferRecord,
    "annotations": AnnotationRecord,
    "steps": StepRecord,
    "collectives": CollectiveRecord,
    "graph_breaks": GraphBreakRecord,
    "source_files": SourceFileRecord,
    "device_meshes": DeviceMeshRecord,
    "parameter_placements": ParameterPlacementRecord,
    "collective_causes": CollectiveCauseRecord,
    "kernel_launches": KernelLaunchRecord,
}


def field_name(kind: RecordKind, column: Column) -> str:
    """The record field that holds `column` of `kind`, following the renames in the module docstring."""
    if column.name == "frame_id":
        return "source"
    if column.ref == "frames" and column.name.endswith("_frame_id"):
        return column.name[: -len("_frame_id")]  # `origin_frame_id`: `origin`
    if kind.table == "annotations" and column.name == "source":
        return "origin"
    if column.ref == "strings" and column.name.endswith("_sid"):
        return column.name[: -len("_sid")]
    return column.name
