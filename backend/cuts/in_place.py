"""In-place ops on a cut: its buffer written before the length only, by a program per padded length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.arg_checks import check_write
from tputrace.backend.cuts.layout import is_cut, shared_cut
from tputrace.backend.cuts.steps import padded_step
from tputrace.backend.op_routes import bound
from tputrace.backend.ops import padded
from tputrace.backend.tensor import whole_buffer

aten = torch.ops.aten

_KEEP_PAST = padded_step(aten.where.self, padded.keep_past, 2)
_OUT_OF_PLACE = {aten.masked_fill_.Scalar: aten.masked_fill.Scalar, aten.masked_fill_.Tensor: aten.masked_fill.Tensor}


def masked_fill_on_cut(dispatcher: Any, op: Any, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`masked_fill_` of a cut through a mask cut alike (`cross_entropy` with `label_smoothing` fills
    the ignored rows of its smoothing term): `masked_fill` of the padded buffers, written into the
    cut's buffer before the length only (`ops.padded.keep_past`); None (its plain route) elsewhere."""
    if not is_cut(args[0]):
        return None
    self, mask, value = bound(op, args, kwargs)
    if not is_cut(mask) or shared_cut((self, mask)) is None or is_cut(value):
        return None
    check_write(self, (mask, value), op)
    dim, length = self._view.host_cut
    buffer = whole_buffer(self)
    filled = dispatcher.compute(dispatcher._entry(_OUT_OF_PLACE[op]), (buffer, whole_buffer(mask), value), {}, str(op))
    kept = dispatcher.compute(_KEEP_PAST, (filled, buffer, length), {"dim": dim}, str(op))
    dispatcher.write(buffer, dispatcher.read(kept))
    return self
