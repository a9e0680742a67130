"""Ops that change a tpu tensor's metadata in place: in-place views (`squeeze_`, `t_`,
`as_strided_`, ...), `resize_`/`resize_as_` and `set_`.

A TpuTensor is a torch wrapper subclass, so its sizes and strides live in the C++ TensorImpl. As
torch does for wrapper subclasses (`return_and_correct_aliasing`), the new geometry is set by running
a meta kernel on the wrapper itself with dispatch disabled; the tensor's buffer and view chain are
then pointed at what the functional view computes, so reads and writes see the new shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._mode_utils import no_dispatch

from tputrace.backend.core import routing
from tputrace.backend.core.buffers import Buffer
from tputrace.backend.core.dtypes import to_torch
from tputrace.backend.core.tensor import TpuData, TpuTensor
from tputrace.backend.core.views import contiguous_strides

aten = torch.ops.aten

# In-place view op -> the functional view whose result the tensor becomes.
_VIEW_OF_INPLACE = {
    aten.squeeze_.default: aten.squeeze.default,
    aten.squeeze_.dim: aten.squeeze.dim,
    aten.squeeze_.dims: aten.squeeze.dims,
    aten.unsqueeze_.default: aten.unsqueeze.default,
    aten.transpose_.default: aten.transpose.int,
    aten.t_.default: aten.t.default,
    aten.as_strided_.default: aten.as_strided.default,
}


def _run_meta(func: Any, *args: Any) -> Any:
    """Run `func`'s meta kernel on the wrapper itself: only its sizes, strides and offset change."""
    with no_dispatch():
        include_meta = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            return func(*args)
        finally:
            torch._C._set_meta_in_tls_dispatch_include(include_meta)


def set_geometry(tensor: TpuTensor, shape: Sequence[int], strides: Sequence[int], offset: int) -> None:
    """Give the wrapper new sizes, strides and storage offset (a larger placeholder storage if needed)."""
    shape, strides = tuple(shape), tuple(strides)
    if tuple(tensor.shape) == shape and tuple(tensor.stride()) == strides and tensor.storage_offset() == offset:
        return
    needed = offset + 1 + sum((size - 1) * stride for size, stride in zip(shape, strides)) if all(shape) else 0
    storage = torch.Tensor.untyped_storage(tensor)
    if needed * tensor.element_size() > storage.nbytes():
        placeholder = torch.Tensor._make_wrapper_subclass(TpuData, (needed,), dtype=tensor.dtype, device=tensor.device)
        storage = torch.Tensor.untyped_storage(placeholder)
    _run_meta(aten.set_.source_Storage_storage_offset, tensor, storage, offset, shape, strides)
    tensor._geom = None


def become(tensor: TpuTensor, source: TpuTensor) -> TpuTensor:
    """Make `tensor` see what `source` sees: its buffer, view chain and geometry."""
    tensor._see(source)
    set_geometry(tensor, source.shape, source.stride(), source.storage_offset())
    return tensor


def _inplace_view(view_op: Any) -> Any:
    def handler(args: tuple, kwargs: dict) -> TpuTensor:
        dispatcher = routing.active()
        return become(args[0], dispatcher.dispatch(view_op, args, kwargs))

    return handler


def _buffer_numel(buf: Buffer) -> int:
    count = 1
    for size in buf.array.shape:
        count *= size
    return count


def resize(tensor: TpuTensor, size: Sequence[int]) -> TpuTensor:
    """`resize_`: contiguous strides at the same storage offset; the storage grows if it must (new
    elements are zero, where torch leaves them uninitialised)."""
    dispatcher = routing.active()
    shape = tuple(int(dim) for dim in size)
    if any(dim < 0 for dim in shape):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(shape)}")
    strides = contiguous_strides(shape)
    if shape == tuple(tensor.shape) and strides == tuple(tensor.stride()):
        return tensor
    numel = 1
    for dim in shape:
        numel *= dim
    offset = tensor.storage_offset()
    buf = tensor._buf
    if to_torch(buf.array.dtype) != tensor.dtype:
        raise RuntimeError("resize_ of a tpu tensor viewed as another dtype (Tensor.view(dtype)) is not supported")
    base = TpuTensor(buf, tuple(buf.array.shape), tensor.dtype)
    missing = offset + numel - _buffer_numel(buf)
    if missing > 0:
        flat = dispatcher.dispatch(aten.view.default, (base, [-1]), {})
        base = dispatcher.dispatch(aten.constant_pad_nd.default, (flat, [0, missing], 0), {})
        buf = base._buf
    if offset == 0 and numel == _buffer_numel(buf):
        view = dispatcher.dispatch(aten.view.default, (base, list(shape)), {}) if tuple(buf.array.shape) != shape else base
    else:
        view = dispatcher.dispatch(aten.as_strided.default, (base, list(shape), list(strides), offset), {})
    return become(tensor, view)


def _resize(args: tuple, kwargs: dict) -> TpuTensor:
    return resize(args[0], args[1])


def _resize_as(args: tuple, kwargs: dict) -> TpuTensor:
    return resize(args[0], args[1].shape)


def _set_source_tensor(args: tuple, kwargs: dict) -> TpuTensor:
    target, source = args
    if target.dtype != source.dtype:
        raise RuntimeError(f"Could not set tensor of type {source.dtype} to a tensor of type {target.dtype}")
    return become(target, source)


def _set_empty(args: tuple, kwargs: dict) -> TpuTensor:
    """`set_()`: the tensor becomes empty, on a storage of its own."""
    tensor = args[0]
    return become(tensor, torch.empty((0,), dtype=tensor.dtype, device=tensor.device))


def _is_set_to(args: tuple, kwargs: dict) -> bool:
    """Whether both tensors see the same storage with the same sizes, strides and offset."""
    tensor, other = args
    return (
        isinstance(other, TpuTensor) and tensor._buf is other._buf and tensor.storage_offset() == other.storage_offset()
        and tensor.shape == other.shape and tensor.stride() == other.stride()
    )


def _detach_(args: tuple, kwargs: dict) -> TpuTensor:
    return args[0]


def register() -> None:
    """Route the metadata-mutating ops to these handlers."""
    for inplace_op, view_op in _VIEW_OF_INPLACE.items():
        routing.register_special(inplace_op, _inplace_view(view_op))
    routing.register_special(aten.resize_.default, _resize)
    routing.register_special(aten.resize_as_.default, _resize_as)
    routing.register_special(aten.set_.source_Tensor, _set_source_tensor)
    routing.register_special(aten.set_.default, _set_empty)
    routing.register_special(aten.is_set_to.default, _is_set_to)
    routing.register_special(aten.detach_.default, _detach_)
