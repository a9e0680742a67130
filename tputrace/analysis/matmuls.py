"""The run's matrix products (matmul, linear, conv, attention), grouped by op, shapes, module, line and
float32 matmul precision, and how much chip time each group accounts for. Shared by the padding and
precision analyzers.

A group's precision is the `torch.set_float32_matmul_precision` setting its programs' products ran at
(`compiles.detail`'s `matmul_precision`); a program without one (an older trace, or no float32
products) ran at "highest". A fused program whose products ran at several settings counts at the
fullest of them.

Chip time of a group is attributed from measured program executions by FLOP share (the group's
FLOPs over the FLOPs of every program executed, from XLA's cost analysis, or over all matmul FLOPs
when that is larger), where the chip time is the chip's busy time (`AnalysisContext.busy_by_step`). Without executions (strict
mode), the chip time is the chip's work inside the ops' recorded times (`strict_times`) and the FLOPs are those of the
ops' programs; without either, it is the target chip's roofline time for the group (an estimate).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext, in_list
from tputrace.analysis.strict_times import strict_steps
from tputrace.analysis.shapes import Matmul, matmuls_of, op_family


@dataclass(frozen=True)
class MatmulGroup:
    """Calls of one matmul-like op with one set of input shapes, from one module and line."""

    op: str
    inputs: str
    module: str | None
    frame_id: int | None
    calls: int
    products: tuple[Matmul, ...]
    precision: str = "highest"  # the float32 matmul precision setting its products ran at

    @property
    def flops(self) -> float:
        return self.calls * sum(product.flops for product in self.products)


@dataclass(frozen=True)
class ChipTime:
    """How matmul FLOPs turn into chip time in this run."""

    execution_ns: float
    execution_flops: float
    matmul_flops: float = 0.0
    inferred: bool = False  # strict mode: the chip's work inside the ops' recorded times, not executions

    @property
    def measured(self) -> bool:
        return self.execution_ns > 0 and self.execution_flops > 0

    def attributed_ns(self, context: AnalysisContext, group: MatmulGroup) -> float:
        """Chip time for `group`: measured by FLOP share when possible, else the target's roofline (estimate)."""
        if self.measured:
            return group.flops / max(self.execution_flops, self.matmul_flops) * self.execution_ns
        return group.calls * sum(
            context.target.roofline_ns(product.flops, product.bytes, product.dtype, group.precision) for product in group.products
        )


def matmul_groups(context: AnalysisContext) -> list[MatmulGroup]:
    """Matmul-like ops dispatched in the loop's steps, grouped by op, inputs, module and line."""
    cached = context.cache.get("matmul_groups")
    if cached is not None:
        return cached  # type: ignore[return-value]
    trace = context.trace
    # Candidate op names come from the (small) strings table, so the ops query below only reads matmul rows
    # through the op_sid index.
    op_sids = [sid for sid, text in trace.sql("SELECT id, text FROM strings WHERE text LIKE 'aten.%'")
               if op_family(text) is not None]
    groups: list[MatmulGroup] = []
    if op_sids:
        where, params = context.loop_where()
        rows = trace.sql(
            "SELECT op_sid, inputs_sid, module_sid, frame_id, program_id, COUNT(*) FROM ops "
            f"WHERE {where} AND op_sid IN {in_list(op_sids)} GROUP BY op_sid, inputs_sid, module_sid, frame_id, program_id",
            tuple(params) + tuple(op_sids),
        )
        precisions = program_precisions(context)
        calls_by_group: Counter[tuple[int, int, int | None, int | None, str]] = Counter()
        for op_sid, inputs_sid, module_sid, frame_id, program_id, calls in rows:
            calls_by_group[(op_sid, inputs_sid, module_sid, frame_id, precisions.get(program_id, "highest"))] += calls
        for (op_sid, inputs_sid, module_sid, frame_id, precision), calls in calls_by_group.items():
            op, inputs = trace.string(op_sid) or "", trace.string(inputs_sid) or ""
            products = tuple(matmuls_of(op, inputs))
            if products:
                groups.append(MatmulGroup(op, inputs, trace.string(module_sid), frame_id, calls, products, precision))
    context.cache["matmul_groups"] = groups
    return groups


_FULLEST_FIRST = ("highest", "high", "medium")


def program_precisions(context: AnalysisContext) -> dict[int, str]:
    """The float32 matmul precision setting of each program that recorded one."""
    precisions: dict[int, str] = {}
    for program_id, detail in context.trace.sql(
        "SELECT program_id, detail FROM compiles WHERE program_id IS NOT NULL AND detail LIKE '%matmul_precision%'"
    ):
        recorded = json.loads(detail).get("matmul_precision")
        if isinstance(recorded, str):
            names = recorded.split(",")
            precisions[program_id] = next((name for name in _FULLEST_FIRST if name in names), "highest")
    return precisions


def chip_time(context: AnalysisContext) -> ChipTime:
    """The chip's busy time in the loop's steps and the FLOPs it executed."""
    cached = context.cache.get("chip_time")
    if cached is not None:
        return cached  # type: ignore[return-value]
    where, params = context.loop_where("e")
    (execution_flops,) = context.trace.sql(
        f"SELECT COALESCE(SUM(p.flops), 0) FROM executions e LEFT JOIN programs p ON p.id = e.program_id WHERE {where}",
        params,
    )[0]
    busy_ns = sum(context.busy_by_step().values())
    matmul_flops = sum(group.flops for group in matmul_groups(context))
    strict = strict_steps(context)
    if strict:
        o_where, o_params = context.loop_where("o")
        (op_flops,) = context.trace.sql(
            f"SELECT COALESCE(SUM(p.flops), 0) FROM ops o JOIN programs p ON p.id = o.program_id WHERE {o_where}",
            o_params,
        )[0]
        waited_ns = sum(step.chip_ns for step in strict.values())
        result = ChipTime(float(waited_ns), float(op_flops), matmul_flops, inferred=True)
        context.cache["chip_time"] = result
        return result
    result = ChipTime(float(busy_ns), float(execution_flops), matmul_flops)
    context.cache["chip_time"] = result
    return result
