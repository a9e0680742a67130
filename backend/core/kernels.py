"""Python kernels for the PrivateUse1 dispatch key: the factories and copies that run before any tpu
tensor exists (so they never reach `__torch_dispatch__`), and the ops torch's C++ calls on a tpu
tensor with the Python dispatch key excluded."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

from tputrace.backend.compat import device_module
from tputrace.backend.core import chips, routing, sparse
from tputrace.backend.core.buffers import CountedBuffer
from tputrace.backend.core.dtypes import to_jax
from tputrace.backend.core.memory_formats import storage_order
from tputrace.backend.core.tensor import TpuTensor, channels_last_tensor

_library: torch.library.Library | None = None


def _zeros(size: Any, dtype: torch.dtype | None, device: Any, strides: Any = None) -> TpuTensor:
    """Zeros on the chip; channels-last strides (`memory_formats`) make a channels-last tensor, any
    other strides a contiguous one."""
    dtype = dtype or torch.get_default_dtype()
    chip = device_module.chip_index(device)
    shape = tuple(int(dim) for dim in size)
    negative = next((dim for dim in shape if dim < 0), None)
    if negative is not None:
        raise RuntimeError(f"Trying to create tensor with negative dimension {negative}: {list(shape)}")
    numel = 1
    for dim in shape:
        numel *= dim
    order = storage_order(shape, tuple(int(stride) for stride in strides)) if strides is not None else None
    stored_shape = shape if order is None else tuple(shape[dim] for dim in order)
    buf = CountedBuffer(jax.device_put(np.zeros(stored_shape, to_jax(dtype)), chips.device(chip)), chip, numel * dtype.itemsize)
    if order is None:
        return TpuTensor(buf, shape, dtype)
    return channels_last_tensor(buf, shape, tuple(int(stride) for stride in strides), dtype, order)


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):  # noqa: ANN001, ANN201
    sparse.empty_layout_error(layout)
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        strides = torch.empty(tuple(size), device="meta", memory_format=memory_format).stride()
        return _zeros(size, dtype, device, strides)
    return _zeros(size, dtype, device)


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):  # noqa: ANN001, ANN201
    sparse.empty_layout_error(layout)
    return _zeros(size, dtype, device, stride)


def efficient_zero_tensor(size, dtype=None, layout=None, device=None, pin_memory=None):  # noqa: ANN001, ANN201
    """The zero tangent of forward-mode AD: plain zeros (torch's lazy zero tensor is a CPU/CUDA kernel)."""
    return _zeros(size, dtype, device)


def copy_from(source, destination, non_blocking=False):  # noqa: ANN001, ANN201
    return routing.active().dispatch(torch.ops.aten.copy_.default, (destination, source), {})


def local_scalar_dense(tensor):  # noqa: ANN001, ANN201
    """`item()` called from torch's C++ with the Python dispatch key excluded, where `__torch_dispatch__`
    does not run: `torch.tensor([a, b])` of 0-dim tpu tensors (torch builds the host tensor that way)."""
    return routing.active().dispatch(torch.ops.aten._local_scalar_dense.default, (tensor,), {})


# Factories that take no tensor: their kernels run the lowering registered with the other ops
# (ops/factories.py, ops/random.py) on the chip, so `torch.arange(..., device="tpu")` and
# `torch.arange(..., out=t)` compute alike. `scalar_tensor` (the value of `x[mask] = 1.5`) is one op
# rather than torch's default, a host copy of an empty tensor and a `fill_`. randperm draws from the chip's generator
# (torch.tpu.manual_seed) or the one passed as `generator=`, as rand and randint do.
_DEVICE_FACTORIES = (
    "arange",
    "arange.start",
    "arange.start_step",
    "linspace",
    "logspace",
    "eye",
    "eye.m",
    "tril_indices",
    "triu_indices",
    "kaiser_window",
    "kaiser_window.periodic",
    "kaiser_window.beta",
    "randperm",
    "randperm.generator",
    "scalar_tensor",
)


def _device_factory(name: str) -> Any:
    """A factory kernel that computes its values on the chip (an op in the trace, no host copy)."""
    from tputrace.backend.core import arg_checks
    from tputrace.backend.core.entries import classify

    packet_name, _, overload_name = name.partition(".")
    op = getattr(getattr(torch.ops.aten, packet_name), overload_name or "default")
    entry = classify(op)
    if entry.kind != "lowered":
        raise LookupError(f"{name} has no lowering to run as a tpu factory kernel")

    check = arg_checks.value_check(op)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        dispatcher = routing.active()
        if check is not None:
            check(args, kwargs)
        return dispatcher.compute(entry, args, kwargs)

    return kernel


def record_stream(tensor: torch.Tensor, stream: Any) -> None:
    """`Tensor.record_stream`: nothing to record, since a chip runs its programs on one in-order queue and a buffer is
    freed only after the programs that read it. FSDP1 calls it with the Python key excluded (`_no_dispatch_record_stream`)
    in its post-backward hook, on autograd's worker thread, where a missing kernel aborted the process."""


def register() -> None:
    """Register the kernels once."""
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("empty.memory_format", empty_memory_format, "PrivateUse1")
    _library.impl("empty_strided", empty_strided, "PrivateUse1")
    _library.impl("_copy_from", copy_from, "PrivateUse1")
    _library.impl("_efficientzerotensor", efficient_zero_tensor, "PrivateUse1")
    _library.impl("_local_scalar_dense", local_scalar_dense, "PrivateUse1")
    _library.impl("record_stream", record_stream, "PrivateUse1")
    for name in _DEVICE_FACTORIES:
        _library.impl(name, _device_factory(name), "PrivateUse1")
