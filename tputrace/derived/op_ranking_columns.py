"""`rank_ops`'s figures computed over columns (`tputrace.derived.op_columns`): the same model as the
row-by-row code in `tputrace.derived.op_ranking` and `tputrace.derived.device_runs`, with a few array
operations per trace instead of Python work per op, so that ranking millions of ops takes seconds.

Counts and ns of host dispatch come out exactly as the row-by-row code's; chip time is summed in
another order, so it can differ from it in the last bits of a float.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tputrace.derived.device_runs import PROGRAM_OPS_LABEL, is_strict
from tputrace.derived.op_columns import NULL_VALUE, dense_codes, packed_ids_sql, pair_codes, read_op_columns, sums_by
from tputrace.derived.op_cost import TargetChip
from tputrace.derived.strict_chip_time import strict_chip_time_by_op
from tputrace.derived.trace_tables import TraceTables

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

PACKED_KEY_LIMIT = 2**62
"""(op, inputs, outputs) string ids are read as one number when it stays below this."""


@dataclass(frozen=True)
class OpSums:
    """Per op string id (None: ops without one): calls, host dispatch and host dispatch without nested
    flushes and compiles; the nested ns of all ops; estimated chip ns per op name, and the names of ops that ran
    on a chip with nothing to project their time from (strict mode)."""

    calls: dict[int | None, int]
    dispatch_ns: dict[int | None, int]
    self_dispatch_ns: dict[int | None, int]
    nested_ns: int
    chip_ns: dict[str, float]
    unprojected: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RankingColumns:
    """What `op_sums` reads of a rank's ops, in file order: (op, inputs, outputs) string ids packed in
    one number (`width` per id, `width - 1` for NULL), start (NULL as `NULL_VALUE`), duration (NULL as
    0), and, for chip time outside strict mode, the flush of ops that ran in a program.
    Views that need the same columns (the Ops view's groups by op and shapes, the Timeline's dispatch
    lane) can take them from here instead of reading them again."""

    width: int
    strict: bool
    chip: bool
    columns: dict[str, np.ndarray]

    def ids(self, packed: np.ndarray, position: int) -> np.ndarray:
        """The string ids at `position` (0: op, 1: inputs, 2: outputs) of packed keys, NULL as `NULL_VALUE`."""
        ids = packed // self.width ** (2 - position) % self.width
        return np.where(ids == self.width - 1, NULL_VALUE, ids)


def read_ranking_columns(trace: Trace, rank: int, chip: bool) -> RankingColumns | None:
    """The columns `op_sums` needs (with those for chip time when `chip`), or None where they cannot be
    read as integers or the string ids do not pack."""
    (high_sid,), = trace.sql("SELECT MAX(id) FROM strings")
    width = (high_sid if high_sid is not None else 0) + 2  # string ids 0..width-2, and width-1 for NULL
    if width**3 >= PACKED_KEY_LIMIT:
        return None
    strict = chip and is_strict(trace, rank)
    expressions = {
        "key": packed_ids_sql(("op_sid", "inputs_sid", "outputs_sid"), width),
        "start": "start_ns",
        "dur": "COALESCE(dur_ns, 0)",
    }
    if chip and not strict:
        expressions["flush"] = "CASE WHEN program_id IS NULL THEN NULL ELSE flush_id END"
    columns = read_op_columns(trace, rank, expressions)
    if columns is None or (columns["key"] == NULL_VALUE).any():
        return None
    return RankingColumns(width, strict, chip, columns)


def op_sums(trace: Trace, rank: int, nested: list[tuple[int, int]], chip: TargetChip | None,
            read: RankingColumns | None = None) -> OpSums | None:
    """The figures `rank_ops` ranks by (from `read` when given, else read here), or None where the
    columns cannot be read as integers or the string ids do not pack (the caller then reads the rows
    one by one)."""
    if read is None or (chip is not None and not read.chip):
        read = read_ranking_columns(trace, rank, chip is not None)
    if read is None:
        return None
    width, strict, columns = read.width, read.strict, read.columns
    null_sid = width - 1
    key, start, dur = columns["key"], columns["start"], columns["dur"]
    op_sid = key // (width * width)
    # Host dispatch, and the part of it inside flushes and compiles (`_Covered.within`, over arrays).
    inside = nested_ns_of_calls(start, dur, nested)
    sids, op_index = dense_codes(op_sid)
    calls = np.bincount(op_index, minlength=len(sids))
    dispatch = sums_by(op_index, dur, len(sids))
    own = sums_by(op_index, dur - inside, len(sids))
    sid_of = [None if sid == null_sid else sid for sid in sids.tolist()]
    chip_ns: dict[str, float] = {}
    unprojected: frozenset[str] = frozenset()
    if chip is not None:
        tables = TraceTables(trace)

        def name_of(sid: int) -> str:
            return (tables.text(sid) if sid != null_sid else PROGRAM_OPS_LABEL) or "?"

        if strict:
            chip_ns, unprojected = strict_chip_time_by_op(trace, rank, chip, tables)
        else:
            by_name = _fused_chip_ns(trace, rank, chip, tables, key, columns["flush"], width, (sids, op_index), name_of)
            if by_name is None:
                return None
            chip_ns = by_name
    return OpSums(
        dict(zip(sid_of, calls.tolist())), dict(zip(sid_of, dispatch.tolist())), dict(zip(sid_of, own.tolist())),
        int(inside.sum()), chip_ns, unprojected,
    )


def _merged(intervals: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of `intervals` as sorted disjoint (starts, ends), and the covered ns before each (`_Covered`)."""
    pairs = np.array(sorted(intervals), dtype=np.int64).reshape(-1, 2)
    starts, ends = pairs[:, 0], np.maximum.accumulate(pairs[:, 1])
    first = np.flatnonzero(np.concatenate([[True], starts[1:] > ends[:-1]]))
    last = np.concatenate([first[1:] - 1, [len(starts) - 1]])
    starts, ends = starts[first], ends[last]
    before = np.concatenate([[0], np.cumsum(ends - starts)]).astype(np.int64)
    return starts, ends, before


