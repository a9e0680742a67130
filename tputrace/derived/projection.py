"""Step times projected for a target chip, beside the ones measured on the host that recorded the trace.

A run on XLA:CPU measures host dispatch, syncs and compiles as they were there; its program times are
the CPU's. The projection asks what the chip would take: per step, the sum over the programs run of
their roofline time on the target (XLA's FLOPs at the chip's bf16 peak, or XLA's bytes at its HBM
bandwidth, whichever is longer). It is a lower bound on chip time: it leaves out host dispatch, syncs,
transfers, compiles and any time the chip waits, and assumes peak rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.derived.imported_sources import imported_device, measured_on
from tputrace.derived.op_cost import TargetChip
from tputrace.derived.steps import LOOP_STEPS_WHERE, loop_step_durations, steady_median, steady_median_ns

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

PROJECTION_NOTE = ("the programs' XLA FLOPs and bytes at the chip's bf16 peak and HBM bandwidth: a lower bound "
                   "on chip time, without host dispatch, syncs and compiles")
CPU_ONLY_NOTE = ("a CPU-only run (XLA:CPU) tells which lines sync, recompile, copy and fall back, and how often; its "
                 "program and compile times are the CPU's, so chip time is only projected, and a TPU's own times, "
                 "memory limits and numerics need a run on one")


@dataclass(frozen=True)
class ProjectedSteps:
    """Per training step of a rank: the projected chip time on `target` (ns), and their median over the
    steady steps (None where no execution had XLA's costs: nothing to project from); `programs_costed` and
    `programs_run` say how many executions had XLA's costs."""

    target: str
    by_step: dict[int, float]
    median_ns: float | None
    programs_costed: int
    programs_run: int


_FINITE_COSTS = ("CASE WHEN p.flops BETWEEN 0 AND 1e300 THEN p.flops END, "
                 "CASE WHEN p.bytes_accessed BETWEEN 0 AND 1e300 THEN p.bytes_accessed END")


def projected_steps(trace: Trace, rank: int, chip: TargetChip) -> ProjectedSteps:
    """The projected chip time per loop step of `rank` on `chip` (steps as `loop_step_durations` counts them):
    its program executions, and in strict eager each op's own program. A program whose costs are not finite
    non-negative numbers (a damaged file) counts as not costed."""
    ns_per_flop = 1.0 / chip.peak_flops_per_ns
    ns_per_byte = 1.0 / chip.hbm_bytes_per_ns
    by_step: dict[int, float] = {}
    costed = total = 0
    for step, flops, bytes_accessed, runs in trace.sql(
        f"SELECT e.step, {_FINITE_COSTS}, COUNT(*) FROM executions e LEFT JOIN programs p ON p.id = e.program_id "
        "WHERE e.rank = ? GROUP BY e.step, e.program_id "
        # Strict eager's ops are each a program of its own, launched at the op, with no `executions` row.
        f"UNION ALL SELECT o.step, {_FINITE_COSTS}, COUNT(*) FROM ops o JOIN programs p ON p.id = o.program_id "
        "WHERE o.rank = ? AND o.flush_id IS NULL AND p.kind = 'op' GROUP BY o.step, o.program_id", (rank, rank)
    ):
        total += runs
        if flops is None and bytes_accessed is None:
            continue
        costed += runs
        roofline = max((flops or 0.0) * ns_per_flop, (bytes_accessed or 0.0) * ns_per_byte)
        by_step[step] = by_step.get(step, 0.0) + roofline * runs
    loop_steps = [step for (step,) in trace.sql(
        f"SELECT step FROM steps WHERE {LOOP_STEPS_WHERE} ORDER BY step",
        (rank,))]
    projected = [by_step.get(step, 0.0) for step in loop_steps]
    return ProjectedSteps(chip.name, dict(zip(loop_steps, projected)), steady_median(projected) if costed else None,
                          costed, total)


def step_metadata(trace: Trace, rank: int, chip: TargetChip) -> dict[str, object]:
    """The step figures an export carries in its metadata, each saying what it is, as the summary gives them."""
    durations = loop_step_durations(trace, rank)
    projected = projected_steps(trace, rank, chip)
    return {
        "rank": rank,
        "steps": len(durations),
        "median_step_ns": steady_median_ns(durations),
        "median_step_basis": f"measured on {measured_on(imported_device(trace, rank))}",
        "projected_median_step_ns": projected.median_ns,
        "projected_for": chip.name,
        "projection": PROJECTION_NOTE,
    }
