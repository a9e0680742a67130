"""`nll_loss` (`cross_entropy`, with `label_smoothing`, `nll_loss2d` of kept samples), `mse_loss` and
the losses computed entry by entry (`binary_cross_entropy_with_logits`, `smooth_l1_loss`,
`huber_loss`) of cuts, and their backward, on the padded buffers: the padded rows are left out of the
loss and get a zero gradient (`ops.padded`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.core.entries import bound
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.indexing.cuts.layout import cut, cut_layout, is_cut_or_view_of_one, padded_of, shared_cut
from tputrace.backend.indexing.cuts.pointwise import broadcast_on_padded
from tputrace.backend.indexing.cuts.steps import padded_step
from tputrace.backend.ops import padded

aten = torch.ops.aten

_NLL_LOSS = padded_step(aten.nll_loss_forward.default, padded.nll_loss_forward_padded, 3)
_NLL_LOSS_BACKWARD = padded_step(aten.nll_loss_backward.default, padded.nll_loss_backward_padded, 5)
_MSE_LOSS = padded_step(aten.mse_loss.default, padded.mse_loss_padded, 2)
_MSE_LOSS_BACKWARD = padded_step(aten.mse_loss_backward.default, padded.mse_loss_backward_padded, 3)
_NO_REDUCTION = 0
# A loss computed entry by entry, or its backward -> (its sum or mean over a cut, the schema position of
# its `reduction`, whether it is a backward: its result is the inputs' gradient, cut in turn)
ENTRY_BY_ENTRY_LOSSES = {
    aten.binary_cross_entropy_with_logits.default: (
        padded_step(aten.binary_cross_entropy_with_logits.default, padded.binary_cross_entropy_with_logits_padded, 4), 4, False,
    ),
    aten.smooth_l1_loss.default: (padded_step(aten.smooth_l1_loss.default, padded.smooth_l1_loss_padded, 2), 2, False),
    aten.smooth_l1_loss_backward.default: (
        padded_step(aten.smooth_l1_loss_backward.default, padded.smooth_l1_loss_backward_padded, 3), 3, True,
    ),
    aten.huber_loss.default: (padded_step(aten.huber_loss.default, padded.huber_loss_padded, 2), 2, False),
    aten.huber_loss_backward.default: (padded_step(aten.huber_loss_backward.default, padded.huber_loss_backward_padded, 3), 3, True),
}


def _loss_rows(self: Any, target: Any) -> tuple[Any, Any, int] | None:
    """(the padded scores, the padded targets, the length) of scores (N, C) and targets (N,), or (N, C,
    H, W) and (N, H, W) (`nll_loss2d`: the samples of a batch kept by a mask), cut (or reshaped from
    cuts, as `logits.reshape(-1, C)` of a 3-D cut) to the same number of rows; else None."""
    if self.dim() not in (2, 4) or self.dim() != target.dim() + 1 or tuple(self.shape[2:]) != tuple(target.shape[1:]):
        return None
    self_layout, target_layout = cut_layout(self), cut_layout(target)
    if self_layout is None or target_layout is None:
        return None
    (self_dim, length, self_padded), (target_dim, target_length, target_padded) = self_layout, target_layout
    if self_dim or target_dim or length != target_length or self_padded[0] != target_padded[0]:
        return None
    return padded_of(self, self_layout), padded_of(target, target_layout), length


def nll_loss_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`nll_loss_forward` of cut scores and targets: the padded rows get `ignore_index`."""
    self, target, weight, reduction, ignore_index = bound(entry.op, args, kwargs)
    rows = _loss_rows(self, target)
    if rows is None or is_cut_or_view_of_one(weight):
        return None
    padded_self, padded_target, length = rows
    options = {"reduction": reduction, "ignore_index": ignore_index}
    output, total_weight = dispatcher.compute(_NLL_LOSS, (padded_self, padded_target, weight, length), options, record_as or entry.name)
    return (cut(output, 0, length) if reduction == _NO_REDUCTION else output), total_weight


