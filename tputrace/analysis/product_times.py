"""The chip time of a group of matrix products, for costs read from how the target's matrix units run them.

A recorded run whose chips are XLA:CPU (virtual chips on the host's cores) measures the CPU's time for its products,
which says nothing of the target's MXU: a cost that follows from the MXU's behaviour (a float32 product's bfloat16
passes) is then the target's roofline time of the products (a projection from their FLOPs and bytes), not the CPU's
time scaled by the MXU's share, and its share of a step is of the step's projected chip time on the target, not of
the host's step on the CPU. On a TPU, and in an imported capture, the chip time is the measured one, attributed
by FLOP share (`matmuls.ChipTime`).
"""

from __future__ import annotations

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.imported import context_import_facts
from tputrace.analysis.matmuls import ChipTime, MatmulGroup
from tputrace.analysis.target import target_of
from tputrace.derived.projection import projected_steps


def on_cpu_chips(context: AnalysisContext) -> bool:
    """Whether the analysed rank is a recording whose chips were XLA:CPU's."""
    run = context.rank_run
    return run is not None and run.platform == "cpu" and context_import_facts(context) is None


def projected_ns(context: AnalysisContext, group: MatmulGroup) -> float:
    """The target's roofline time of the group's calls, at the float32 matmul precision they ran at (an estimate)."""
    return group.calls * sum(context.target.roofline_ns(product.flops, product.bytes, product.dtype, group.precision)
                             for product in group.products)


def group_chip_ns(context: AnalysisContext, times: ChipTime, group: MatmulGroup) -> float:
    """The group's chip time for a cost of the target's matrix units: projected on XLA:CPU chips, else as measured."""
    return projected_ns(context, group) if on_cpu_chips(context) else times.attributed_ns(context, group)


def projected_step_share(context: AnalysisContext, saving_ns: float) -> float | None:
    """A saving over the loop's steps, per step, as a share of the step's projected chip time on the target with that
    saving added back (the projection runs each program at the bf16 peak, where a float32 product's extra passes are
    not); None without steps or programs to project."""
    per_step = context.per_step(saving_ns)
    median_ns = projected_steps(context.trace, context.rank, target_of(context.target)).median_ns
    if per_step is None or median_ns is None or median_ns + per_step <= 0:
        return None
    return per_step / (median_ns + per_step)
