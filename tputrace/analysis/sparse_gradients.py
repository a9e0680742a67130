"""Sparse gradients held dense: an `nn.Embedding(sparse=True)` or `nn.EmbeddingBag(sparse=True)` whose
gradient the tpu device computed dense (XLA has no sparse tensors; the backend records the backward under
its sparse name). The run trains, but the script asks for a layout a TPU does not have: one finding per
table, at the forward's line, telling what a TPU port uses instead. Part of the `fallbacks` analyzer's
findings: the backend ran something other than what the script asked for."""

from __future__ import annotations

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Finding
from tputrace.wording import plural

# The backward recorded for a sparse gradient, and the forward ops whose weight it is the gradient of.
SPARSE_BACKWARDS: dict[str, tuple[str, ...]] = {
    "aten.embedding_sparse_backward.default": ("aten.embedding.default",),
    "aten._embedding_bag_sparse_backward.default": ("aten._embedding_bag.default", "aten._embedding_bag_forward_only.default"),
}
MODULE_OF: dict[str, str] = {
    "aten.embedding_sparse_backward.default": "nn.Embedding",
    "aten._embedding_bag_sparse_backward.default": "nn.EmbeddingBag",
}


def sparse_gradient_findings(context: AnalysisContext, analyzer: str) -> list[Finding]:
    """One info finding per weight whose sparse gradient was held dense, at the line that looked it up."""
    trace = context.trace
    findings: list[Finding] = []
    for backward, forwards in SPARSE_BACKWARDS.items():
        backward_sid = trace.string_id(backward)
        if backward_sid is None:
            continue
        rows = trace.sql(
            "SELECT outputs_sid, COUNT(*), COUNT(DISTINCT step), MIN(frame_id) FROM ops WHERE rank = ? AND op_sid = ? "
            "GROUP BY outputs_sid ORDER BY 2 DESC",
            (context.rank, backward_sid),
        )
        for outputs_sid, count, steps_with, backward_frame in rows:
            weight = trace.string(outputs_sid) or "?"
            frame_id, module_sid = _forward_site(context, forwards, weight)
            findings.append(_finding(context, analyzer, backward, weight, (count, steps_with, backward_frame),
                                     frame_id if frame_id is not None else backward_frame, trace.string(module_sid)))
    return findings


def _forward_site(context: AnalysisContext, forwards: tuple[str, ...], weight: str) -> tuple[int | None, int | None]:
    """The line (and module) that looked up a weight of shape `weight` most often: its first input."""
    trace = context.trace
    sids = [sid for sid in (trace.string_id(forward) for forward in forwards) if sid is not None]
    if not sids:
        return None, None
    pattern = weight.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + ",%"
    rows = trace.sql(
        f"SELECT o.frame_id, o.module_sid, COUNT(*) FROM ops o JOIN strings s ON s.id = o.inputs_sid "
        f"WHERE o.rank = ? AND o.op_sid IN ({', '.join('?' for _ in sids)}) AND s.text LIKE ? ESCAPE '\\' "
        "AND o.frame_id IS NOT NULL GROUP BY o.frame_id, o.module_sid ORDER BY 3 DESC LIMIT 1",
        (context.rank, *sids, pattern),
    )
    return (rows[0][0], rows[0][1]) if rows else (None, None)


def _finding(context: AnalysisContext, analyzer: str, backward: str, weight: str, calls: tuple[int, int, int | None],
             frame_id: int | None, module: str | None) -> Finding:
    """`calls`: the backward's calls, the steps with one, and its line."""
    count, steps_with, backward_frame = calls
    kind = MODULE_OF[backward]
    where = context.where(frame_id)
    named = f" (`{module}`)" if module else ""
    return Finding(
        analyzer=analyzer,
        severity="info",
        title=f"{kind}(sparse=True){named} at {where}: its sparse gradient is held dense on tpu ({weight})",
        explanation=(
            f"XLA has no sparse tensors, so the gradient of the {weight} table looked up at {where} was computed "
            f"as a dense {weight} tensor ({plural(count, 'backward')} in {plural(steps_with, 'step')}), not as "
            f"the sparse rows `sparse=True` asks for. The run trains as it would: dense optimizers take the "
            f"gradient as it is, and `SparseAdam` updates only the rows whose gradient is nonzero, reading and "
            f"writing the whole table each step."
        ),
        suggestion=(
            f"For a TPU, build the {kind} with `sparse=False` (the default) and train it with a dense optimizer "
            "(`torch.optim.Adam`/`AdamW` in place of `SparseAdam`; one optimizer can then hold every parameter): "
            "the gradient is dense on a TPU either way, and a dense update fuses into the step's program. Adam "
            "decays the moments of rows not looked up too, which SparseAdam's lazy update does not."
        ),
        cost_total_ns=0.0,
        evidence=(context.evidence_at(f"{plural(count, 'call')} of {backward} ({weight}, dense)", backward_frame),),
        module=module,
        **context.location_fields(frame_id),
    )
