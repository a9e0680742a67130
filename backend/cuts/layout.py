"""The cut of a data-dependent output: making one, telling one apart, and the padded buffer behind it.

A cut is the first `length` entries along a dim of a buffer compiled for a padded length (see
`length_buckets`): a narrow view whose chain is marked (`host_cut`), so that a host read copies the
buffer and cuts it there, and ops on the chip can run on the buffer instead (see the package's note).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.tensor import TpuTensor, whole_buffer
from tputrace.backend.views import ViewChain

aten = torch.ops.aten

_REMEMBERED_LENGTHS = 16
# The lengths of the latest cuts -> the padded length each was cut from (the latest last); empty
# until the process's first cut, and never again after it.
recent_lengths: dict[int, int] = {}


def cut(padded: Any, dim: int, length: int) -> Any:
    """The first `length` entries along `dim` of `padded` (an output compiled for a padded length): a
    view whose chain is marked, so that a host read of any tensor seen through it copies the buffer
    and cuts it there (`host_cut`)."""
    view = padded.narrow(dim, 0, length)  # a whole-length cut too, so its consumers share the padded programs
    if padded._view is None:
        view._view.host_cut = (dim, length)
        if not recent_lengths:
            from tputrace.backend.cuts.routes import route_through_cuts  # the routes cut: they import this module

            route_through_cuts()
        recent_lengths.pop(length, None)
        if len(recent_lengths) >= _REMEMBERED_LENGTHS:
            del recent_lengths[next(iter(recent_lengths))]
        recent_lengths[length] = padded.shape[dim]
    return view


def host_cut(tensor: Any) -> tuple[int, int] | None:
    """(dim, length) when `tensor` is the first `length` entries along `dim` of its buffer's array and
    is read by cutting that array on the host, else None. (A chain belongs to one base geometry, so
    any view of the same steps is such a cut too.)"""
    view = tensor._view
    return None if view is None else view.host_cut


def is_cut(value: Any) -> bool:
    """Whether `value` is a tpu tensor read as a cut of its padded buffer (`cut`)."""
    return type(value) is TpuTensor and value._view is not None and value._view.host_cut is not None


def shared_cut(values: Sequence[Any]) -> tuple[int, int] | None:
    """(dim, length) when every value is a cut of that dim and length, of one shape and one padded
    shape; else None."""
    if not all(is_cut(value) for value in values):
        return None
    first = values[0]
    layout = (first._view.host_cut, tuple(first.shape), tuple(first._buf.array.shape))
    if any((value._view.host_cut, tuple(value.shape), tuple(value._buf.array.shape)) != layout for value in values[1:]):
        return None
    return first._view.host_cut


def cut_then(value: Any, view_op: Any) -> tuple[int, int, Any] | None:
    """(the cut dim, the length, the step) when `value` is `view_op` applied to a cut (`.t()` of
    `x[mask]`, its `unsqueeze(1)`); else None."""
    if type(value) is not TpuTensor or value._view is None:
        return None
    steps = value._view.steps
    if len(steps) != 2 or steps[1].key[0] is not view_op:
        return None
    under = ViewChain.root(steps[0]).host_cut  # the chain of the first step exists: it was made first
    return None if under is None else (*under, steps[1])


def cut_layout(value: Any) -> tuple[int, int, int | None] | None:
    """(the cut dim in the value, the length, the dim an `unsqueeze` inserted or None) for a cut or an
    `unsqueeze` of one (`weights.unsqueeze(-1)`); else None."""
    if is_cut(value):
        return (*value._view.host_cut, None)
    under = cut_then(value, aten.unsqueeze.default)
    if under is None:
        return None
    dim, length, step = under
    at = step.args[0] % value.dim()
    return dim + (at <= dim), length, at


def padded_of(value: TpuTensor, unsqueezed_at: int | None) -> TpuTensor:
    """The padded buffer of a cut, or of the cut an `unsqueeze` at `unsqueezed_at` was applied to, seen
    with the value's dims (`cut_layout`)."""
    buffer = whole_buffer(value)
    return buffer if unsqueezed_at is None else aten.unsqueeze.default(buffer, unsqueezed_at)


def cut_or_unsqueezed(value: TpuTensor) -> tuple[TpuTensor, int, int] | None:
    """(the padded buffer with the value's dims, the cut dim, the length) for a cut or an `unsqueeze`
    of one; else None."""
    layout = cut_layout(value)
    if layout is None:
        return None
    dim, length, unsqueezed_at = layout
    return padded_of(value, unsqueezed_at), dim, length


def cut_from_end(value: TpuTensor, layout: tuple[int, int, int | None]) -> tuple[int, int, int]:
    """(the cut dim counted from the end, as broadcasting aligns dims; the length; the padded length)
    of a value of that `cut_layout`."""
    dim, length, unsqueezed_at = layout
    return dim - value.dim(), length, value._buf.array.shape[dim - (unsqueezed_at is not None and unsqueezed_at < dim)]
