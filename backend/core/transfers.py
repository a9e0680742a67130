"""Copies between host torch tensors and chip arrays (bfloat16 and the float8 types, which NumPy
lacks, travel as their bit patterns)."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import jax
import numpy as np
import torch

from tputrace.backend.core.dtypes import FLOAT8, to_jax

_BIT_PATTERNS: dict[torch.dtype, tuple[torch.dtype, np.dtype]] = {
    torch.bfloat16: (torch.int16, np.dtype(np.int16)),
    **{dtype: (torch.uint8, np.dtype(np.uint8)) for dtype in FLOAT8},
}


def torch_to_array(host: torch.Tensor, device: jax.Device) -> jax.Array:
    """Put a CPU tensor's data on a JAX device."""
    if host.is_meta:
        raise NotImplementedError("Cannot copy out of meta tensor; no data!")  # torch's words, which Module.to extends
    to_jax(host.dtype)  # a dtype the chip cannot hold is a one-line error naming the ones it can
    # A private copy: XLA:CPU adopts an aligned host buffer (torch's are) without copying, even with
    # may_alias=False, so a later in-place change to the host tensor would show on the chip.
    source = host.detach().resolve_conj().resolve_neg()
    pattern = _BIT_PATTERNS.get(source.dtype)
    if pattern is not None:
        source = source.view(pattern[0])
    data = _private_copy(source)
    if pattern is not None:
        data = data.view(to_jax(host.dtype))
    return jax.device_put(data, device)


def array_to_torch(array: Any, dtype: torch.dtype, leading: tuple[int, int] | None = None) -> torch.Tensor:
    """A writable CPU tensor holding a copy of a chip array; with `leading` (dim, length), a copy of
    only the first `length` entries along `dim` (the array is copied to the host whole)."""
    data = np.asarray(array)
    if leading is not None:
        dim, length = leading
        data = data[(slice(None),) * dim + (slice(0, length),)]
    pattern = _BIT_PATTERNS.get(dtype)
    if pattern is not None:
        return _owned_copy(data.view(pattern[1])).view(dtype)
    if data.dtype != to_jax(dtype):
        data = data.astype(to_jax(dtype))
    return _owned_copy(data)


def _private_copy(source: torch.Tensor) -> np.ndarray:
    """A C-contiguous NumPy copy of a CPU tensor's data, made by NumPy in this thread through a DLPack view.

    Not torch's `clone`: torch spreads a copy over its intra-op threads, which wait for cores that the
    chip's programs hold on XLA:CPU (a 256 KiB copy took milliseconds). Not `numpy()` either: it marks
    the tensor's storage as not resizable, which the caller's tensor must stay."""
    try:
        view = np.from_dlpack(source)
    except (BufferError, TypeError, RuntimeError):  # a layout or dtype DLPack cannot carry
        return source.clone(memory_format=torch.contiguous_format).numpy()
    return np.array(view, copy=True, order="C")


@functools.cache
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty((0,), dtype)).dtype


def _owned_copy(data: np.ndarray) -> torch.Tensor:
    """A copy of `data` in storage of torch's own, resizable as a CPU tensor's is (a tensor over a
    NumPy array's memory is not), written by NumPy in this thread (see `_private_copy`)."""
    target = torch.empty(data.shape, dtype=_torch_dtype(data.dtype))
    try:
        np.copyto(np.from_dlpack(target), data, casting="no")
        return target
    except (BufferError, TypeError, RuntimeError, ValueError):
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the chip's read-only buffer, only read here
        source = torch.from_numpy(data)
    return target.copy_(source)
