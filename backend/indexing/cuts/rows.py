"""Ops of cuts computed row by row or prefix by prefix on the padded buffers: a softmax (and its
backward) along any dim, `flip`, a cumulative sum, `zeros_like` and `new_zeros`, `_unsafe_view`;
along the cut dim, a softmax or `flip` leaves the padding out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.core.entries import bound
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.indexing.cuts.layout import cut, cut_layout, is_cut, padded_of, reshaped_layout, shared_cut
from tputrace.backend.indexing.cuts.steps import padded_step
from tputrace.backend.ops import padded

aten = torch.ops.aten

SOFTMAX_OPS = (aten._softmax.default, aten._log_softmax.default, aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)
NEW_OPS = (aten.new_zeros.default, aten.new_empty.default, aten.new_ones.default, aten.new_full.default, aten.new_empty_strided.default)
PREFIX_OPS = (
    aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default, aten.full_like.default,
    aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default,
)


def rowwise_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """A softmax, log-softmax or their backward of cuts alike. Along a dim other than the cut's, each
    row of the padded buffers is computed on its own, so the first `length` are the op's on the cuts;
    along the cut dim (a softmax over the selected rows), the padding is left out of the
    normalisation (`ops.padded.softmax_along_cut_padded`)."""
    tensors = [value for value in args if isinstance(value, torch.Tensor)]
    shared = shared_cut(tensors)
    if shared is None or kwargs or len(args) != len(tensors) + 2:
        return None
    cut_dim, length, _ = shared
    along, last = args[len(tensors):]
    if not -tensors[0].dim() <= along < tensors[0].dim():
        return None
    padded_tensors = [padded_of(value, shared) for value in tensors]
    if along % tensors[0].dim() != cut_dim:
        result = dispatcher.compute(entry, [*padded_tensors, along, last], kwargs, record_as)
    else:
        step, last_name, log = _ALONG_CUT[entry.op]
        result = dispatcher.compute(step, (*padded_tensors, length), {"dim": cut_dim, last_name: last, "log": log}, record_as or entry.name)
    return cut(result, cut_dim, length)


_ALONG_CUT = {  # op -> (its program along the cut dim, the name of its last argument, whether it is the log form)
    aten._softmax.default: (padded_step(aten._softmax.default, padded.softmax_along_cut_padded, 1), "half_to_float", False),
    aten._log_softmax.default: (padded_step(aten._log_softmax.default, padded.softmax_along_cut_padded, 1), "half_to_float", True),
    aten._softmax_backward_data.default: (
        padded_step(aten._softmax_backward_data.default, padded.softmax_backward_along_cut_padded, 2), "input_dtype", False
    ),
    aten._log_softmax_backward_data.default: (
        padded_step(aten._log_softmax_backward_data.default, padded.softmax_backward_along_cut_padded, 2), "input_dtype", True
    ),
}
_FLIP_CUT = padded_step(aten.flip.default, padded.flip_cut_padded, 1)


def flip_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`flip` of a cut (the backward of its `cumsum`): along other dims, of its padded buffer; along
    the cut dim, the cut's entries reversed to the front (`ops.padded.flip_cut_padded`); cut in turn."""
    self, dims = bound(entry.op, args, kwargs)
    layout = cut_layout(self)
    if layout is None:
        return None
    axes = [axis % self.dim() for axis in dims if -self.dim() <= axis < self.dim()]
    if len(axes) != len(dims) or len(set(axes)) != len(axes):
        return None  # the exact path raises torch's error
    cut_dim, length, _ = layout
    if cut_dim not in axes:
        return cut(dispatcher.compute(entry, (padded_of(self, layout), dims), {}, record_as), cut_dim, length)
    options = {"dims": tuple(axes), "cut_dim": cut_dim}
    return cut(dispatcher.compute(_FLIP_CUT, (padded_of(self, layout), length), options, record_as or entry.name), cut_dim, length)


def new_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`new_zeros` and the like of a cut read only its dtype and device: made from its padded buffer."""
    layout = cut_layout(args[0])
    if layout is None or any(is_cut(value) for value in (*args[1:], *kwargs.values())):
        return None
    return dispatcher.compute(entry, (padded_of(args[0], layout), *args[1:]), kwargs, record_as)


def prefix_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """An op of one cut whose first `length` entries along the cut dim depend on the cut's only
    (`zeros_like` and the like; a cumulative sum, product or logcumsumexp, each entry on those
    before it): of its padded buffer, cut in turn."""
    layout = cut_layout(args[0])
    if layout is None or any(is_cut(value) for value in (*args[1:], *kwargs.values())):
        return None
    dim, length, _ = layout
    return cut(dispatcher.compute(entry, (padded_of(args[0], layout), *args[1:]), kwargs, record_as), dim, length)


def unsafe_view_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`_unsafe_view` of a cut (a matmul's output of a 3-D cut, as a linear layer without bias gives):
    its padded counterpart reshaped as `layout.reshaped_layout` says, cut in turn."""
    self, size = bound(entry.op, args, kwargs)
    layout = cut_layout(self)
    if layout is None:
        return None
    known = math.prod(target for target in size if target != -1)
    shape = tuple(self.numel() // known if target == -1 and known else target for target in size)
    if math.prod(shape) != self.numel():
        return None  # the exact path raises torch's error
    dim, length, padded_shape = layout
    reshaped = reshaped_layout(padded_shape, dim, length, shape)
    if reshaped is None:
        return None
    result = dispatcher.compute(entry, (padded_of(self, layout), list(reshaped[2])), {}, record_as)
    return cut(result, reshaped[0], reshaped[1])