def nested_ns_of_calls(start: np.ndarray, dur: np.ndarray, nested: list[tuple[int, int]]) -> np.ndarray:
    """Per op, the ns of its call covered by the nested intervals (`_Covered.within`; 0 without a start)."""
    inside = np.zeros(len(start), dtype=np.int64)
    if not nested or not len(start):
        return inside
    starts, ends, before = _merged(nested)
    has_start = start != NULL_VALUE
    finish = start + dur
    first = np.searchsorted(starts, start, side="right")
    # Only a call that reaches the next interval's start, or starts inside an interval, can be covered.
    next_start = np.append(starts, np.iinfo(np.int64).max)[first]
    candidates = np.flatnonzero(has_start & ((next_start <= finish) | ((first > 0) & (start < ends[np.maximum(first - 1, 0)]))))
    if len(candidates):
        ends_at = finish[candidates]
        last = np.searchsorted(starts, ends_at, side="right")
        inside[candidates] = (_upto(starts, ends, before, ends_at, last)
                              - _upto(starts, ends, before, start[candidates], first[candidates]))
    return inside


def _upto(starts: np.ndarray, ends: np.ndarray, before: np.ndarray, moments: np.ndarray, index: np.ndarray) -> np.ndarray:
    """How much of the merged intervals lies before each moment (`index`: the intervals starting at or before it)."""
    previous = np.maximum(index - 1, 0)
    covered = before[previous] + np.minimum(moments, ends[previous]) - starts[previous]
    return np.where(index == 0, 0, covered)


