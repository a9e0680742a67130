"""Reads that end an evaluation: a validation loss read once every few steps (between epochs, for early stopping or
a best checkpoint) waits for the model's forward that only that read makes run.

The read is periodic (`step_period`) and the programs it flushed ran ops inside the model's modules: the wait is
the evaluation's own compute, not a loss the training steps had already computed. Reading less often or summing a
logged loss on the chip does not apply; reading once per evaluation, not once per batch, does.
"""

from __future__ import annotations

from tputrace.analysis.context import AnalysisContext

ONCE = ("The read at {where} ends an evaluation the loop runs every {every} steps (the forward of {modules} ran "
        "for it): the script needs its value on the host (early stopping, a best checkpoint), and it waits once per "
        "evaluation, for the evaluation's own compute. Nothing in it is wasted: evaluate less often only if the "
        "decision can wait.")
PER_BATCH = ("The reads at {where} end an evaluation the loop runs every {every} steps (the forward of {modules} "
             "ran for them), {count} at a time: add each batch's value into a tensor on the chip (`total += loss`) "
             "and read the total once after the evaluation loop, one wait per evaluation instead of {count}.")


def evaluation_modules(context: AnalysisContext, frame_id: int | None, kind: str, steps: range) -> tuple[str, ...]:
    """The top-level modules whose ops ran in the programs the line's reads of `kind` flushed in `steps` (none
    when the reads forced no model forward)."""
    if frame_id is None or not context.trace.has_table("flushes") or not context.trace.has_column("ops", "flush_id"):
        return ()
    rows = context.trace.sql(
        "SELECT DISTINCT m.text FROM flushes f JOIN ops o ON o.flush_id = f.id AND o.rank = f.rank "
        "JOIN strings m ON m.id = o.module_sid WHERE f.rank = ? AND f.frame_id = ? AND f.trigger = ? "
        "AND f.step BETWEEN ? AND ?",
        (context.rank, frame_id, kind, steps.start, steps.stop - 1),
    )
    return tuple(sorted({str(text).split(".", 1)[0] for (text,) in rows if text}))


def evaluation_suggestion(where: str, every: tuple[int, int], modules: tuple[str, ...]) -> str:
    """The fix for reads that end an evaluation run `every[0]` at a time every `every[1]` steps."""
    names = ", ".join(f"`{module}`" for module in modules[:3])
    if every[0] > 1:
        return PER_BATCH.format(where=where, every=every[1], modules=names, count=every[0])
    return ONCE.format(where=where, every=every[1], modules=names)
