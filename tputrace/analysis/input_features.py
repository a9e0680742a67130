"""The feature sizes the data fixes: the trailing dims (or their product, once flattened) of the tensors the loop
copies from the host. A flattened 28x28 image has 784 features whatever the model; a matmul dim of that size is
the input's, not a size the model chose, so no other size can be suggested for it."""

from __future__ import annotations

import math

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.shapes import TensorSpec, parse_specs


def copied_feature_sizes(context: AnalysisContext) -> dict[int, TensorSpec]:
    """Each size that a tensor copied from the host in two or more of the loop's steps has as its last dim or as the product of its
    trailing dims (from dim 1 on), with that tensor (as an op of the loop took it: a tensor of the same bytes as a
    copy). Empty for a run without steps or copies."""
    if not context.steps:
        return {}
    where, params = context.loop_where("t")
    copied = {int(nbytes) for (nbytes,) in context.trace.sql(
        f"SELECT t.bytes FROM transfers t WHERE {where} AND t.direction = 'h2d' AND t.bytes > 0 GROUP BY t.bytes "
        "HAVING COUNT(DISTINCT t.step) >= 2", params)}  # copied step after step: not the model's one `.to` before
    if not copied:
        return {}
    op_where, op_params = context.loop_where("o")
    sizes: dict[int, TensorSpec] = {}
    for (inputs_sid,) in context.trace.sql(
            f"SELECT DISTINCT o.inputs_sid FROM ops o WHERE {op_where} AND o.inputs_sid IS NOT NULL", op_params):
        for spec in parse_specs(context.trace.string(inputs_sid)):
            if spec is None or len(spec.shape) < 2 or spec.nbytes not in copied:
                continue
            for start in range(1, len(spec.shape)):
                sizes.setdefault(math.prod(spec.shape[start:]), spec)
    return sizes


def spec_text(spec: TensorSpec) -> str:
    """'f32[128,1,28,28]'."""
    return f"{spec.dtype}[{','.join(str(size) for size in spec.shape)}]"
