"""Masks that route tokens: a mixture of experts selecting each expert's tokens with `x[chosen == e]`.

A data-dependent storm whose mask is a routing decision needs another fix than a masked loss: the counts are how
many tokens each expert got. The trace tells it by the module that made the mask: it chose with a top-k (or an
argmax, a max or a sort) and ran the data-dependent op several times per step at the same line (once per expert).
"""

from __future__ import annotations

from tputrace.analysis.context import AnalysisContext

_CHOOSING_OPS = ("aten.topk.%", "aten.argmax.%", "aten.max.dim%", "aten.sort.%", "aten.argsort.%")
MIN_SELECTIONS_PER_STEP = 2  # the mask's op at its line per step: one per expert

ROUTING_FIX = (
    "route with a fixed capacity per expert instead of selecting each expert's tokens: give every expert the same "
    "number of slots (`capacity = ceil(tokens * k / experts * 1.25)`), place each token in its expert's slots by a "
    "cumulative sum of the one-hot choice (`torch.cumsum(F.one_hot(chosen, experts), 0)`), drop or pass through "
    "the tokens past capacity with a mask, and gather and scatter by those slots, so each expert's input has one "
    "shape whatever the gate chose; with few experts, running each expert on every token and weighting its output "
    "by the gate (`w * expert(x)`, `w` zero for the tokens not routed to it) keeps the shapes fixed too"
)


def routes_tokens(context: AnalysisContext, family: str, frame_id: int | None, module: str | None) -> bool:
    """Whether the data-dependent op `family` at `frame_id` selects tokens routed by a choice: its module (or, with
    none, its function) chose with a top-k or an argmax, and the op ran several times a step at that line."""
    if frame_id is None:
        return False
    trace = context.trace
    counts = trace.sql(
        "SELECT COUNT(*), COUNT(DISTINCT COALESCE(o.step, 0)) FROM ops o JOIN strings s ON s.id = o.op_sid "
        "WHERE o.rank = ? AND o.frame_id = ? AND s.text LIKE ?",
        (context.rank, frame_id, f"{family}.%"),
    )
    calls, steps = counts[0] if counts else (0, 0)
    if not steps or calls / steps < MIN_SELECTIONS_PER_STEP:
        return False
    choosing = " OR ".join("s.text LIKE ?" for _ in _CHOOSING_OPS)
    if module is not None:
        module_sid = trace.string_id(module)
        return module_sid is not None and bool(trace.sql(
            f"SELECT 1 FROM ops o JOIN strings s ON s.id = o.op_sid WHERE o.rank = ? AND o.module_sid = ? AND ({choosing}) LIMIT 1",
            (context.rank, module_sid, *_CHOOSING_OPS),
        ))
    location = context.location(frame_id)
    if location is None:
        return False
    return bool(trace.sql(
        "SELECT 1 FROM ops o JOIN strings s ON s.id = o.op_sid JOIN frames f ON f.id = o.frame_id "
        f"JOIN strings fs ON fs.id = f.file_sid WHERE o.rank = ? AND fs.text = ? AND f.function_sid = "
        f"(SELECT function_sid FROM frames WHERE id = ?) AND ({choosing}) LIMIT 1",
        (context.rank, location.file, frame_id, *_CHOOSING_OPS),
    ))
