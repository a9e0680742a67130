"""Index lists in a changing batch: a scatter (`index_add_`, `scatter_reduce`) whose index tensor changes length from
program to program is fed a list of positions, as a graph network's edge list, whose padding is indices of a dummy
row, not a mask in attention and the loss."""

from __future__ import annotations

import re
from collections.abc import Sequence

from tputrace.analysis.context import AnalysisContext, in_list

_SCATTERS = ("aten.index_add", "aten.index_add_", "aten.scatter", "aten.scatter_", "aten.scatter_add", "aten.scatter_add_",
             "aten.scatter_reduce", "aten.scatter_reduce_")  # not `index_put_`: `x[mask] = 0` is one too
# The first integer tensor of an op's inputs (`f32[8,32], i64[29], f32[29,32]`): a scatter's index.
_INDEX_SHAPE = re.compile(r"\b(?:i64|i32|s64|s32)\[([\d,]*)\]")
_ROWS = re.compile(r"^\s*\w+\[(\d+)")  # dim 0 of the op's first input: the rows a scatter writes into


def _scatter_sids(context: AnalysisContext) -> list[int]:
    return [sid for (sid, text) in context.trace.sql(
        "SELECT id, text FROM strings WHERE text LIKE 'aten.index_add%' OR text LIKE 'aten.scatter%'")
        if str(text).rsplit(".", 1)[0] in _SCATTERS]


def scatters_at(context: AnalysisContext, frame_id: int | None) -> bool:
    """Whether the loop ran a scatter (`index_add_`, `scatter_reduce`) at `frame_id`'s line."""
    if frame_id is None:
        return False
    op_sids = _scatter_sids(context)
    if not op_sids:
        return False
    where, params = context.loop_where("o")
    return bool(context.trace.sql(
        f"SELECT 1 FROM ops o JOIN frames f ON f.id = o.frame_id JOIN frames sf ON sf.id = ? WHERE {where} "
        f"AND o.op_sid IN {in_list(op_sids)} AND f.file_sid = sf.file_sid AND f.line = sf.line LIMIT 1",
        (frame_id, *params, *op_sids)))


def scatter_of_changing_index(context: AnalysisContext, program_ids: Sequence[int]) -> int | None:
    """The frame of a scatter in the programs whose index tensor took more than one length across them (a graph's
    edges, whose number each batch sets); None when no scatter's index changed."""
    op_sids = _scatter_sids(context)
    if not op_sids or not program_ids or not context.trace.has_column("ops", "inputs_sid"):
        return None
    rows = context.trace.sql(
        f"SELECT o.frame_id, i.text FROM ops o JOIN strings i ON i.id = o.inputs_sid WHERE o.rank = ? "
        f"AND o.op_sid IN {in_list(op_sids)} AND o.program_id IN {in_list(program_ids)} AND o.frame_id IS NOT NULL",
        (context.rank, *op_sids, *program_ids),
    )
    shapes: dict[int, set[str]] = {}
    for frame_id, inputs in rows:
        index = _INDEX_SHAPE.search(str(inputs))
        if index is not None:
            shapes.setdefault(int(frame_id), set()).add(index.group(1))
    return next((frame_id for frame_id, lengths in shapes.items() if len(lengths) > 1), None)


def scattered_rows_vary(context: AnalysisContext, program_ids: Sequence[int]) -> bool:
    """Whether the scatters in the programs wrote into tensors of more than one row count (graphs of several node
    counts); a fixed count (every batch's graph over the same nodes) needs no padding of its rows."""
    op_sids = _scatter_sids(context)
    if not op_sids or not program_ids or not context.trace.has_column("ops", "inputs_sid"):
        return True
    rows: dict[str, set[str]] = {}
    for op_sid, inputs in context.trace.sql(
        f"SELECT DISTINCT o.op_sid, i.text FROM ops o JOIN strings i ON i.id = o.inputs_sid WHERE o.rank = ? "
        f"AND o.op_sid IN {in_list(op_sids)} AND o.program_id IN {in_list(program_ids)}",
        (context.rank, *op_sids, *program_ids),
    ):
        first = _ROWS.match(str(inputs))
        if first is not None:
            rows.setdefault(str(op_sid), set()).add(first.group(1))
    return not rows or any(len(counts) > 1 for counts in rows.values())