def _serialized_ns(chip: np.ndarray, start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """How long each run held its chip, runs of one chip taken one at a time in the given order
    (`device_runs._serialized`): each starts when the one before it ended."""
    ran = np.zeros(len(chip), dtype=np.int64)
    boundaries = np.flatnonzero(np.diff(chip)) + 1
    for rows in np.split(np.arange(len(chip)), boundaries):
        if not len(rows):
            continue
        begins = start[rows]
        ends = np.maximum.accumulate(np.maximum(begins + dur[rows], begins))
        previous_end = np.concatenate([begins[:1], ends[:-1]])
        ran[rows] = ends - np.maximum(begins, previous_end)
    return ran


def _fused_chip_ns(trace: Trace, rank: int, chip: TargetChip, tables: TraceTables, key: np.ndarray, flush: np.ndarray,
                   width: int, op_codes_of: tuple[np.ndarray, np.ndarray], name_of: object) -> dict[str, float] | None:
    """DeferAndFuse: each execution's measured time shared out among its flush's ops by their roofline
    times (`device_runs._run_with_ops`, `op_cost.make_layout`); executions of a flush without recorded
    ops by their program's fusions (`device_runs._run_with_fusions`)."""
    executions = trace.sql(
        "SELECT chip, program_id, start_ns, COALESCE(dur_ns, 0), flush_id FROM executions WHERE rank = ? ORDER BY chip, start_ns, rowid",
        (rank,),
    )
    if any(row[0] is None or row[2] is None for row in executions):
        return None
    run_chip, run_start, run_dur = (np.array([row[index] for row in executions], dtype=np.int64) for index in (0, 2, 3))
    held_ns = _serialized_ns(run_chip, run_start, run_dur).tolist()
    in_program = np.flatnonzero(flush != NULL_VALUE)
    flush_ids, flush_of_op = _group_codes(flush[in_program])
    flush_position = {flush_id: position for position, flush_id in enumerate(flush_ids.tolist())}
    chip_ns: dict[str, float] = {}
    with_ops: list[tuple[int, int, int]] = []  # (flush position, program id, ns held)
    for (_, program_id, _, _, flush_id), held in zip(executions, held_ns):
        position = flush_position.get(flush_id) if flush_id is not None else None
        if position is not None:
            with_ops.append((position, program_id, held))
            continue
        layout = tables.fusions_layout(chip, program_id)
        chip_ns[PROGRAM_OPS_LABEL] = chip_ns.get(PROGRAM_OPS_LABEL, 0.0) + float(sum(_durations(held, layout.roofline_ns, layout.total_ns)))
    if not with_ops:
        return chip_ns
    # Each op's cost from its shapes, once per distinct (op, inputs, outputs); the ops of each flush together.
    op_keys, op_codes = key[in_program], op_codes_of[1][in_program]
    order = None if (np.diff(flush_of_op) >= 0).all() else np.argsort(flush_of_op, kind="stable")
    if order is not None:
        op_keys, op_codes, flush_of_op = op_keys[order], op_codes[order], flush_of_op[order]
    input_codes, output_codes = (dense_codes(part)[1] for part in (op_keys // width % width, op_keys % width))
    cost_of_op = pair_codes(pair_codes(op_codes, input_codes), output_codes)
    first_of_cost = np.zeros(int(cost_of_op.max()) + 1, dtype=np.int64)
    first_of_cost[cost_of_op] = np.arange(len(cost_of_op))  # any op of a cost key stands for it
    costs = [tables.cost(*(None if part == width - 1 else part for part in (value // (width * width), value // width % width, value % width)))
             for value in op_keys[first_of_cost].tolist()]
    ns_per_byte = 1.0 / chip.hbm_bytes_per_ns
    cost_flops = np.array([cost.flops for cost in costs])
    cost_read = np.array([cost.read_bytes for cost in costs])
    cost_write = np.array([cost.write_bytes for cost in costs])
    cost_ns_per_flop = np.array([1.0 / chip.fp32_peak_flops_per_ns if cost.wide_floats else 1.0 / chip.peak_flops_per_ns for cost in costs])
    # Per cost key, the roofline's two sides before the run's scaling (compute ns per FLOP share, memory ns per byte share).
    cost_compute_ns = cost_flops * cost_ns_per_flop
    cost_memory_ns = (cost_read + cost_write) * ns_per_byte
    flush_count = len(flush_ids)
    ops_in_flush = np.bincount(flush_of_op, minlength=flush_count)
    flops_estimate = np.bincount(flush_of_op, weights=cost_flops[cost_of_op], minlength=flush_count)
    bytes_estimate = (np.bincount(flush_of_op, weights=cost_read[cost_of_op], minlength=flush_count)
                      + np.bincount(flush_of_op, weights=cost_write[cost_of_op], minlength=flush_count))
    # The runs: usually one per flush; a flush run on several chips has its ops once per run.
    run_flush = np.array([position for position, _, _ in with_ops], dtype=np.int64)
    if len(run_flush) == flush_count and (run_flush == np.arange(flush_count)).all():
        run_of, op_rows = flush_of_op, None
    else:
        first_op = np.concatenate([[0], np.cumsum(ops_in_flush)[:-1]])
        run_lengths = ops_in_flush[run_flush]
        run_of = np.repeat(np.arange(len(run_flush)), run_lengths)
        op_rows = first_op[run_flush][run_of] + np.arange(len(run_of)) - np.repeat(np.cumsum(run_lengths) - run_lengths, run_lengths)
    run_costs = cost_of_op if op_rows is None else cost_of_op[op_rows]
    programs = [tables.programs.get(program_id) for _, program_id, _ in with_ops]
    run_flops_estimate, run_bytes_estimate = flops_estimate[run_flush], bytes_estimate[run_flush]
    program_flops = np.array([program.flops if program is not None and program.flops is not None else np.nan for program in programs])
    program_bytes = np.array([program.bytes_accessed if program is not None and program.bytes_accessed is not None else np.nan
                              for program in programs])
    program_flops = np.where(np.isnan(program_flops), run_flops_estimate, program_flops)
    program_bytes = np.where(np.isnan(program_bytes), run_bytes_estimate, program_bytes)
    run_ops = ops_in_flush[run_flush].astype(np.float64)
    run_held = np.array([held for _, _, held in with_ops], dtype=np.float64)
    # `make_layout`: a run's ops share its program's FLOPs and bytes by their estimates, or evenly where
    # the estimates are zero (a division by zero here, replaced below).
    with np.errstate(divide="ignore", invalid="ignore"):
        compute_ns = cost_compute_ns[run_costs] * (program_flops / run_flops_estimate)[run_of]
        memory_ns = cost_memory_ns[run_costs] * (program_bytes / run_bytes_estimate)[run_of]
        unestimated = np.flatnonzero((run_flops_estimate == 0)[run_of])
        compute_ns[unestimated] = (program_flops / run_ops)[run_of[unestimated]] * cost_ns_per_flop[run_costs[unestimated]]
        unestimated = np.flatnonzero((run_bytes_estimate == 0)[run_of])
        memory_ns[unestimated] = (program_bytes / run_ops)[run_of[unestimated]] * ns_per_byte
        roofline = np.maximum(compute_ns, memory_ns)
        total = np.bincount(run_of, weights=roofline, minlength=len(run_flush))
        durations = roofline * (run_held / total)[run_of]
        untimed = np.flatnonzero((total == 0)[run_of])
        durations[untimed] = (run_held / run_ops)[run_of[untimed]]
    op_names = op_codes if op_rows is None else op_codes[op_rows]
    sids = op_codes_of[0]
    for sid, total_ns in zip(sids.tolist(), np.bincount(op_names, weights=durations, minlength=len(sids)).tolist()):
        name = name_of(sid)  # type: ignore[operator]
        chip_ns[name] = chip_ns.get(name, 0.0) + total_ns
    return chip_ns


def _group_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`dense_codes`, cheaper for values that come in runs of equal values in increasing order (flush ids in file order)."""
    if len(values) and (np.diff(values) >= 0).all():
        starts = np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]]))
        return values[starts], np.cumsum(np.concatenate([[False], values[1:] != values[:-1]]))
    return dense_codes(values)


def _durations(dur_ns: int, roofline_ns: list[float], total_ns: float) -> list[float]:
    if total_ns:
        scale = dur_ns / total_ns
        return [value * scale for value in roofline_ns]
    return [dur_ns / len(roofline_ns)] * len(roofline_ns)

