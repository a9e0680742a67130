"""`native_layer_norm` of a cut along dims other than the cut's (`F.layer_norm(hidden[mask], (H,))`, a
masked-LM head's norm) and its backward on the padded buffers: each row is normalised on its own, and
the weight's and bias's gradients sum over the real rows only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.core.entries import bound
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.indexing.cuts.layout import cut, cut_layout, is_cut_or_view_of_one, padded_of
from tputrace.backend.indexing.cuts.steps import padded_step
from tputrace.backend.ops import padded

aten = torch.ops.aten

_LAYER_NORM_BACKWARD = padded_step(aten.native_layer_norm_backward.default, padded.layer_norm_backward_padded, 6)


def layer_norm_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`native_layer_norm` of a cut over trailing dims after the cut dim: of its padded buffer, the
    output, mean and rstd cut in turn."""
    self, normalized_shape, weight, bias, _ = bound(entry.op, args, kwargs)
    layout = cut_layout(self)
    if layout is None or is_cut_or_view_of_one(weight) or is_cut_or_view_of_one(bias):
        return None
    cut_dim, length, _ = layout
    if cut_dim >= self.dim() - len(normalized_shape):
        return None  # normalised along the cut dim: the exact path
    padded_args = [padded_of(self, layout), *args[1:]]
    output, mean, rstd = dispatcher.compute(entry, padded_args, kwargs, record_as)
    return cut(output, cut_dim, length), cut(mean, cut_dim, length), cut(rstd, cut_dim, length)


def layer_norm_backward_on_padded(dispatcher: DispatcherApi, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`native_layer_norm_backward` of cuts alike (the gradient, input, mean and rstd): the padded rows
    are zeroed, so that they add nothing to the weight's and bias's gradients
    (`ops.padded.layer_norm_backward_padded`); the input's gradient is cut in turn."""
    grad_out, self, normalized_shape, mean, rstd, weight, bias, output_mask = bound(entry.op, args, kwargs)
    if is_cut_or_view_of_one(weight) or is_cut_or_view_of_one(bias):
        return None
    layouts = [cut_layout(value) for value in (grad_out, self, mean, rstd)]
    if any(layout is None for layout in layouts):
        return None
    cut_dim, length, padded_shape = layouts[1]
    if cut_dim >= self.dim() - len(normalized_shape) or any(layout[:2] != (cut_dim, length) or layout[2][cut_dim] != padded_shape[cut_dim] for layout in layouts):
        return None
    padded_values = [padded_of(value, layout) for value, layout in zip((grad_out, self, mean, rstd), layouts)]
    options = {"cut_dim": cut_dim, "normalized_shape": tuple(normalized_shape), "output_mask": tuple(output_mask)}
    computed = iter(dispatcher.compute(_LAYER_NORM_BACKWARD, (*padded_values, weight, bias, length), options, record_as or entry.name))
    given = (output_mask[0], output_mask[1] and weight is not None, output_mask[2] and bias is not None)
    grad_input, grad_weight, grad_bias = (next(computed) if wanted else None for wanted in given)
    return (None if grad_input is None else cut(grad_input, cut_dim, length)), grad_weight, grad_bias
