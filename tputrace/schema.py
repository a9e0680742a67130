"""The trace format: record kinds, their columns, and the SQLite schema that stores them.

This module is the contract between the backend (which writes) and every view (which reads).
It imports nothing beyond the standard library. `docs/trace-format.md` describes the same schema
for people; a test keeps the two in step.

Conventions shared by every table:
- Times are integers in nanoseconds. `*_ns` event times are relative to the run's `start_unix_ns`
  (so they stay small on disk); durations are plain nanoseconds.
- Strings that repeat (op names, shapes, file names, module paths, reasons) are interned in
  `strings` and referenced by id; a column named `*_sid` holds such an id.
- A source location is interned in `frames` (file, line, function, and for compiles the column span of
  the call on that line); `frame_id` refers to it.
- `rank` is the distributed rank that recorded the row (0 for single-process runs), `chip` the
  local chip index (`tpu:<chip>`), `step` the training step the row happened in (0 before the
  first step boundary).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

MAGIC = "tputrace-trace"
# 2: device_meshes, parameter_placements, collective_causes and collectives.cause_id (a version-1 file reads
# them as empty and NULL).
# 3: buffers (each chip buffer's lifetime; an older file reads it as empty) and transfers.origin_frame_id (the line
# that made a batch copied to a chip; an older file reads it as NULL); syncs.library_frame_id is a trailing column of
# it (an older file reads it as NULL); so is kernel_launches (an imported GPU capture's kernels tied to the CPU ops that
# launched them; an older file reads it as empty).
FORMAT_VERSION = 3
FILE_SUFFIX = ".tptrace"
# `meta` key naming the on-disk compile cache directory a run used (absent: it used none).
COMPILE_CACHE_META_KEY = "compile_cache"
# `meta` key of a run that kept only some steps (`tputrace run --steps/--schedule/--from-code`); absent: all.
RECORDING_WINDOW_META_KEY = "recording_window"
# How a `compiles.diff` starts when nothing changed but the backend had dropped the program to bound its cache.
EVICTED_DIFF_PREFIX = "same signature: its program was dropped from the program cache"


@dataclass(frozen=True)
class Column:
    """One column of a record table; `kind` is the SQLite type, `ref` names what an id refers to."""

    name: str
    kind: str
    doc: str
    ref: str | None = None


@dataclass(frozen=True)
class RecordKind:
    """One table of the trace: its name, what a row means, and its columns in insert order."""

    table: str
    doc: str
    columns: tuple[Column, ...]
    indexes: tuple[tuple[str, ...], ...] = ()
    primary_key: str | None = None
    # Trailing columns a writer may leave out of a row (stored NULL): added after writers of the table existed.
    optional_trailing: int = 0

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    def insert_sql(self) -> str:
        placeholders = ", ".join("?" for _ in self.columns)
        return f"INSERT INTO {self.table} ({', '.join(self.column_names)}) VALUES ({placeholders})"


def _c(name: str, kind: str, doc: str, ref: str | None = None) -> Column:
    return Column(name, kind, doc, ref)


_RANK = _c("rank", "INTEGER", "distributed rank that recorded the row")
_STEP = _c("step", "INTEGER", "training step (0 before the first boundary)")
_CHIP = _c("chip", "INTEGER", "local chip index, -1 for host-only rows")
_FRAME = _c("frame_id", "INTEGER", "user source location", ref="frames")
_START = _c("start_ns", "INTEGER", "start, ns since the run's start")
_DUR = _c("dur_ns", "INTEGER", "duration, ns")

STRINGS = RecordKind(
    "strings",
    "Interned strings; every *_sid column refers to a row here.",
    (_c("id", "INTEGER", "string id"), _c("text", "TEXT", "the string")),
    primary_key="id",
)

FRAMES = RecordKind(
    "frames",
    "Interned source locations: the first user frame outside torch, tputrace and other libraries.",
    (
        _c("id", "INTEGER", "frame id"),
        _c("file_sid", "INTEGER", "absolute file path", ref="strings"),
        _c("line", "INTEGER", "1-based line number"),
        _c("function_sid", "INTEGER", "function name", ref="strings"),
        _c("col", "INTEGER", "0-based character offset on `line` where the call starts (NULL: the whole line)"),
        _c("end_col", "INTEGER", "0-based character offset on `end_line` where the call ends, exclusive (NULL: the whole line, or the end is not known)"),
        _c("end_line", "INTEGER", "1-based line the call ends on (NULL as `end_col`)"),
    ),
    primary_key="id",
)

RUNS = RecordKind(
    "runs",
    "One row per recorded process (one per rank in a merged trace).",
    (
        _RANK,
        _c("world_size", "INTEGER", "number of ranks"),
        _c("script", "TEXT", "script path or -m module"),
        _c("argv", "TEXT", "JSON list of the script's arguments"),
        _c("cwd", "TEXT", "working directory"),
        _c("host", "TEXT", "host name"),
        _c("pid", "INTEGER", "process id"),
        _c("chips", "INTEGER", "number of chips visible to the process"),
        _c("platform", "TEXT", "XLA platform: cpu or tpu"),
        _c("eager_mode", "TEXT", "DEFER_AND_FUSE, DEFER_NEVER or DEFER_NEVER_AND_LAUNCH_BLOCKING"),
        _c("torch_version", "TEXT", "torch.__version__"),
        _c("jax_version", "TEXT", "jax.__version__"),
        _c("tputrace_version", "TEXT", "tputrace version"),
        _c("start_unix_ns", "INTEGER", "wall-clock start, ns since the Unix epoch"),
        _c("end_ns", "INTEGER", "end, ns since start (NULL while running or after a kill)"),
        _c("exit_status", "INTEGER", "process exit status (NULL while running or after a kill)"),
        _c("error", "TEXT", "the script's exception, formatted, if it raised"),
    ),
    indexes=(("rank",),),
)

OPS = RecordKind(
    "ops",
    "One row per ATen op dispatched to a tpu tensor.",
    (
        _c("seq", "INTEGER", "dispatch sequence number within the rank"),
        _RANK,
        _c("op_sid", "INTEGER", "ATen op with overload, e.g. aten.addmm.default", ref="strings"),
        _c("inputs_sid", "INTEGER", "input shapes and dtypes, e.g. 'f32[64,128], f32[128]'", ref="strings"),
        _c("outputs_sid", "INTEGER", "output shapes and dtypes", ref="strings"),
        _CHIP,
        _START,
        _DUR,
        _FRAME,
        _c("module_sid", "INTEGER", "nn.Module path, e.g. GPT.blocks.3.attn.q_proj", ref="strings"),
        _STEP,
        _c("program_id", "INTEGER", "program that computed the op (strict: its own; defer: the flush's)", ref="programs"),
        _c("flush_id", "INTEGER", "flush the op ended up in (DeferAndFuse), NULL in strict mode", ref="flushes"),
    ),
    # No (rank, start_ns) index: it would cost ~17 bytes per op (the budget is 60 bytes per op).
    # Ops are inserted close to dispatch order per rank (deferred ops when their flush runs);
    # order by seq for exact dispatch order. A time-window query over ops scans the table.
    indexes=(("op_sid",),),
)

PROGRAMS = RecordKind(
    "programs",
    "One row per compiled XLA program (definition, not execution).",
    (
        _c("id", "INTEGER", "program id"),
        _RANK,
        _c("kind", "TEXT", "op, fused or compiled (torch.compile graph); in an imported trace also xla (an XLA module) or kernel (a device kernel)"),
        _c("name_sid", "INTEGER", "program name (the op for single-op programs)", ref="strings"),
        _c("structure_sid", "INTEGER", "structure key: equal for programs that differ only in input signature", ref="strings"),
        _c("signature_sid", "INTEGER", "input shapes and dtypes", ref="strings"),
        _c("n_ops", "INTEGER", "ATen ops in the program (a fused program's view reads and writes, which have no `ops` row, not counted)"),
        _c("flops", "REAL", "XLA cost analysis: floating-point operations per execution"),
        _c("bytes_accessed", "REAL", "XLA cost analysis: bytes accessed per execution"),
        _c("hlo_ops", "INTEGER", "HLO instructions in the optimized module (every computation's); NULL where its HLO was not read (a program compiled while nothing recorded, or a trace written before tputrace filled this column)"),
    ),
    primary_key="id",
)

COMPILES = RecordKind(
    "compiles",
    "One row per compilation; a recompile says what differs from the nearest earlier compile of the same structure.",
    (
        _c("id", "INTEGER", "compile id"),
        _RANK,
        _c("program_id", "INTEGER", "program produced", ref="programs"),
        _c("kind", "TEXT", "op, fused, dynamo_frame, aot or xla"),
        _c("name_sid", "INTEGER", "what was compiled", ref="strings"),
        _c("signature_sid", "INTEGER", "input signature", ref="strings"),
        _CHIP,
        _START,
        _DUR,
        _FRAME,
        _STEP,
        _c("reason", "TEXT", "first, recompile or guard_failure"),
        _c("diff_sid", "INTEGER", "what changed, e.g. 'input 0 dim 1: 128 -> 256'", ref="strings"),
        _c("detail", "TEXT", "JSON object with kind-specific details (e.g. dynamo/aot/xla time split)"),
    ),
    indexes=(("rank", "start_ns"),),
    primary_key="id",
)

EXECUTIONS = RecordKind(
    "executions",
    "One row per program execution on a chip.",
    (
        _RANK,
        _c("program_id", "INTEGER", "program executed", ref="programs"),
        _CHIP,
        _c("start_ns", "INTEGER", "launch, ns since the run's start"),
        _c("dur_ns", "INTEGER", "from the launch to the outputs seen ready, ns: it includes waiting behind programs launched "
           "before on the chip and, for a run on this backend, the lag of the watcher that sees it: it waits, without polling, "
           "on a DeferAndFuse program's extra one-byte output, which only it holds (the program's own outputs may be donated "
           "to the next program before it has run), and polls a compiled graph's outputs (every 50 µs at first, backing off "
           "to every 2 ms); either way it then waits for Python's interpreter lock"),
        _STEP,
        _c("flush_id", "INTEGER", "flush that ran it (DeferAndFuse)", ref="flushes"),
    ),
    indexes=(("rank", "start_ns"), ("program_id",)),
)

FUSIONS = RecordKind(
    "fusions",
    "XLA's fusion decisions inside a compiled program, from the optimized HLO.",
    (
        _RANK,
        _c("program_id", "INTEGER", "program the fusion belongs to", ref="programs"),
        _c("name_sid", "INTEGER", "fusion instruction name", ref="strings"),
        _c("kind_sid", "INTEGER", "fusion kind: kLoop, kInput, kOutput, kCustom", ref="strings"),
        _c("ops_sid", "INTEGER", "comma-separated HLO opcodes fused", ref="strings"),
        _c("aten_sid", "INTEGER", "comma-separated ATen ops the fused instructions came from", ref="strings"),
    ),
    indexes=(("program_id",),),
)

FLUSHES = RecordKind(
    "flushes",
    "One row per DeferAndFuse flush: a pending graph run as one program. Making an optimizer for tpu parameters flushes the set-up still pending when its constructor returns (`optimizer_init`: a model made on the device, state the constructor made) so that it is not part of the first step's program; an optimizer's first step runs the state it makes (zeros, fills) as a flush of its own, `optimizer_state`, before its update reads it, so that the update's program is the one every later step runs.",
    (
        _c("id", "INTEGER", "flush id"),
        _RANK,
        _c("program_id", "INTEGER", "program run", ref="programs"),
        _c("trigger", "TEXT", "item, cpu, numpy, tolist, print, bool, data_dependent, fallback, collective, size_cap, step, backward_end, optimizer_init, optimizer_state, exit, explicit, value_check, transfer, compiled_graph"),
        _FRAME,
        _c("n_ops", "INTEGER", "ops in the flushed graph: its `ops` rows (view reads, which have none, not counted)"),
        _c("cache_hit", "INTEGER", "1 when the program came from the cache"),
        _CHIP,
        _START,
        _DUR,
        _c("input_bytes", "INTEGER", "bytes of the program's inputs"),
        _c("output_bytes", "INTEGER", "bytes of the program's outputs"),
        _STEP,
        _c("replay", "TEXT", "step replay (`TPUTRACE_STEP_REPLAY`): held (the graph repeated the one flushed at this point of the loop last time, checked op by op, and ran its program without building its cache key), broke (it differed: `replay_break` says where), none (no earlier graph to follow here); NULL where replay is off, for an optimizer's new state, or in a file written before this column"),
        _c("replay_break_sid", "INTEGER", "why the replay broke: the first op (its index among the graph's nodes, view reads counted, and its name) or part of the program's key that differed, and how", ref="strings"),
    ),
    indexes=(("rank", "start_ns"),),
    primary_key="id",
    optional_trailing=2,
)

SYNCS = RecordKind(
    "syncs",
    "Host syncs: the host waited for a value from a chip.",
    (
        _RANK,
        _c("kind", "TEXT", "item, cpu, numpy, tolist, print, bool, data_dependent; synchronize (the script's `torch.tpu.synchronize()`, or `torch.cuda.synchronize()` under `--as-cuda`); host_outputs (a torch.compile graph's outputs that torch keeps on the CPU, such as a non-capturable optimizer's step counts, copied back after each call); fallback and transfer (inside a CPU fallback or a copy between chips); value_check (tputrace checking arguments on the host)"),
        _FRAME,
        _CHIP,
        _START,
        _c("dur_ns", "INTEGER", "stall: time the host waited"),
        _c("pending_ops", "INTEGER", "pending ops the sync forced to run (counted as `flushes.n_ops`)"),
        _STEP,
        _c("library_frame_id", "INTEGER", "where the user's line called into a library (not torch) that read the value: the "
           "innermost line of that library on the stack (a Trainer's check of each step's loss), NULL when the user's "
           "code read it", ref="frames"),
    ),
    indexes=(("rank", "start_ns"),),
)

TRANSFERS = RecordKind(
    "transfers",
    "Copies between host and chip or between chips.",
    (
        _RANK,
        _c("direction", "TEXT", "h2d, d2h or d2d"),
        _c("bytes", "INTEGER", "bytes copied"),
        _c("src_chip", "INTEGER", "source chip, -1 for the host"),
        _c("dst_chip", "INTEGER", "destination chip, -1 for the host"),
        _START,
        _DUR,
        _FRAME,
        _STEP,
        _c("origin_frame_id", "INTEGER", "h2d: the user's line that made the host tensor copied (a collate_fn's pad, torch.tensor, "
           "torch.stack, ...), when a function tputrace watches made it", ref="frames"),
    ),
    indexes=(("rank", "start_ns"),),
)

FALLBACKS = RecordKind(
    "fallbacks",
    "Ops with no lowering that ran on the host CPU (transfers included in the duration).",
    (
        _RANK,
        _c("op_sid", "INTEGER", "ATen op", ref="strings"),
        _c("inputs_sid", "INTEGER", "input shapes and dtypes", ref="strings"),
        _CHIP,
        _START,
        _DUR,
        _FRAME,
        _STEP,
    ),
    indexes=(("rank", "start_ns"),),
)

MEMORY = RecordKind(
    "memory",
    "Samples of live and peak bytes per chip.",
    (
        _RANK,
        _CHIP,
        _c("t_ns", "INTEGER", "sample time, ns since the run's start"),
        _c("live_bytes", "INTEGER", "bytes held by live tpu tensors"),
        _c("peak_bytes", "INTEGER", "peak live bytes so far"),
    ),
    indexes=(("rank", "t_ns"),),
)

BUFFERS = RecordKind(
    "buffers",
    "Chip buffer lifetimes: one row per buffer from its allocation to its free, and one zero-length row per program launch for the working memory it holds while it runs.",
    (
        _c("buffer_id", "INTEGER", "buffer number within the rank (not unique across the ranks of a merged trace)"),
        _RANK,
        _CHIP,
        _c("bytes", "INTEGER", "bytes the buffer counts against its chip (unpadded)"),
        _c("dtype", "TEXT", "element type, e.g. float32 (NULL for a program's working memory)"),
        _c("shape_sid", "INTEGER", "comma-separated sizes, e.g. '64,128' (NULL for a program's working memory)", ref="strings"),
        _c("kind", "TEXT", "parameter, gradient, optimizer_state, activation (made in a module's forward, alive when a backward began), temporary, program_temporary (a program's temporaries and outputs while it runs) or other (live at the end, made outside a forward)"),
        _FRAME,
        _c("module_sid", "INTEGER", "nn.Module path whose forward made the buffer", ref="strings"),
        _c("alloc_ns", "INTEGER", "allocation, ns since the run's start (strictly increasing within a rank)"),
        _c("free_ns", "INTEGER", "free, ns since the run's start (NULL: live when the recording stopped)"),
        _STEP,
    ),
    indexes=(("rank", "alloc_ns"),),
)

ANNOTATIONS = RecordKind(
    "annotations",
    "Named ranges from torch.profiler.record_function and tputrace.annotate.",
    (
        _RANK,
        _c("name_sid", "INTEGER", "range name", ref="strings"),
        _c("source", "TEXT", "record_function, annotate, index_check (an index out of range or invalid values), or recompile_limit (Dynamo's warning that a torch.compile'd function hit its recompile limit, at the line calling it); in an imported trace also python (a Python tracer frame) or traceme (a TraceMe range)"),
        _START,
        _DUR,
        _FRAME,
        _STEP,
    ),
    indexes=(("rank", "start_ns"),),
)

STEPS = RecordKind(
    "steps",
    "Training steps, from tputrace.step() or optimizer.step(), once per loop iteration that steps several optimizers (once a script calls tputrace.step(), only its calls mark steps).",
    (
        _RANK,
        _STEP,
        _START,
        _c("end_ns", "INTEGER", "end, ns since the run's start"),
        _c("source", "TEXT", "optimizer, explicit, or end (written at exit when anything was recorded after the last boundary); imported (a step marker of an imported capture)"),
    ),
    indexes=(("rank", "step"),),
)

COLLECTIVES = RecordKind(
    "collectives",
    "Collective communication ops.",
    (
        _RANK,
        _c("kind", "TEXT", "all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, barrier, send, recv"),
        _c("bytes", "INTEGER", "message size in bytes"),
        _c("dtype", "TEXT", "element type"),
        _c("group_sid", "INTEGER", "process group name", ref="strings"),
        _c("ranks_sid", "INTEGER", "ranks in the group, comma-separated", ref="strings"),
        _FRAME,
        _START,
        _DUR,
        _c("wait_ns", "INTEGER", "time this rank waited for the last arrival"),
        _c("algorithm", "TEXT", "algorithm, e.g. ring"),
        _c("bus_bandwidth", "REAL", "bus bandwidth, bytes/s"),
        _STEP,
        _c("cause_id", "INTEGER", "why the call happened (NULL: the user's own call, or a file from before causes were recorded)", ref="collective_causes"),
        _c("waited_after_ns", "INTEGER", "how long after `start_ns` this rank's code first waited on the call (its Work, "
           "future or functional result); NULL: never waited, waited where tputrace does not see it (DDP's reducer, in C++), or an older file"),
        _c("read_early_frame_id", "INTEGER", "the user's line that first read a tensor the call writes after issuing it and before "
           "that first wait (NULL: none did, a library's call, or an older file)", ref="frames"),
    ),
    indexes=(("rank", "start_ns"),),
    optional_trailing=2,
)

DEVICE_MESHES = RecordKind(
    "device_meshes",
    "The device meshes a run used (DTensor, tensor parallelism, FSDP2), once each per rank.",
    (
        _c("id", "INTEGER", "mesh id"),
        _RANK,
        _c("shape", "TEXT", "size of each mesh dim, e.g. '2x4'"),
        _c("dim_names", "TEXT", "comma-separated dim names, e.g. 'dp,tp' (empty where the mesh has none)"),
        _c("ranks", "TEXT", "JSON: the global ranks, nested as the mesh"),
        _FRAME,
    ),
    primary_key="id",
)

PARAMETER_PLACEMENTS = RecordKind(
    "parameter_placements",
    "Each parameter of a model that DDP, FSDP2 or tensor parallelism handles: how it is placed and what a rank holds, once per run.",
    (
        _RANK,
        _c("name_sid", "INTEGER", "parameter path, e.g. 'Model.layers.0.fc1.weight'", ref="strings"),
        _c("module_sid", "INTEGER", "path of the module that owns the parameter", ref="strings"),
        _c("wrapper", "TEXT", "ddp (replicated, gradients all-reduced), fsdp, tp, fsdp+tp, or none (a plain parameter of a sharded model)"),
        _c("group_sid", "INTEGER", "FSDP2: path of the module whose fully_shard() groups the parameter; tp: the plan entry's style", ref="strings"),
        _c("mesh_id", "INTEGER", "mesh the placements refer to (NULL for ddp and none)", ref="device_meshes"),
        _c("placements", "TEXT", "one placement per mesh dim, e.g. 'Shard(0),Replicate()' (Replicate() for ddp and none)"),
        _c("global_shape", "TEXT", "the whole parameter's shape, e.g. '1024,4096'"),
        _c("local_shape", "TEXT", "this rank's shard's shape"),
        _c("dtype", "TEXT", "element type"),
        _c("bytes", "INTEGER", "bytes of the whole parameter"),
        _c("bytes_per_rank", "INTEGER", "bytes this rank holds"),
        _c("origin_frame_id", "INTEGER", "the line that set the placement: the plan entry, fully_shard(...) or DDP(...)", ref="frames"),
    ),
)

COLLECTIVE_CAUSES = RecordKind(
    "collective_causes",
    "Why collectives happened: one row per distinct cause on a rank, referred to by `collectives.cause_id`.",
    (
        _c("id", "INTEGER", "cause id"),
        _RANK,
        _c("kind", "TEXT", "redistribute (a DTensor changed placement), reduce_again, round_trip, fsdp_all_gather, fsdp_reduce_scatter, ddp_bucket, ddp_init, ddp_forward or join (the calls a rank out of inputs issues inside `Join`, shadowing the others')"),
        _c("phase", "TEXT", "forward or backward"),
        _c("module_sid", "INTEGER", "module path: the tensor-parallel module, FSDP2 group or DDP model", ref="strings"),
        _c("tensor_sid", "INTEGER", "the parameter(s) when the redistributed tensor is a parameter; the parameters of an FSDP2 group or DDP bucket (first few)", ref="strings"),
        _c("op_sid", "INTEGER", "what asked for it: the ATen op whose sharding propagation needed another placement, a style's input/output layout, or redistribute", ref="strings"),
        _c("mesh_id", "INTEGER", "mesh of the placements", ref="device_meshes"),
        _c("src_placements", "TEXT", "placements before, one per mesh dim, e.g. 'Shard(1)'"),
        _c("dst_placements", "TEXT", "placements after"),
        _c("global_shape", "TEXT", "the DTensor's global shape"),
        _c("local_shape", "TEXT", "this rank's local shape before the redistribution"),
        _c("bucket_index", "INTEGER", "DDP: the bucket's index in the backward pass"),
        _c("bucket_bytes", "INTEGER", "DDP: the bucket cap in bytes (bucket_cap_mb); FSDP2: the group's parameter bytes"),
        _c("prefetch", "INTEGER", "FSDP2: 1 when the all-gather was a prefetch for a later module"),
        _c("origin_frame_id", "INTEGER", "the line to edit: the plan entry (the style's construction), fully_shard(...) or DDP(...)", ref="frames"),
    ),
    primary_key="id",
)

GRAPH_BREAKS = RecordKind(
    "graph_breaks",
    "torch.compile graph breaks.",
    (
        _RANK,
        _c("reason_sid", "INTEGER", "why Dynamo broke the graph", ref="strings"),
        _FRAME,
        _c("t_ns", "INTEGER", "when, ns since the run's start"),
        _STEP,
    ),
)

SOURCE_FILES = RecordKind(
    "source_files",
    "The user's source files as the run saw them (when the recorder first met each one): content digest and size, so a viewer can tell a file that changed since.",
    (
        _RANK,
        _c("file_sid", "INTEGER", "absolute file path, as in frames", ref="strings"),
        _c("sha256", "TEXT", "SHA-256 of the file's bytes, hex"),
        _c("size", "INTEGER", "the file's size in bytes"),
    ),
)

KERNEL_LAUNCHES = RecordKind(
    "kernel_launches",
    "An imported GPU capture's device kernels (and copies) tied to the CPU op that launched them: one row per kernel "
    "whose launch (the runtime call of the same correlation id) ran inside a CPU op on its thread.",
    (
        _RANK,
        _c("op_seq", "INTEGER", "the launching op: the innermost CPU op around the launch on its thread (its `ops.seq`)"),
        _c("program_id", "INTEGER", "the kernel", ref="programs"),
        _CHIP,
        _c("start_ns", "INTEGER", "the kernel's start on the device, ns since the run's start"),
        _c("dur_ns", "INTEGER", "the kernel's time on the device, ns"),
    ),
    indexes=(("rank", "op_seq"),),
)

RECORD_KINDS: tuple[RecordKind, ...] = (
    STRINGS,
    FRAMES,
    RUNS,
    OPS,
    PROGRAMS,
    COMPILES,
    EXECUTIONS,
    FUSIONS,
    FLUSHES,
    SYNCS,
    TRANSFERS,
    FALLBACKS,
    MEMORY,
    BUFFERS,
    ANNOTATIONS,
    STEPS,
    COLLECTIVES,
    GRAPH_BREAKS,
    SOURCE_FILES,
    DEVICE_MESHES,
    PARAMETER_PLACEMENTS,
    COLLECTIVE_CAUSES,
    KERNEL_LAUNCHES,
)
RECORD_KINDS_BY_TABLE: dict[str, RecordKind] = {kind.table: kind for kind in RECORD_KINDS}
EVENT_TABLES: tuple[str, ...] = tuple(
    kind.table for kind in RECORD_KINDS if kind.table not in ("strings", "frames", "runs", "programs", "source_files", "device_meshes", "parameter_placements", "collective_causes")
)


def table_statements() -> list[str]:
    """DDL for the meta table and every record table, without indexes."""
    statements = ["CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"]
    for kind in RECORD_KINDS:
        columns = []
        for column in kind.columns:
            suffix = " PRIMARY KEY" if column.name == kind.primary_key else ""
            columns.append(f"{column.name} {column.kind}{suffix}")
        statements.append(f"CREATE TABLE {kind.table} ({', '.join(columns)})")
    return statements


def index_statements() -> list[str]:
    """DDL for every index; idempotent, so a writer can build them after a bulk insert."""
    statements = []
    for kind in RECORD_KINDS:
        for index_columns in kind.indexes:
            index_name = f"idx_{kind.table}_{'_'.join(index_columns)}"
            statements.append(
                f"CREATE INDEX IF NOT EXISTS {index_name} ON {kind.table} ({', '.join(index_columns)})"
            )
    return statements


VIEW_SUFFIX = "_v"
VIEW_TABLES: tuple[str, ...] = tuple(kind.table for kind in RECORD_KINDS if kind.table != "strings")


def view_statements(present_columns: Mapping[str, Collection[str]] | None = None) -> list[str]:
    """DDL for one view per record table but `strings` (`ops_v`, `compiles_v`, ...): its rows with every
    `*_sid` column as text under the name without `_sid` (`op`, `module`) and every `frame_id` as `file`,
    `line`, `function`. Idempotent, so it can be run on an older trace: `present_columns` (table -> its
    columns in that file) leaves out the tables and columns it lacks. Views add no data, so they leave the
    format version as it is."""
    statements = []
    for table in VIEW_TABLES:
        if present_columns is not None and table not in present_columns:
            continue
        kind = RECORD_KINDS_BY_TABLE[table]
        present = kind.column_names if present_columns is None else present_columns[table]
        statements.append(_view_statement(kind, present))
    return statements


def _view_statement(kind: RecordKind, present: Collection[str]) -> str:
    selected: list[str] = []
    joins: list[str] = []
    for column in (column for column in kind.columns if column.name in present):
        selected.append(f"t.{column.name}")
        if column.ref == "strings" and column.name.endswith("_sid"):
            alias = f"s_{column.name}"
            selected.append(f'{alias}.text AS "{column.name.removesuffix("_sid")}"')
            joins.append(f"LEFT JOIN strings {alias} ON {alias}.id = t.{column.name}")
        elif column.ref == "frames":
            prefix = location_prefix(column.name, present)
            alias = f"{prefix}frame"
            selected += [f"{alias}_file.text AS {prefix}file", f"{alias}.line AS {prefix}line",
                         f"{alias}_function.text AS {prefix}function"]
            joins += [
                f"LEFT JOIN frames {alias} ON {alias}.id = t.{column.name}",
                f"LEFT JOIN strings {alias}_file ON {alias}_file.id = {alias}.file_sid",
                f"LEFT JOIN strings {alias}_function ON {alias}_function.id = {alias}.function_sid",
            ]
    return (f"CREATE VIEW IF NOT EXISTS {kind.table}{VIEW_SUFFIX} AS SELECT {', '.join(selected)} "
            f"FROM {kind.table} t {' '.join(joins)}".rstrip())


def location_prefix(column: str, columns: Collection[str]) -> str:
    """What a view or a frame puts before `file`, `line` and `function` for frame column `column` of a table with
    `columns`: nothing, but for a second frame column beside `frame_id` (`transfers.origin_frame_id`: `origin_`)."""
    return column.removesuffix("frame_id") if column != "frame_id" and "frame_id" in columns else ""


def create_statements() -> list[str]:
    """DDL for a new trace file: the meta table, every record table, its indexes and the readable views."""
    return table_statements() + index_statements() + view_statements()
