"""Strict mode's (DEFER_NEVER) chip time per op, projected for a target chip: each op ran as an XLA program of
its own, so its chip time is that program's roofline on the target, not the time measured on the recording host."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tputrace.derived.op_cost import TargetChip, make_layout
from tputrace.derived.trace_tables import TraceTables

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


def strict_chip_time_by_op(trace: Trace, rank: int, chip: TargetChip,
                           tables: TraceTables | None = None) -> tuple[dict[str, float], frozenset[str]]:
    """Strict mode: projected chip ns per op name on `chip`. Each op ran as an XLA program of its own, so
    its chip time is that program's roofline (its XLA FLOPs and bytes, or its shapes' estimate where XLA
    gave none; `op_cost.make_layout`), not the time measured on the recording host. Ops with nothing to
    project from (no costs at all) are left out, and named apart: the ops none of whose calls could be projected."""
    tables = tables or TraceTables(trace)
    chip_ns: dict[str, float] = {}
    ran: set[str] = set()
    for op_sid, inputs_sid, outputs_sid, program_id, runs in trace.sql(
            "SELECT op_sid, inputs_sid, outputs_sid, program_id, COUNT(*) FROM ops WHERE rank = ? AND program_id IS NOT NULL "
            "AND chip >= 0 GROUP BY op_sid, inputs_sid, outputs_sid, program_id", (rank,)):
        program = tables.programs.get(program_id)
        key = (program_id, 0, op_sid, inputs_sid, outputs_sid, None, None, None)
        layout = make_layout(0, [key], program.flops if program is not None else None,
                             program.bytes_accessed if program is not None else None,
                             chip, [tables.cost(op_sid, inputs_sid, outputs_sid)])
        name = tables.text(op_sid) or "?"
        ran.add(name)
        if layout.total_ns > 0:
            chip_ns[name] = chip_ns.get(name, 0.0) + layout.total_ns * runs
    return chip_ns, frozenset(ran - chip_ns.keys())
