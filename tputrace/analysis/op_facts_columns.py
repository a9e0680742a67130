"""The figures of `tputrace.analysis.op_facts.OpFacts` computed over a rank's ops columns (numpy): one
read of the ops for what the analyzers' GROUP BY and DISTINCT queries over them give, with a few array
operations."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tputrace.derived.op_columns import NULL_VALUE, dense_codes, packed_ids_sql, read_op_columns, sums_by

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

PACKED_PAIR_LIMIT = 2**62
"""(module, outputs) string ids are read as one number when it stays below this."""


StepFacts = dict[int, tuple[int, int]]
"""(ops, dispatch ns) per step."""
PairFacts = tuple[tuple[int, int | None], ...]
"""Distinct (module, outputs) string ids in the order they first occur."""


def read_op_facts(trace: Trace, rank: int) -> tuple[int, StepFacts, PairFacts] | None:
    """The rank's op count, ops and dispatch per step, and (module, outputs) pairs (`OpFacts`'s fields),
    or None where the columns cannot be read as integers or the string ids do not pack (the SQL queries
    give the figures then)."""
    (high_sid,), = trace.sql("SELECT MAX(id) FROM strings")
    width = (high_sid if high_sid is not None else 0) + 2  # string ids 0..width-2, and width-1 for NULL
    if width**2 >= PACKED_PAIR_LIMIT:
        return None
    columns = read_op_columns(trace, rank, {
        "step": "step",
        "dur": "COALESCE(dur_ns, 0)",
        "pair": packed_ids_sql(("module_sid", "outputs_sid"), width),
    })
    if columns is None or (columns["pair"] == NULL_VALUE).any():
        return None
    return len(columns["step"]), _by_step(columns["step"], columns["dur"]), _module_outputs(columns["pair"], width)


def _by_step(steps: np.ndarray, durations: np.ndarray) -> StepFacts:
    """(ops, dispatch ns) per step; ops without a step (NULL) left out, as `BETWEEN` leaves them out."""
    if (steps == NULL_VALUE).any():
        with_step = steps != NULL_VALUE
        steps, durations = steps[with_step], durations[with_step]
    values, codes = dense_codes(steps)
    counts = np.bincount(codes, minlength=len(values))
    totals = sums_by(codes, durations, len(values))
    return {int(step): (int(count), int(total)) for step, count, total in zip(values, counts, totals)}


def _module_outputs(pairs: np.ndarray, width: int) -> PairFacts:
    """The distinct (module, outputs) pairs with a module, in the order they first occur."""
    if (pairs >= (width - 1) * width).any():
        pairs = pairs[pairs < (width - 1) * width]  # module NULL
    values, codes = dense_codes(pairs)
    first = np.full(len(values), len(pairs), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(pairs), dtype=np.int64))
    distinct = []
    for packed in values[np.argsort(first)]:
        module, outputs = divmod(int(packed), width)
        distinct.append((module, None if outputs == width - 1 else outputs))
    return tuple(distinct)

