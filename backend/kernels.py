"""Python kernels for the PrivateUse1 dispatch key: the factories and copies that run before any tpu
tensor exists (so they never reach `__torch_dispatch__`), and the ops torch's C++ calls on a tpu
tensor with the Python dispatch key excluded."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tputrace.backend import chips, device_module, sparse
from tputrace.backend.dtypes import to_jax
from tputrace.backend.tensor import Buffer, TpuTensor

_library: torch.library.Library | None = None


def _zeros(size: Any, dtype: torch.dtype | None, device: Any) -> TpuTensor:
    dtype = dtype or torch.get_default_dtype()
    chip = device_module.chip_index(device)
    shape = tuple(int(dim) for dim in size)
    array = jax.device_put(np.zeros(shape, to_jax(dtype)), chips.device(chip))
    numel = 1
    for dim in shape:
        numel *= dim
    return TpuTensor(Buffer(array, chip, numel * dtype.itemsize), shape, dtype)


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):  # noqa: ANN001, ANN201
    sparse.empty_layout_error(layout)
    return _zeros(size, dtype, device)


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):  # noqa: ANN001, ANN201
    sparse.empty_layout_error(layout)
    return _zeros(size, dtype, device)


def efficient_zero_tensor(size, dtype=None, layout=None, device=None, pin_memory=None):  # noqa: ANN001, ANN201
    """The zero tangent of forward-mode AD: plain zeros (torch's lazy zero tensor is a CPU/CUDA kernel)."""
    return _zeros(size, dtype, device)


def copy_from(source, destination, non_blocking=False):  # noqa: ANN001, ANN201
    from tputrace.backend.dispatch import dispatcher

    return dispatcher.dispatch(torch.ops.aten.copy_.default, (destination, source), {})


def local_scalar_dense(tensor):  # noqa: ANN001, ANN201
    """`item()` called from torch's C++ with the Python dispatch key excluded, where `__torch_dispatch__`
    does not run: `torch.tensor([a, b])` of 0-dim tpu tensors (torch builds the host tensor that way)."""
    from tputrace.backend.dispatch import dispatcher

    return dispatcher.dispatch(torch.ops.aten._local_scalar_dense.default, (tensor,), {})


def _arange(*args: Any, **kwargs: Any) -> Any:
    return jnp.arange(*args)


def _linspace(start: Any, end: Any, steps: int, **kwargs: Any) -> Any:
    return jnp.linspace(start, end, steps)


def _logspace(start: Any, end: Any, steps: int, base: float = 10.0, **kwargs: Any) -> Any:
    return jnp.power(base, jnp.linspace(start, end, steps))


def _eye(n: int, m: int | None = None, **kwargs: Any) -> Any:
    return jnp.eye(n, n if m is None else m)


def _tril_indices(row: int, col: int, offset: int = 0, **kwargs: Any) -> Any:
    return jnp.stack(jnp.tril_indices(row, offset, col))


def _triu_indices(row: int, col: int, offset: int = 0, **kwargs: Any) -> Any:
    return jnp.stack(jnp.triu_indices(row, offset, col))


def _kaiser_window(window_length: int, periodic: bool = True, beta: float = 12.0, **kwargs: Any) -> Any:
    """torch's definition: a periodic window is the symmetric one of length + 1 without its last point."""
    if window_length <= 1:
        return jnp.ones((window_length,))
    return jnp.kaiser(window_length + 1 if periodic else window_length, beta)[:window_length]


def _randperm(n: int, *, key: Any, **kwargs: Any) -> Any:
    return jax.random.permutation(key, n)


_DEVICE_FACTORIES = {
    "arange": _arange,
    "arange.start": _arange,
    "arange.start_step": _arange,
    "linspace": _linspace,
    "logspace": _logspace,
    "eye": _eye,
    "eye.m": _eye,
    "tril_indices": _tril_indices,
    "triu_indices": _triu_indices,
    "kaiser_window": _kaiser_window,
    "kaiser_window.periodic": _kaiser_window,
    "kaiser_window.beta": _kaiser_window,
}
# Drawn from the chip's generator (torch.tpu.manual_seed) or the one passed as `generator=`, as rand and randint are.
_RANDOM_DEVICE_FACTORIES = {"randperm": _randperm, "randperm.generator": _randperm}


def _device_factory(name: str, fn: Any, needs_key: bool = False) -> Any:
    """A factory kernel that computes its values on the chip (an op in the trace, no host copy)."""
    from tputrace.backend.entries import classify
    from tputrace.backend.ops.registry import Lowering

    packet_name, _, overload_name = name.partition(".")
    op = getattr(getattr(torch.ops.aten, packet_name), overload_name or "default")
    entry = classify(op)
    entry.lowering = Lowering(op, fn, needs_key)
    entry.kind = "lowered"

    def kernel(*args: Any, **kwargs: Any) -> Any:
        from tputrace.backend.dispatch import dispatcher

        return dispatcher.compute(entry, args, kwargs)

    return kernel


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
    for name, fn in _DEVICE_FACTORIES.items():
        _library.impl(name, _device_factory(name, fn), "PrivateUse1")
    for name, fn in _RANDOM_DEVICE_FACTORIES.items():
        _library.impl(name, _device_factory(name, fn, needs_key=True), "PrivateUse1")
