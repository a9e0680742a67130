"""A pointwise op of cuts (`x[mask] * 2`, `weights.unsqueeze(-1) * rows`, `x[mask] / norm.expand_as(x[mask])`) on their padded buffers:
each entry depends only on the entries at its position, so the first `length` are the op's on the
cuts, and the program is the padded length's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.core.tensor import TpuTensor, whole_buffer
from tputrace.backend.indexing.cuts.layout import cut, cut_from_end, cut_layout, is_cut, padded_of

aten = torch.ops.aten

_pointwise: dict[Any, bool] = {}  # op entry -> whether it is a deterministic pointwise op of one output


def pointwise_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """A pointwise op whose inputs include cuts (or their `unsqueeze`), run on their padded buffers and
    cut to the length; None when it cannot be: an op that is not pointwise (or draws random numbers),
    or inputs that `broadcast_on_padded` refuses."""
    if not _is_pointwise(entry) or any(is_cut(value) for value in kwargs.values()):
        return None
    broadcast = broadcast_on_padded(args)
    if broadcast is None:
        return None
    padded_args, from_end, length = broadcast
    result = dispatcher.compute(entry, padded_args, kwargs, record_as)
    return cut(result, result.dim() + from_end, length)


def broadcast_on_padded(args: Sequence[Any]) -> tuple[list[Any], int, int] | None:
    """(`args` with each cut in its padded counterpart, the cut dim counted from the end of their
    broadcast shape, the length) for inputs of an op computed entry by entry, whose first `length`
    entries along that dim are then the op's on the cuts; None for cuts of different lengths, dims or
    padded lengths, or another input that does not broadcast along the cut dim."""
    layouts = {position: cut_layout(value) for position, value in enumerate(args) if type(value) is TpuTensor}
    layouts = {position: layout for position, layout in layouts.items() if layout is not None}
    cuts = {position: cut_from_end(args[position], layout) for position, layout in layouts.items()}
    if len(set(cuts.values())) != 1:
        return None
    from_end, length, _ = next(iter(cuts.values()))
    args = [value if position in cuts else _unexpanded(value, from_end, length) for position, value in enumerate(args)]
    others = [tuple(value.shape) for position, value in enumerate(args) if isinstance(value, torch.Tensor) and position not in cuts]
    try:
        shape = torch.broadcast_shapes(*others, *(tuple(args[position].shape) for position in cuts))
    except RuntimeError:  # the op raises torch's error on the cut
        return None
    if shape[from_end] != length or any(len(other) >= -from_end and other[from_end] != 1 for other in others):
        return None
    return [padded_of(value, layouts[position]) if position in cuts else value for position, value in enumerate(args)], from_end, length


def _unexpanded(value: Any, from_end: int, length: int) -> Any:
    """The buffer an `expand` broadcast to the cut's length along the cut dim, in place of that expand
    (`F.normalize(x[mask], dim=0)` divides by `norm.expand_as(x[mask])`): it broadcasts along the cut
    dim as the expand did, and, unlike the expand, has no count in its shape. Any other value as it is."""
    if type(value) is not TpuTensor or value._view is None or value.dim() < -from_end or value.shape[from_end] != length:
        return value
    steps = value._view.steps
    if len(steps) != 1 or steps[0].key[0] is not aten.expand.default or value.stride(from_end) != 0:
        return value
    source = whole_buffer(value)
    if source.dim() >= -from_end and source.shape[from_end] != 1:
        return value
    return source


def _is_pointwise(entry: Any) -> bool:
    known = _pointwise.get(entry)
    if known is None:
        op = entry.op
        known = _pointwise[entry] = (
            isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags and torch.Tag.nondeterministic_seeded not in op.tags
            and len(op._schema.returns) == 1 and entry.lowering is not None and not entry.lowering.needs_key
        )
    return known
