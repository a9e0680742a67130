"""Channels-last memory formats of tpu tensors: which strides count as channels_last, and the order
in which a channels-last tensor's buffer holds its dims.

A buffer always holds a row-major array. A channels_last tensor (`x.to(memory_format=...)`, a conv
output of a channels_last input) is a permuted view of a buffer holding its dims in storage order
(N, H, W, C), so its strides, `as_strided`, views and writes through views are torch's. Only
channels-last layouts are kept this way; other dense permutations an op's meta kernel reports (the
output of `x.t() + 1`) stay contiguous, as they were.
"""

from __future__ import annotations

from typing import Any

import torch

# The dims from innermost to outermost in torch's channels-last test (`suggest_memory_format`).
_CHANNELS_LAST_ORDER = {4: (1, 3, 2, 0), 5: (1, 4, 3, 2, 0)}
_FORMAT_OF_RANK = {4: torch.channels_last, 5: torch.channels_last_3d}
FORMAT_NAMES = {torch.channels_last: "channels_last", torch.channels_last_3d: "channels_last_3d"}

# Convolutions whose meta kernel answers contiguous for a meta tensor (it cannot know the device's
# rule); the CPU's rule is that the output is channels-last when the input or the weight is.
_CONVOLUTIONS = frozenset({torch.ops.aten.convolution.default, torch.ops.aten._convolution.default})

Layout = tuple[tuple[int, ...], tuple[int, ...]]  # a tensor's (sizes, strides)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """torch's default (row-major) strides for a shape; a size-0 or size-1 dimension counts as 1."""
    strides = []
    running = 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


def channels_last_format(shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.memory_format | None:
    """`torch.channels_last(_3d)` when torch would suggest it for these strides (and they are not
    also contiguous), else None."""
    order = _CHANNELS_LAST_ORDER.get(len(shape))
    if order is None or strides == contiguous_strides(shape) or strides[1] == 0:
        return None
    smallest = 0
    for dim in order:
        if shape[dim] == 0 or strides[dim] < smallest:
            return None
        if dim == 0 and smallest == strides[1]:
            return None
        smallest = strides[dim]
    return _FORMAT_OF_RANK[len(shape)]


def storage_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """The dims, outermost first, in which a buffer holds a dense channels-last tensor of these
    strides; None for a layout kept contiguous (not channels-last, or with gaps or overlaps)."""
    if channels_last_format(shape, strides) is None:
        return None
    return dense_order(shape, strides)


def dense_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """The dims, outermost first, in which a dense buffer holds a tensor of these strides (a size-1
    dim where its stride puts it); None when the strides leave gaps or overlap."""
    order = tuple(sorted(range(len(shape)), key=lambda dim: (-strides[dim], -shape[dim])))
    expected = 1
    for dim in reversed(order):
        if shape[dim] != 1 and strides[dim] != expected:
            return None
        expected *= shape[dim]
    return order


def strides_in_order(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a dense tensor whose buffer holds its dims in `order` (outermost first)."""
    strides = [0] * len(shape)
    running = 1
    for dim in reversed(order):
        strides[dim] = running
        running *= max(shape[dim], 1)
    return tuple(strides)


def hinted_layout(tensor: torch.Tensor) -> Layout | None:
    """A tensor's sizes and strides as ints, symbolic ones (a fake tensor traced with dynamic shapes)
    read from their hints; None when one has no hint. A layout decided from hints holds for the
    other sizes too: channels-last strides are products of sizes (Dynamo specializes sizes 0 and 1)."""
    from torch.fx.experimental.symbolic_shapes import guarding_hint_or_throw, has_guarding_hint

    values = (*tensor.shape, *tensor.stride())
    if not all(type(value) is int or has_guarding_hint(value) for value in values):
        return None
    ints = tuple(value if type(value) is int else int(guarding_hint_or_throw(value)) for value in values)
    return ints[: tensor.dim()], ints[tensor.dim() :]


def convolution_format(input_layout: Layout, weight_layout: Layout) -> torch.memory_format | None:
    """The channels-last format the CPU gives a convolution's output (and its backward's input and
    weight gradients), from the (sizes, strides) of its input and weight: the input's or else the
    weight's, None when neither is channels-last."""
    for shape, strides in (input_layout, weight_layout):
        memory_format = channels_last_format(shape, strides)
        if memory_format is not None:
            return memory_format
    return None


def corrected_meta(op: Any, meta_args: tuple, result: Any) -> Any:
    """A meta kernel's result with the output strides the CPU gives where the meta kernel's differ."""
    if op in _CONVOLUTIONS:
        input_meta, weight_meta = meta_args[0], meta_args[1]
        input_layout = (tuple(input_meta.shape), tuple(input_meta.stride()))
        memory_format = convolution_format(input_layout, (tuple(weight_meta.shape), tuple(weight_meta.stride())))
        if memory_format is not None and result.dim() == input_meta.dim():
            return result.contiguous(memory_format=memory_format)
    return result


def dense_strides(tensor: torch.Tensor) -> tuple[int, ...] | None:
    """The strides of a dense tensor of this shape in the memory format `tensor` is contiguous in
    (contiguous first, then channels-last); None if it is contiguous in none."""
    from torch._prims_common import make_channels_last_strides_for, make_contiguous_strides_for

    if tensor.is_contiguous():
        return tuple(make_contiguous_strides_for(tensor.shape))
    if tensor.dim() in (4, 5) and tensor.is_contiguous(memory_format=torch.channels_last if tensor.dim() == 4 else torch.channels_last_3d):
        return tuple(make_channels_last_strides_for(tensor.shape))
    return None
