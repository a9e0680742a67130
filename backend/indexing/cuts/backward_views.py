"""The `expand` and `squeeze` autograd's own backward formulas take of a cut's gradient, on the padded
buffer: a copy broadcast to (or squeezed from) the padded length, cut in turn, so that the gradient's
ops run on the padded buffer too."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch.autograd.graph import _engine_run_backward

from tputrace.backend.core.entries import bound
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.core.tensor import TpuTensor, whole_buffer
from tputrace.backend.indexing.cuts.layout import cut, cut_layout, is_cut, padded_of, recent_shapes, without_leading_ones

aten = torch.ops.aten
_BACKEND_DIR = os.path.dirname(sys.modules["tputrace.backend"].__file__ or "")  # the backend's package: the frames of the dispatch
_ENGINE_RUN_BACKWARD = _engine_run_backward.__code__  # where `backward()` and `autograd.grad` enter the engine


def expand_in_backward(dispatcher: DispatcherApi, op: Any, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`expand` run by autograd's backward to the shape of a recent cut (up to leading 1s) along a new
    or size-1 dim at its cut dim (the backward of `x[mask].mean()` or `.sum()`:
    `grad.expand(x[mask].shape)`; a tensor of another shape that merely has a cut's length in a dim,
    as `adaptive_avg_pool2d`'s gradient, keeps torch's layout), or of a cut (or its reshape) along another
    dim: the tensor broadcast to the padded length, then cut, so that the gradient's ops run on the
    padded buffer (the same values, whichever dim is taken).
    None (a plain view) elsewhere: outside a backward the result must alias its input, and so must
    that of an expand called from Python code in a backward (a custom Function's, a hook), which may
    write into it (torch refuses a write into an expanded tensor); autograd's own formulas, which
    call it from C++, do not write into an expanded gradient."""
    if type(args[0]) is not TpuTensor or torch._C._current_graph_task_id() == -1 or not _called_by_a_formula():
        return None
    self, size = args[0], list(args[1] if len(args) > 1 else kwargs["size"])
    leading = len(size) - self.dim()
    if leading < 0:
        return None
    size = [self.shape[dim - leading] if target == -1 and dim >= leading else target for dim, target in enumerate(size)]
    layout = cut_layout(self)
    if layout is not None:  # the backward of a reduction along another dim (`x[mask].sum(1)`)
        cut_dim, length, _ = layout
        padded_self = padded_of(self, layout)
        cut_dim += leading
        if size[cut_dim] != length:
            return None
        size[cut_dim] = padded_self.shape[cut_dim - leading]
        return cut(aten.expand_copy.default(padded_self, size), cut_dim, length)
    key = without_leading_ones(size)
    recent = recent_shapes.get(key)
    if recent is None:
        return None
    dim, padded_length = recent[0] + len(size) - len(key), recent[1]
    if not 0 <= dim < len(size):  # a cut of length 1 among leading 1s: its shape is any tensor's of 1s
        return None
    length = size[dim]
    if length <= 1 or (dim >= leading and self.shape[dim - leading] != 1):
        return None
    size[dim] = padded_length
    return cut(aten.expand_copy.default(self, size), dim, length)


def squeeze_in_backward(dispatcher: DispatcherApi, op: Any, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`squeeze(dim)` of a cut run by autograd's backward (the gradient of `weights.unsqueeze(-1)`)
    along a size-1 dim other than the cut's: a copy of the padded buffer squeezed, cut in turn, so
    that the gradient's ops run on the padded buffer. None (a plain view) elsewhere, as for
    `expand_in_backward`."""
    if not is_cut(args[0]):
        return None
    self, dim = bound(op, args, kwargs)
    if not -self.dim() <= dim < self.dim() or torch._C._current_graph_task_id() == -1 or not _called_by_a_formula():
        return None
    dim %= self.dim()
    cut_dim, length = self._view.host_cut
    if dim == cut_dim or self.shape[dim] != 1:
        return None
    return cut(aten.squeeze_copy.dim(whole_buffer(self), dim), cut_dim - (dim < cut_dim), length)


def _called_by_a_formula() -> bool:
    """Whether the op being dispatched was called from C++ (one of autograd's built-in backward formulas),
    not from Python code: the first frame below the backend's own is the backward's call into the engine
    (`_engine_run_backward`), or there is none (the engine's worker thread)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_BACKEND_DIR):
        frame = frame.f_back
    return frame is None or frame.f_code is _ENGINE_RUN_BACKWARD
