"""Data-dependent waits in a backward: the gradient of a selection by a mask (`x[mask]`, `masked_select`,
`nonzero`) is written back through the same positions (`masked_scatter`, `index_put_`), whose number the host must
learn again, so `loss.backward()` waits for the chip too. Nothing at the backward's line can change: the fix is the
forward's selection, whose own read is found at its line."""

from __future__ import annotations

import re

from tputrace.analysis.call_sites import line_text
from tputrace.analysis.context import AnalysisContext

DATA_DEPENDENT = "data_dependent"
BACKWARD_CALL = re.compile(r"(?:\.|\b)backward\(|\bautograd\.grad\(")
Key = tuple[int | None, str, int | None]  # (frame, sync kind, library frame)


def backward_selections(context: AnalysisContext, keys: list[Key]) -> dict[Key, tuple[str, ...]]:
    """For each data-dependent read at a line that calls a backward (`loss.backward()`, `torch.autograd.grad`), the
    forward lines whose data-dependent reads came in the steps it came in (the selections whose gradient it
    scatters back)."""
    reads = [key for key in keys if key[1] == DATA_DEPENDENT and key[0] is not None and key[2] is None]
    if len(reads) < 2:
        return {}
    backwards = [key for key in reads if BACKWARD_CALL.search(line_text(context.location(key[0]), context.trace) or "")]
    forwards = [key for key in reads if key not in backwards]
    if not backwards or not forwards:
        return {}
    where, params = context.loop_line_where()
    steps = {key: {step for (step,) in context.trace.sql(
        f"SELECT DISTINCT step FROM syncs WHERE {where} AND frame_id = ? AND kind = ?", (*params, key[0], DATA_DEPENDENT))}
        for key in reads}
    paired: dict[Key, tuple[str, ...]] = {}
    for backward in backwards:
        lines = sorted({context.where(key[0]) for key in forwards if steps[backward] & steps[key]})
        if lines and steps[backward] <= set().union(*(steps[key] for key in forwards)):
            paired[backward] = tuple(lines)
    return paired


def backward_text(where: str, forwards: tuple[str, ...]) -> tuple[str, str]:
    """The explanation's sentence and the suggestion for a backward's data-dependent read of the selections at
    `forwards`."""
    lines = ", ".join(forwards)
    return (
        f" The wait is in the backward of the selection at {lines}: its gradient is written back through the same "
        "positions (`masked_scatter`, `index_put_`), whose number the host must learn again.",
        f"Nothing at {where} can change: make the selection at {lines} keep a fixed shape (weight by the mask, or "
        f"`torch.where(mask, x, 0)` in place of `x[mask]`), as its own finding says, and this wait goes with it.",
    )
