"""In-place ops on a cut (`masked_fill_`, and pointwise ones: `sel = x[mask]; sel.mul_(2)`,
`sel.clamp_(-1, 1)`): the op's functional form on the padded buffers, its result written into the
cut's buffer before the length only, by programs per padded length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.core.arg_checks import check_write
from tputrace.backend.core.entries import bound
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.core.tensor import whole_buffer
from tputrace.backend.indexing.cuts.layout import is_cut, is_cut_or_view_of_one
from tputrace.backend.indexing.cuts.pointwise import broadcast_on_padded, pointwise_on_padded
from tputrace.backend.indexing.cuts.steps import padded_step
from tputrace.backend.ops import padded

aten = torch.ops.aten

_KEEP_PAST = padded_step(aten.where.self, padded.keep_past, 2)
_OUT_OF_PLACE = {aten.masked_fill_.Scalar: aten.masked_fill.Scalar, aten.masked_fill_.Tensor: aten.masked_fill.Tensor}


def masked_fill_on_cut(dispatcher: DispatcherApi, op: Any, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`masked_fill_` of a cut through a mask cut alike (`cross_entropy` with `label_smoothing` fills
    the ignored rows of its smoothing term) or broadcast along the cut dim (a norm's backward fills
    where the norm is zero): `masked_fill` of the padded buffers, written into the cut's buffer before
    the length only (`ops.padded.keep_past`); None (its plain route) elsewhere."""
    if not is_cut(args[0]):
        return None
    self, mask, value = bound(op, args, kwargs)
    broadcast = broadcast_on_padded((self, mask))
    if broadcast is None or mask.dtype != torch.bool or is_cut_or_view_of_one(value) or torch.broadcast_shapes(self.shape, mask.shape) != self.shape:
        return None
    check_write(self, (mask, value), op)
    dim, length = self._view.host_cut
    buffer = whole_buffer(self)
    filled = dispatcher.compute(dispatcher._entry(_OUT_OF_PLACE[op]), (buffer, broadcast[0][1], value), {}, str(op))
    kept = dispatcher.compute(_KEEP_PAST, (filled, buffer, length), {"dim": dim}, str(op))
    dispatcher.write(buffer, dispatcher.read(kept))
    return self


def in_place_on_cut(dispatcher: DispatcherApi, op: Any, args: Sequence[Any], kwargs: dict) -> Any | None:
    """A pointwise in-place op on a cut (`pointwise_in_place_ops`): its functional form on the padded
    buffers (`pointwise.pointwise_on_padded`), written into the cut's buffer before the length only;
    None (its plain route, which raises torch's error where there is one) where that form does not run
    padded, or gives another layout (an input broadcast past the cut's shape) or a dtype torch does not
    cast into the cut's."""
    self = args[0]
    if not is_cut(self):
        return None
    entry = dispatcher._entry(op)
    if entry.kind != "inplace" or (entry.lowering is None and entry.functional is None):
        return None
    computed = entry if entry.lowering is not None else dispatcher._entry(entry.functional)
    if computed.kind != "lowered":
        return None
    check_write(self, (*args[1:], *kwargs.values()), op)
    result = pointwise_on_padded(dispatcher, computed, args, kwargs, entry.name)
    if result is None or not is_cut(result) or not torch.can_cast(result.dtype, self.dtype):
        return None
    if result._view.host_cut != self._view.host_cut or tuple(result._buf.array.shape) != tuple(self._buf.array.shape):
        return None
    dim, length = self._view.host_cut
    buffer = whole_buffer(self)
    kept = dispatcher.compute(_KEEP_PAST, (whole_buffer(result), buffer, length), {"dim": dim}, entry.name)
    dispatcher.write(buffer, dispatcher.read(kept))
    return self


def pointwise_in_place_ops() -> list[Any]:
    """The in-place forms of ATen's deterministic pointwise ops (`mul_`, `add_`, `clamp_`, `sigmoid_`, ...)."""
    ops = []
    for schema in torch._C._jit_get_all_schemas():
        name = schema.name
        if not name.startswith("aten::") or not name.endswith("_") or name.startswith("aten::_"):
            continue
        op = getattr(getattr(aten, name[len("aten::"):], None), schema.overload_name or "default", None)
        if op is not None and torch.Tag.inplace in op.tags and torch.Tag.pointwise in op.tags and torch.Tag.nondeterministic_seeded not in op.tags:
            ops.append(op)
    return ops
