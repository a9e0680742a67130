"""The feature sizes the data fixes: the trailing dims (or their product, once flattened) of the tensors each step
brings in, copied from the host or made on the chip outside the model (a synthetic batch, `torch.randn(n, 1, 28, 28,
device=...)`). A flattened 28x28 image has 784 features whatever the model; a matmul dim of that size is the input's,
not a size the model chose, so no other size can be suggested for it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.shapes import TensorSpec, parse_specs

# Ops that fill a tensor with random values: a synthetic batch made on the chip.
_RANDOM_FILLS = ("aten.normal", "aten.uniform", "aten.rand", "aten.random_", "aten.bernoulli")


@dataclass(frozen=True)
class InputFeatures:
    """A tensor each step brings in, as an op of the loop took it, and how it came: `made_at` is the line that made it
    on the chip, None for a copy from the host."""

    spec: TensorSpec
    made_at: str | None = None

    def origin_text(self) -> str:
        """'the loop copies f32[128,784] from the host' or 'the loop makes f32[128,784] on the chip at train.py:9'."""
        if self.made_at is None:
            return f"the loop copies {spec_text(self.spec)} from the host"
        return f"the loop makes {spec_text(self.spec)} on the chip at {self.made_at}"


def copied_feature_sizes(context: AnalysisContext) -> dict[int, InputFeatures]:
    """Each size that a tensor brought in by two or more of the loop's steps has as its last dim or as the product of
    its trailing dims (from dim 1 on), with that tensor: one of the same bytes as a copy from the host, as an op of the
    loop took it, or a random fill made outside any module that a module's op took as made or flattened to rows (a
    synthetic batch). Empty for a run without steps."""
    if not context.steps:
        return {}
    where, params = context.loop_where("t")
    copied = {int(nbytes) for (nbytes,) in context.trace.sql(
        f"SELECT t.bytes FROM transfers t WHERE {where} AND t.direction = 'h2d' AND t.bytes > 0 GROUP BY t.bytes "
        "HAVING COUNT(DISTINCT t.step) >= 2", params)}  # copied step after step: not the model's one `.to` before
    sizes: dict[int, InputFeatures] = {}
    for spec in _first_taken(context, copied):
        _add_features(sizes, InputFeatures(spec))
    for spec, made_at in _made_batches(context):
        _add_features(sizes, InputFeatures(spec, made_at))
    return sizes


def _first_taken(context: AnalysisContext, copied: set[int]) -> list[TensorSpec]:
    """For each of the `copied` byte counts, the first tensor of two or more dims with those bytes that an op took in a
    steady step, by dispatch order: the batch as the model first takes it. Later tensors of the same bytes are the
    model's own (an attention's queries split into heads, as many floats as a batch of the model's width)."""
    steps = context.steady_steps or context.steps
    if not copied or not steps:
        return []
    first: dict[int, TensorSpec] = {}
    for (inputs_sid,) in context.trace.sql(
            "SELECT o.inputs_sid FROM ops o WHERE o.rank = ? AND o.step = ? AND o.inputs_sid IS NOT NULL ORDER BY o.seq",
            (context.rank, steps[0].step)):
        for spec in parse_specs(context.trace.string(inputs_sid)):
            if spec is not None and len(spec.shape) >= 2 and spec.nbytes in copied:
                first.setdefault(spec.nbytes, spec)
        if len(first) == len(copied):
            break
    return list(first.values())


def _add_features(sizes: dict[int, InputFeatures], features: InputFeatures) -> None:
    shape = features.spec.shape
    for start in range(1, len(shape)):
        sizes.setdefault(math.prod(shape[start:]), features)


def _made_batches(context: AnalysisContext) -> list[tuple[TensorSpec, str]]:
    """Each floating tensor of two or more dims that a random fill outside any module made in two or more of the loop's
    steps and that a module's op took, as made or flattened to rows (a synthetic batch), with the line that made it."""
    where, params = context.loop_where("o")
    fills = " OR ".join("s.text LIKE ?" for _ in _RANDOM_FILLS)
    made: dict[tuple[int, ...], tuple[TensorSpec, str]] = {}
    for outputs_sid, frame_id in context.trace.sql(
            f"SELECT o.outputs_sid, MIN(o.frame_id) FROM ops o JOIN strings s ON s.id = o.op_sid WHERE {where} "
            f"AND o.module_sid IS NULL AND o.outputs_sid IS NOT NULL AND ({fills}) GROUP BY o.outputs_sid "
            "HAVING COUNT(DISTINCT o.step) >= 2", (*params, *(f"{prefix}%" for prefix in _RANDOM_FILLS))):
        for spec in parse_specs(context.trace.string(outputs_sid)):
            if spec is not None and len(spec.shape) >= 2 and spec.dtype.startswith(("f", "bf")):
                made.setdefault(spec.shape, (spec, context.where(frame_id)))
    if not made:
        return []
    taken: set[tuple[str, tuple[int, ...]]] = set()
    for (inputs_sid,) in context.trace.sql(
            f"SELECT DISTINCT o.inputs_sid FROM ops o WHERE {where} AND o.module_sid IS NOT NULL AND o.inputs_sid IS NOT NULL",
            params):
        taken.update((spec.dtype, spec.shape) for spec in parse_specs(context.trace.string(inputs_sid)) if spec is not None)
    return [(spec, made_at) for spec, made_at in made.values()
            if {(spec.dtype, spec.shape), (spec.dtype, (spec.shape[0], math.prod(spec.shape[1:])))} & taken]


def spec_text(spec: TensorSpec) -> str:
    """'f32[128,1,28,28]'."""
    return f"{spec.dtype}[{','.join(str(size) for size in spec.shape)}]"
