"""The strides of a tpu `torch.cond`'s outputs: those its branches give them, as torch's `cond` on
the CPU keeps them (it returns the taken branch's tensors as they are, and its fake rule refuses
branches whose outputs' stride orders differ).

A dense layout that permutes the dims (a transposed result, a channels-last one) comes back as a
permuted view of a buffer that holds the dims in storage order, as channels-last tensors do. An
expanded dim (stride 0) comes back as an expand of the value's first slice along it, so the buffer
holds only that slice. Other layouts (gaps, a storage offset) come back contiguous, and so do the
outputs of branches whose strides differ (possible when the op is called directly, without
torch.cond's checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tputrace.backend.core.dtypes import to_jax
from tputrace.backend.core.memory_formats import contiguous_strides, dense_order, strides_in_order
from tputrace.backend.core.plans import OutSpec


@dataclass(frozen=True)
class BranchLayout:
    """One output's layout: its shape, the dims it is expanded along (stride 0), and the order in
    which its buffer holds the dims of the value with those dims cut to size 1 (None: row-major)."""

    shape: tuple[int, ...]
    expanded: tuple[int, ...]
    order: tuple[int, ...] | None

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return tuple(1 if dim in self.expanded else size for dim, size in enumerate(self.shape))


def layout_of(true_fake: torch.Tensor, false_fake: torch.Tensor) -> BranchLayout | None:
    """The layout both branches give an output; None when they differ or it is row-major or neither
    dense nor expanded."""
    shape, strides = tuple(true_fake.shape), tuple(true_fake.stride())
    if tuple(false_fake.stride()) != strides or true_fake.storage_offset() != 0 or false_fake.storage_offset() != 0:
        return None
    if all(size == 1 or stride == expected for size, stride, expected in zip(shape, strides, contiguous_strides(shape))):
        return None
    expanded = tuple(dim for dim, (size, stride) in enumerate(zip(shape, strides)) if stride == 0 and size > 1)
    stored_shape = tuple(1 if dim in expanded else size for dim, size in enumerate(shape))
    order = dense_order(stored_shape, strides)
    if order is None:
        return None
    if order == tuple(range(len(shape))):
        order = None
    return BranchLayout(shape, expanded, order)


def out_spec(fake: torch.Tensor, layout: BranchLayout | None) -> OutSpec:
    """The program output's spec: the value with its expanded dims cut, in storage order if permuted."""
    shape = tuple(fake.shape) if layout is None else layout.stored_shape
    nbytes = fake.element_size() * _numel(shape)
    if layout is None or layout.order is None:
        return OutSpec(shape, fake.dtype, to_jax(fake.dtype), nbytes)
    return OutSpec(shape, fake.dtype, to_jax(fake.dtype), nbytes, strides_in_order(shape, layout.order), layout.order)


def stored_values(values: Sequence[Any], layouts: Sequence[BranchLayout | None]) -> tuple:
    """The branch's values (traced into the program) with each expanded dim cut to its first slice."""
    return tuple(
        value if layout is None or not layout.expanded else value[tuple(slice(0, 1) if dim in layout.expanded else slice(None) for dim in range(value.ndim))]
        for value, layout in zip(values, layouts)
    )


def outputs(tensors: Sequence[torch.Tensor], layouts: Sequence[BranchLayout | None]) -> list[torch.Tensor]:
    """The op's outputs: each stored tensor expanded back to its shape where it was expanded."""
    return [tensor if layout is None or not layout.expanded else tensor.expand(layout.shape) for tensor, layout in zip(tensors, layouts)]


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