def nll_loss_backward_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`nll_loss_backward` of cut scores and targets: the padded rows' gradient is zero."""
    grad_output, self, target, weight, reduction, ignore_index, total_weight = bound(entry.op, args, kwargs)
    rows = _loss_rows(self, target)
    if rows is None or is_cut_or_view_of_one(weight) or is_cut_or_view_of_one(total_weight):
        return None
    padded_self, padded_target, length = rows
    if is_cut_or_view_of_one(grad_output):
        layout = shared_cut((grad_output, target))
        if reduction != _NO_REDUCTION or layout is None:
            return None
        grad_output = padded_of(grad_output, layout)
    options = {"reduction": reduction, "ignore_index": ignore_index}
    inputs = (grad_output, padded_self, padded_target, weight, total_weight, length)
    return cut(dispatcher.compute(_NLL_LOSS_BACKWARD, inputs, options, record_as or entry.name), 0, length)


def mse_loss_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`mse_loss` of two cuts alike: the padded entries' difference is zero (a mean divides by the count)."""
    self, target, reduction = bound(entry.op, args, kwargs)
    cuts = _mse_cuts(self, target)
    if cuts is None:
        return None
    shared, padded_self, padded_target = cuts
    cut_dim, length, _ = shared
    if reduction == _NO_REDUCTION:
        return cut(dispatcher.compute(entry, (padded_self, padded_target, reduction), {}, record_as), cut_dim, length)
    options = {"cut_dim": cut_dim, "reduction": reduction}
    return dispatcher.compute(_MSE_LOSS, (padded_self, padded_target, length), options, record_as or entry.name)


def mse_loss_backward_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`mse_loss_backward` of two cuts alike (and of a cut gradient, without reduction)."""
    grad_output, self, target, reduction = bound(entry.op, args, kwargs)
    cuts = _mse_cuts(self, target)
    if cuts is None:
        return None
    shared, padded_self, padded_target = cuts
    cut_dim, length, _ = shared
    if reduction == _NO_REDUCTION:
        if is_cut_or_view_of_one(grad_output):
            if shared_cut((grad_output, self)) is None:
                return None
            grad_output = padded_of(grad_output, shared)
        return cut(dispatcher.compute(entry, (grad_output, padded_self, padded_target, reduction), {}, record_as), cut_dim, length)
    if is_cut_or_view_of_one(grad_output):
        return None
    options = {"cut_dim": cut_dim, "reduction": reduction}
    inputs = (grad_output, padded_self, padded_target, length)
    return cut(dispatcher.compute(_MSE_LOSS_BACKWARD, inputs, options, record_as or entry.name), cut_dim, length)


def _mse_cuts(self: Any, target: Any) -> tuple[Any, Any, Any] | None:
    """(their shared cut, their padded buffers) for `mse_loss` of two real cuts alike, else None."""
    shared = shared_cut((self, target))
    if shared is None or self.is_complex():
        return None
    return shared, padded_of(self, shared), padded_of(target, shared)


def entry_by_entry_loss_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """A loss of cuts computed entry by entry (`ENTRY_BY_ENTRY_LOSSES`), or its backward: without
    reduction, the op on the padded buffers, cut in turn; a sum or mean, over the entries before the
    length only (a mean divides by their count), and the padded entries' gradient is zero. None where
    the inputs do not broadcast along the cut dim (`pointwise.broadcast_on_padded`)."""
    values = bound(entry.op, args, kwargs)
    step, reduction_at, is_backward = ENTRY_BY_ENTRY_LOSSES[entry.op]
    tensors, reduction, options = values[:reduction_at], values[reduction_at], values[reduction_at + 1:]
    broadcast = broadcast_on_padded(tensors)
    if broadcast is None or any(value.is_complex() for value in tensors if isinstance(value, torch.Tensor)):
        return None
    padded_tensors, from_end, length = broadcast
    if reduction == _NO_REDUCTION:
        result = dispatcher.compute(entry, (*padded_tensors, reduction, *options), {}, record_as)
        return cut(result, result.dim() + from_end, length)
    names = [argument.name for argument in entry.op._schema.arguments[reduction_at + 1:]]
    step_options = {"cut_dim": from_end, "reduction": reduction, **dict(zip(names, options))}
    result = dispatcher.compute(step, (*padded_tensors, length), step_options, record_as or entry.name)
    return cut(result, result.dim() + from_end, length) if is_backward else result
