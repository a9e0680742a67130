"""Graph outputs with channels-last strides: handed back with the strides of their fake value.

A channels_last tpu tensor is a permuted view of a buffer that holds its dims in storage order
(`memory_formats`). An output whose fake value the graph traced as channels_last (a conv output, a
gradient of a channels_last weight) is transposed into that order inside the graph's XLA program,
where XLA fuses the transpose with the op that computes it, and wrapped as such a view: no program
of its own, and none at all for contiguous outputs. Outputs only the backward reads (saved
activations) stay in logical order, as the backward reads them, and so do new values of mutated
inputs, which are copied into the input at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import torch

from tputrace.backend.core.buffers import CountedBuffer
from tputrace.backend.core.memory_formats import hinted_layout, storage_order, strides_in_order
from tputrace.backend.core.tensor import TpuTensor, channels_last_tensor

# AOTAutograd's descriptions of the outputs whose strides reach the user: the forward's results,
# the backward's gradients, and the bases AOTAutograd regenerates output views from.
_STRIDED_OUTPUTS = frozenset({"PlainAOTOutput", "GradAOTOutput", "IntermediateBaseAOTOutput"})


@dataclass(frozen=True)
class StoredLayout:
    """A channels-last result: the tensor's shape and strides, and the dims in buffer order."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    order: tuple[int, ...]


def strided_outputs(descs: Sequence[Any] | None, count: int) -> frozenset[int]:
    """Indices of the outputs that get their fake value's strides; all of them without `descs`."""
    if descs is None:
        return frozenset(range(count))
    return frozenset(index for index, desc in enumerate(descs) if _kind(desc) in _STRIDED_OUTPUTS)


def _kind(desc: Any) -> str:
    while type(desc).__name__ == "SubclassGetAttrAOTOutput":
        desc = desc.base
    return type(desc).__name__


def stored_layout(fake: Any, shape: tuple[int, ...]) -> StoredLayout | None:
    """The layout of a result of this concrete shape whose fake value is a channels-last tpu tensor
    (its sizes may be symbolic); None for any other value."""
    if not isinstance(fake, torch.Tensor) or fake.device.type == "cpu" or fake.dim() not in (4, 5):
        return None
    traced = hinted_layout(fake)
    order = None if traced is None else storage_order(*traced)
    if order is None:
        return None
    traced_shape, traced_strides = traced
    return StoredLayout(shape, traced_strides if traced_shape == shape else strides_in_order(shape, order), order)


def to_storage_order(value: Any, layout: StoredLayout) -> Any:
    """A result's value (in logical order) as its buffer holds it (traced into the program)."""
    return jnp.transpose(value, layout.order)


def wrap(array: Any, chip: int, dtype: torch.dtype, layout: StoredLayout) -> TpuTensor:
    """The channels-last tensor over a program result held in storage order."""
    buf = CountedBuffer(array, chip, array.nbytes, (tuple(array.shape), dtype))
    return channels_last_tensor(buf, layout.shape, layout.strides, dtype, layout.order)
