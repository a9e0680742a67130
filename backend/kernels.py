"""Python kernels for the PrivateUse1 dispatch key: the factories and copies that run before any tpu
tensor exists (so they never reach `__torch_dispatch__`)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

from tputrace.backend import chips, device_module
from tputrace.backend.dtypes import to_jax
from tputrace.backend.tensor import Buffer, TpuTensor

_library: torch.library.Library | None = None


def _chip(device: Any) -> int:
    if device is None:
        return device_module.current_device()
    index = torch.device(device).index
    return device_module.current_device() if index is None else index


def _zeros(size: Any, dtype: torch.dtype | None, device: Any) -> TpuTensor:
    dtype = dtype or torch.get_default_dtype()
    chip = _chip(device)
    shape = tuple(int(dim) for dim in size)
    array = jax.device_put(np.zeros(shape, to_jax(dtype)), chips.device(chip))
    numel = 1
    for dim in shape:
        numel *= dim
    return TpuTensor(Buffer(array, chip, numel * dtype.itemsize), shape, dtype)


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):  # noqa: ANN001, ANN201
    return _zeros(size, dtype, device)


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):  # noqa: ANN001, ANN201
    return _zeros(size, dtype, device)


def copy_from(source, destination, non_blocking=False):  # noqa: ANN001, ANN201
    from tputrace.backend.dispatch import dispatcher

    return dispatcher.dispatch(torch.ops.aten.copy_.default, (destination, source), {})


def _host_factory(make: Any) -> Any:
    """A factory kernel that builds the values on the host and copies them to the chip."""

    def kernel(*args: Any, dtype=None, layout=None, device=None, pin_memory=None, **kwargs: Any):  # noqa: ANN001, ANN202
        from tputrace.backend.dispatch import dispatcher

        host = make(*args, dtype=dtype, **kwargs)
        return dispatcher.from_host(host, _chip(device))

    return kernel


_HOST_FACTORIES = {
    "arange": lambda end, dtype=None: torch.arange(end, dtype=dtype),
    "arange.start": lambda start, end, dtype=None: torch.arange(start, end, dtype=dtype),
    "arange.start_step": lambda start, end, step=1, dtype=None: torch.arange(start, end, step, dtype=dtype),
    "linspace": lambda start, end, steps, dtype=None: torch.linspace(start, end, steps, dtype=dtype),
    "logspace": lambda start, end, steps, base=10.0, dtype=None: torch.logspace(start, end, steps, base, dtype=dtype),
}


def register() -> None:
    """Register the kernels once."""
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("empty.memory_format", empty_memory_format, "PrivateUse1")
    _library.impl("empty_strided", empty_strided, "PrivateUse1")
    _library.impl("_copy_from", copy_from, "PrivateUse1")
    for name, make in _HOST_FACTORIES.items():
        _library.impl(name, _host_factory(make), "PrivateUse1")
