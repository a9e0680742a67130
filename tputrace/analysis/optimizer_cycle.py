"""Loops that step several optimizers in turn: a GAN's discriminator and generator, an actor and a critic.

A step ends at each `optimizer.step()` (unless the script marks steps itself), so a loop iteration that steps two
optimizers is two steps, and a line the loop runs once per iteration runs "every 2 steps". The optimizers' own
`Optimizer.step#...` ranges (torch.optim records one per call, at the line calling it) tell the cycle: each loop step
has one, and their lines repeat with a period of two or more distinct lines.
"""

from __future__ import annotations

from tputrace.analysis.context import AnalysisContext

_STEP_RANGE = "Optimizer.step#%"


def optimizer_cycle(context: AnalysisContext) -> tuple[str, ...]:
    """The lines (`gan.py:20`, `gan.py:24`) of the optimizer steps of one loop iteration, in order, when the loop's
    steps each end at one of several optimizers stepped in turn; () otherwise (cached on the context)."""
    cached = context.cache.get("optimizer_cycle")
    if cached is not None:
        return cached  # type: ignore[return-value]
    cycle = _cycle(context)
    context.cache["optimizer_cycle"] = cycle
    return cycle


def _cycle(context: AnalysisContext) -> tuple[str, ...]:
    loop = context.loop_range
    if loop is None or not context.trace.has_table("annotations"):
        return ()
    by_step: dict[int, list[int | None]] = {}
    for step, frame_id in context.trace.sql(
        "SELECT a.step, a.frame_id FROM annotations a JOIN strings s ON s.id = a.name_sid WHERE a.rank = ? "
        "AND s.text LIKE ? AND a.step BETWEEN ? AND ? ORDER BY a.start_ns",
        (context.rank, _STEP_RANGE, *loop),
    ):
        by_step.setdefault(step, []).append(frame_id)
    steps = range(loop[0], loop[1] + 1)
    if any(len(by_step.get(step, [])) != 1 for step in steps):
        return ()
    lines = [context.where(by_step[step][0]) for step in steps]
    for period in range(2, len(lines) // 2 + 1):
        first = lines[:period]
        if len(set(first)) == period and all(line == first[index % period] for index, line in enumerate(lines)):
            return tuple(first)
    return ()
