"""Reads that end an evaluation: a validation loss read once every few steps (between epochs, for early stopping or
a best checkpoint) waits for the model's forward that only that read makes run.

The read is periodic (`step_period`) and the programs it flushed ran ops inside the model's modules, or, for a
`torch.compile`d model, a compiled graph ran before it in its step with no backward graph after it (an inference
graph, made under `torch.no_grad()`, or a forward whose backward never ran): the wait is the evaluation's own
compute, not a loss the training steps had already computed. Reading less often or summing a
logged loss on the chip does not apply; reading once per evaluation, not once per batch, does.
"""

from __future__ import annotations

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.item_fixes import stacked_text, values_read

ONCE = ("The read at {where} ends an evaluation the loop runs every {every} steps (the forward of {modules} ran "
        "for it): the script needs its value on the host (early stopping, a best checkpoint), and it waits once per "
        "evaluation, for the evaluation's own compute. Nothing in it is wasted: evaluate less often only if the "
        "decision can wait.")
PER_BATCH = ("The reads at {where} end an evaluation the loop runs every {every} steps (the forward of {modules} "
             "ran for {them}), {count} at a time: add each batch's value into a tensor on the chip (`total += loss`) "
             "and read the total once after the evaluation loop, one wait per evaluation instead of {count}.")

TOGETHER = ("The reads at {where} end an evaluation the loop runs every {every} steps (the forward of {modules} ran "
            "for them): the line reads {count} values, each a wait for the chip in turn. Read them together in one "
            "transfer, `{stacked}.tolist()`, one wait per evaluation instead of {count}.")
PER_BATCH_TOGETHER = ("The reads at {where} end an evaluation the loop runs every {every} steps (the forward of "
                      "{modules} ran for them), {count} at a time, {values} values a batch, each a wait for the chip in "
                      "turn: add each batch's values, stacked, into one tensor on the chip (`totals += {stacked}`) and "
                      "read it once after the evaluation loop (`totals.tolist()`), one wait per evaluation instead of "
                      "{count}.")
# Reads the line already makes every few steps (an evaluation or a log under `if step % N == 0`).
PERIODIC = ("The line already reads every {every} steps, and each read still waits for the chip to finish the work "
            "queued before it: read less often (every {less_often} steps) or after the loop; for a logged loss, add "
            "`loss.detach()` into a tensor on the chip each step and read the sum when you log.")
PERIODIC_TOGETHER = (" The line reads {count} values each time, each a wait for the chip in turn: read them together "
                     "in one transfer, `{stacked}.tolist()`, one wait instead of {count}.")

KEPT_PER_BATCH = ("The copies at {where} end an evaluation the loop runs every {every} steps (the forward of {modules} "
                  "ran for them), {count} at a time, each kept in a list: append the tensors themselves (without "
                  "`.cpu()`/`.numpy()`/`.tolist()`) and copy them once after the evaluation loop "
                  "(`torch.cat(values).cpu()`), one wait per evaluation instead of {count}.")


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
    flushed = {str(text).split(".", 1)[0] for (text,) in rows if text}
    return tuple(sorted(flushed | _compiled_evaluations(context, frame_id, kind, steps)))


