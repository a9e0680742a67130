"""Waits in a backward that the backward's line cannot change. A data-dependent one: the gradient of a selection by a
mask (`x[mask]`, `masked_select`, `nonzero`) is written back through the same positions (`masked_scatter`,
`index_put_`), whose number the host must learn again; the fix is the forward's selection, whose own read is found at
its line. A copy to the host: a model split between the host and the chip (an embedding table left on the CPU, its
output copied to the chip) has autograd copy the gradient of that output back to the host for the host part's
backward, so `loss.backward()` waits for the chip; the fix is where the host part's output was copied in."""

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


HOST_COPIES = ("cpu",)


def host_part_gradients(context: AnalysisContext, keys: list[Key]) -> dict[Key, tuple[str, ...]]:
    """For each copy-to-host read at a line that calls a backward, the lines whose host-to-chip copies the backward
    copies back, as gradients of the same size: in every step the line reads in, each of its copies to the host has
    the bytes of a copy to the chip made earlier in that step at another line (a host module's output)."""
    reads = [key for key in keys if key[1] in HOST_COPIES and key[0] is not None and key[2] is None
             and BACKWARD_CALL.search(line_text(context.location(key[0]), context.trace) or "")]
    if not reads:
        return {}
    where, params = context.loop_line_where()
    paired: dict[Key, tuple[str, ...]] = {}
    for key in reads:
        backward_line = context.where(key[0])
        copies_out = context.trace.sql(
            f"SELECT step, bytes, start_ns FROM transfers WHERE {where} AND direction = 'd2h' AND frame_id = ?",
            (*params, key[0]))
        sources: set[str] | None = None
        for step, nbytes, start_ns in copies_out:
            lines = {context.where(frame_id) for (frame_id,) in context.trace.sql(
                f"SELECT frame_id FROM transfers WHERE {where} AND direction = 'h2d' AND step = ? AND bytes = ? "
                "AND start_ns < ? AND frame_id IS NOT NULL", (*params, step, nbytes, start_ns))} - {backward_line}
            sources = lines if sources is None else sources & lines  # a line copying in every step, not set-up's
            if not sources:
                break
        if sources:
            paired[key] = tuple(sorted(sources))
    return paired


def host_part_text(where: str, copied_at: tuple[str, ...]) -> tuple[str, str]:
    """The explanation's sentence and the suggestion for a backward's copy to the host of the gradients of what was
    copied to the chip at `copied_at`."""
    lines = ", ".join(copied_at)
    return (
        f" The copy is autograd sending back to the host the gradient of what {lines} copied to the chip (as many "
        "bytes each step): the model is split, its part before that copy on the host, whose backward needs the "
        "gradient there, so the backward waits for the chip to finish the part on it.",
        f"Nothing at {where} can change: move the part of the model that runs on the host before {lines} to the chip "
        "(its modules `.to(device)`, so only the input batch is copied in) and the forward and backward run on the "
        "chip with no copy back; an embedding table the chip's memory holds belongs there. Where it must stay on the "
        "host, this wait is the split's price every step.",
    )
