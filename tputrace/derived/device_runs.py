"""The device timeline: where each program execution and its ops sit on a chip, rebuilt from a trace.

Two things on the chip are estimates, and say so:
- Time inside a program. The trace records when each program ran on a chip, not when each op inside
  it ran, so the program's measured time is shared out among its ops by `tputrace.derived.op_cost`.
- When a program started. A recorded execution runs from when the host queued the program until it
  finished, so executions overlap; the chip runs one at a time, so each starts here when the one
  before it ended (`ProgramRun.queued_ns` says by how much it moved).

Both exports (XProf and Perfetto) draw this model; nothing here imports torch or jax.
"""

from __future__ import annotations

import operator
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate, groupby
from typing import TYPE_CHECKING, Any, NamedTuple

from tputrace.derived.op_cost import RunLayout, TargetChip
from tputrace.derived.trace_tables import CHIP, DUR, FLUSH, FRAME, INPUTS, MODULE, OP, OUTPUTS, PROGRAM, SEQ, START, STEP, OpBatch, TraceTables

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

PROGRAM_OPS_LABEL = "(programs without recorded ops)"
"""What op rankings call the chip time of programs that ran without recorded ops (their XLA fusions)."""
_FLUSH_OF = operator.itemgetter(FLUSH)
_SEQ_OF = operator.itemgetter(SEQ)
_NULL = -(1 << 63)  # a missing value in an int column


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
    executions = _Executions(_serialized(row for rows in trace.sql_batches(
        "SELECT chip, program_id, start_ns, dur_ns, step, flush_id FROM executions WHERE rank = ? ORDER BY chip, start_ns, rowid",
        (rank,),
    ) for row in rows))
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
                for execution in executions.take(group_flush):
                    yield _run_with_ops(tables, chip, execution, group)
            if flush_id in closed:
                raise FlushesInterleaved(f"the ops of flush {flush_id} are not contiguous in {trace.path}")
            group, group_flush = list(flush_rows), flush_id
    if group_flush is not None:
        for execution in executions.take(group_flush):
            yield _run_with_ops(tables, chip, execution, group)
    for execution in executions.left():
        yield _run_with_fusions(tables, chip, execution)


class _Executions:
    """A rank's executions as `_serialized` gives them, kept as int columns (a trace can have one per
    fifty ops) and found by flush: `take` gives a flush's once, `left` those no flush took."""

    def __init__(self, rows: Iterable[tuple[Any, ...]]) -> None:
        self._columns = [array("q") for _ in range(7)]
        self._rows: list[tuple[Any, ...]] = []  # all of them instead, when a value is not an int
        for row in rows:
            if not self._rows and all(type(value) is int for value in row if value is not None):
                for column, value in zip(self._columns, row):
                    column.append(_NULL if value is None else value)
            else:
                if not self._rows:
                    self._rows = list(map(self._row, range(len(self._columns[0]))))
                    self._columns = [array("q") for _ in range(7)]
                self._rows.append(row)
        flushes = [_NULL if row[5] is None else row[5] for row in self._rows] if self._rows else self._columns[5]
        self._by_flush = array("q", sorted(range(len(flushes)), key=flushes.__getitem__))
        self._flushes = array("q", [flushes[index] for index in self._by_flush])
        self._taken = bytearray(len(flushes))  # per position in flush order: its flush's executions were given

    def _row(self, index: int) -> tuple[Any, ...]:
        if self._rows:
            return self._rows[index]
        return tuple(None if column[index] == _NULL else column[index] for column in self._columns)

    def take(self, flush_id: int) -> list[tuple[Any, ...]]:
        """The executions of `flush_id` in chip order, the first time it is asked for; none after."""
        first = bisect_left(self._flushes, flush_id)
        if first == len(self._flushes) or self._flushes[first] != flush_id or self._taken[first]:
            return []
        self._taken[first] = 1
        last = bisect_right(self._flushes, flush_id)
        return [self._row(index) for index in self._by_flush[first:last]]

    def left(self) -> Iterator[tuple[Any, ...]]:
        """The executions without a flush, then those of flushes not taken, each flush's together,
        flushes in the order of their first execution."""
        count = len(self._by_flush)
        for index in range(count):
            execution = self._row(index)
            if execution[5] is None:
                yield execution
        for index in range(count):
            execution = self._row(index)
            if execution[5] is not None:
                yield from self.take(execution[5])


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


def _place(run: ProgramRun, layout: RunLayout) -> None:
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