def _compiled_evaluations(context: AnalysisContext, frame_id: int, kind: str, steps: range) -> set[str]:
    """The functions (a module's class) of compiled graphs that ran before the line's reads in their steps and whose
    outputs no backward graph took: `Net.forward graph 1 inference` names `Net`."""
    if not context.trace.has_table("executions") or not context.trace.has_table("programs"):
        return set()
    reads = context.trace.sql(
        "SELECT step, start_ns FROM syncs WHERE rank = ? AND frame_id = ? AND kind = ? AND step BETWEEN ? AND ?",
        (context.rank, frame_id, kind, steps.start, steps.stop - 1),
    )
    reads_by_step: dict[int, list[int]] = {}
    for step, start_ns in reads:
        reads_by_step.setdefault(int(step), []).append(int(start_ns))
    if not reads_by_step:
        return set()
    rows = context.trace.sql(
        "SELECT e.step, e.start_ns, n.text FROM executions e JOIN programs p ON p.id = e.program_id AND p.rank = e.rank "
        "JOIN strings n ON n.id = p.name_sid WHERE e.rank = ? AND e.step BETWEEN ? AND ? AND p.kind = 'compiled' "
        "ORDER BY e.start_ns",
        (context.rank, min(reads_by_step), max(reads_by_step)),
    )
    graphs_by_step: dict[int, list[tuple[int, str]]] = {}
    for step, start_ns, name in rows:
        if int(step) in reads_by_step:
            graphs_by_step.setdefault(int(step), []).append((int(start_ns), str(name)))
    functions: set[str] = set()
    for step, graphs in graphs_by_step.items():
        first_read = min(reads_by_step[step])
        for start_ns, name in _without_backward(graphs):
            if start_ns < first_read:
                functions.add(name.partition(" graph ")[0].removesuffix(".forward").split(".", 1)[0])
    return functions


def _without_backward(graphs: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The inference graphs, and the forward graphs no backward of the same graph followed (each backward takes
    the latest forward of its graph still waiting, as autograd runs them)."""
    waiting: dict[str, list[tuple[int, str]]] = {}
    kept: list[tuple[int, str]] = []
    for start_ns, name in graphs:
        graph, _, part = name.rpartition(" ")
        if part == "inference" and " graph " in name:
            kept.append((start_ns, name))
        elif part == "forward" and " graph " in name:
            waiting.setdefault(graph, []).append((start_ns, name))
        elif part == "backward" and waiting.get(graph):
            waiting[graph].pop()
    kept.extend(graph for forwards in waiting.values() for graph in forwards)
    return kept


def periodic_suggestion(every: tuple[int, int], text: str) -> str:
    """The fix for reads a line makes `every[0]` at a time every `every[1]` steps (a log under `if step % N == 0`),
    with, for a line whose text reads several values (`print(loss.item(), acc.item())`) as many times each, reading
    them together."""
    count, names = values_read(text)
    together = (PERIODIC_TOGETHER.format(count=count, stacked=stacked_text(count, names))
                if count >= 2 and every[0] % count == 0 else "")
    return PERIODIC.format(every=every[1], less_often=4 * every[1]) + together


def evaluation_suggestion(where: str, every: tuple[int, int], modules: tuple[str, ...], *, kept: bool = False,
                          forward_read_at: str | None = None, text: str = "") -> str:
    """The fix for reads that end an evaluation run `every[0]` at a time every `every[1]` steps; `kept`: copies each
    appended to a list (predictions gathered for a metric), which are stacked, not summed; `forward_read_at`: the
    line whose reads in the same steps ran the forward, where this line's reads only waited for their metric; `text`:
    the line's, whose several reads (`print(loss.item(), acc.item())`) are read together, once per evaluation or once
    per evaluation loop where each batch makes them."""
    names = ", ".join(f"`{module}`" for module in modules[:3])
    count, values = values_read(text)
    if count >= 2 and not kept and every[0] % count == 0:
        stacked = stacked_text(count, values)
        if every[0] == count:
            return TOGETHER.format(where=where, every=every[1], modules=names, count=count, stacked=stacked)
        return PER_BATCH_TOGETHER.format(where=where, every=every[1], modules=names, count=every[0], values=count,
                                         stacked=stacked)
    if every[0] > 1 and kept:
        return KEPT_PER_BATCH.format(where=where, every=every[1], modules=names, count=every[0])
    if every[0] > 1:
        them = f"the reads at {forward_read_at}" if forward_read_at else "them"
        return PER_BATCH.format(where=where, every=every[1], modules=names, count=every[0], them=them)
    return ONCE.format(where=where, every=every[1], modules=names)
