"""`nll_loss` (`cross_entropy`, with `label_smoothing`, `nll_loss2d` of kept samples) and `mse_loss`
of cuts, and their backward, on the padded buffers: the padded rows are left out of the loss and get
a zero gradient (`ops.padded`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.cuts.layout import cut, is_cut, shared_cut
from tputrace.backend.cuts.steps import padded_step
from tputrace.backend.op_routes import bound
from tputrace.backend.ops import padded
from tputrace.backend.tensor import whole_buffer

aten = torch.ops.aten

_NLL_LOSS = padded_step(aten.nll_loss_forward.default, padded.nll_loss_forward_padded, 3)
_NLL_LOSS_BACKWARD = padded_step(aten.nll_loss_backward.default, padded.nll_loss_backward_padded, 5)
_MSE_LOSS = padded_step(aten.mse_loss.default, padded.mse_loss_padded, 2)
_MSE_LOSS_BACKWARD = padded_step(aten.mse_loss_backward.default, padded.mse_loss_backward_padded, 3)
_NO_REDUCTION = 0


def _loss_rows(self: Any, target: Any) -> int | None:
    """The length of scores (N, C) and targets (N,), or (N, C, H, W) and (N, H, W) (`nll_loss2d`: the
    samples of a batch kept by a mask), cut to the same number of rows; else None."""
    if self.dim() not in (2, 4) or self.dim() != target.dim() + 1 or tuple(self.shape[2:]) != tuple(target.shape[1:]):
        return None
    if not is_cut(self) or not is_cut(target):
        return None
    (self_dim, length), (target_dim, target_length) = self._view.host_cut, target._view.host_cut
    if self_dim or target_dim or length != target_length or self._buf.array.shape[0] != target._buf.array.shape[0]:
        return None
    return length


def nll_loss_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`nll_loss_forward` of cut scores and targets: the padded rows get `ignore_index`."""
    self, target, weight, reduction, ignore_index = bound(entry.op, args, kwargs)
    length = _loss_rows(self, target)
    if length is None or is_cut(weight):
        return None
    options = {"reduction": reduction, "ignore_index": ignore_index}
    output, total_weight = dispatcher.compute(_NLL_LOSS, (whole_buffer(self), whole_buffer(target), weight, length), options, record_as or entry.name)
    return (cut(output, 0, length) if reduction == _NO_REDUCTION else output), total_weight


def nll_loss_backward_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`nll_loss_backward` of cut scores and targets: the padded rows' gradient is zero."""
    grad_output, self, target, weight, reduction, ignore_index, total_weight = bound(entry.op, args, kwargs)
    length = _loss_rows(self, target)
    if length is None or is_cut(weight) or is_cut(total_weight):
        return None
    if is_cut(grad_output):
        if reduction != _NO_REDUCTION or shared_cut((grad_output, target)) is None:
            return None
        grad_output = whole_buffer(grad_output)
    options = {"reduction": reduction, "ignore_index": ignore_index}
    inputs = (grad_output, whole_buffer(self), whole_buffer(target), weight, total_weight, length)
    return cut(dispatcher.compute(_NLL_LOSS_BACKWARD, inputs, options, record_as or entry.name), 0, length)


def mse_loss_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`mse_loss` of two cuts alike: the padded entries' difference is zero (a mean divides by the count)."""
    self, target, reduction = bound(entry.op, args, kwargs)
    shared = shared_cut((self, target))
    if shared is None or self.is_complex():
        return None
    cut_dim, length = shared
    if reduction == _NO_REDUCTION:
        return cut(dispatcher.compute(entry, (whole_buffer(self), whole_buffer(target), reduction), {}, record_as), cut_dim, length)
    options = {"cut_dim": cut_dim, "reduction": reduction}
    return dispatcher.compute(_MSE_LOSS, (whole_buffer(self), whole_buffer(target), length), options, record_as or entry.name)


def mse_loss_backward_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`mse_loss_backward` of two cuts alike (and of a cut gradient, without reduction)."""
    grad_output, self, target, reduction = bound(entry.op, args, kwargs)
    shared = shared_cut((self, target))
    if shared is None or self.is_complex():
        return None
    cut_dim, length = shared
    if reduction == _NO_REDUCTION:
        if is_cut(grad_output) and shared_cut((grad_output, self)) is None:
            return None
        grad_output = whole_buffer(grad_output) if is_cut(grad_output) else grad_output
        return cut(dispatcher.compute(entry, (grad_output, whole_buffer(self), whole_buffer(target), reduction), {}, record_as), cut_dim, length)
    if is_cut(grad_output):
        return None
    options = {"cut_dim": cut_dim, "reduction": reduction}
    inputs = (grad_output, whole_buffer(self), whole_buffer(target), length)
    return cut(dispatcher.compute(_MSE_LOSS_BACKWARD, inputs, options, record_as or entry.name), cut_dim, length)
