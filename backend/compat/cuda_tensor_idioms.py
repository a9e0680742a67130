"""The tensor-level CUDA idioms `tputrace run --as-cuda` maps to the tpu chip.

- `tensor.is_cuda` is true for a tensor on a tpu chip, so a script's `if x.is_cuda:` takes its GPU branch;
- the legacy tensor types (`torch.cuda.FloatTensor(2, 3)`, `torch.cuda.LongTensor([1, 2])`, ...) make tpu tensors
  of their dtype, and `isinstance(x, torch.cuda.FloatTensor)` is true for a float32 tensor on tpu;
- `torch.cuda.utilization()` answers 0 (no busy-time sampler exists for a chip: the trace's device-idle finding
  tells how busy it was), and `torch.cuda.current_blas_handle()` answers 0 (no cuBLAS handle exists).
"""

from __future__ import annotations

from typing import Any

import torch

DEVICE_TYPE = "tpu"
# torch.cuda's legacy tensor type names and the dtype each makes.
LEGACY_TENSOR_DTYPES = {
    "FloatTensor": torch.float32,
    "DoubleTensor": torch.float64,
    "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16,
    "ByteTensor": torch.uint8,
    "CharTensor": torch.int8,
    "ShortTensor": torch.int16,
    "IntTensor": torch.int32,
    "LongTensor": torch.int64,
    "BoolTensor": torch.bool,
}

_installed = False


def _is_cuda(tensor: torch.Tensor) -> bool:
    return tensor.device.type in ("cuda", DEVICE_TYPE)


class _LegacyTensorType(type):
    """The metaclass of a legacy tensor type: `isinstance` checks the dtype and the device."""

    dtype: torch.dtype

    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, torch.Tensor) and instance.dtype == cls.dtype and _is_cuda(instance)

    def __call__(cls, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        """As torch's legacy constructor: sizes (ints or one `torch.Size`) give an uninitialized tensor, one
        sequence or tensor gives a tensor of those values; either on the tpu chip in this type's dtype."""
        device = kwargs.pop("device", None) or DEVICE_TYPE
        if kwargs:
            raise TypeError(f"{cls.__name__}() got unexpected keyword arguments {sorted(kwargs)}")
        if all(isinstance(arg, int) for arg in args) or (len(args) == 1 and isinstance(args[0], torch.Size)):
            sizes = tuple(args[0]) if args and isinstance(args[0], torch.Size) else args
            return torch.empty(sizes, dtype=cls.dtype, device=device)
        if len(args) == 1:
            return torch.as_tensor(args[0], dtype=cls.dtype, device=device)
        raise TypeError(f"{cls.__name__}() takes sizes or one sequence of values, not {args!r}")


def legacy_tensor_type(name: str) -> type:
    """`torch.cuda.<name>` under `--as-cuda`: a type whose constructor makes tpu tensors of its dtype."""
    return _LegacyTensorType(name, (), {"dtype": LEGACY_TENSOR_DTYPES[name], "__module__": "torch.cuda"})


def utilization(device: Any = None) -> int:
    """The percent of time a kernel ran, which NVML samples on a GPU: 0, since no sampler exists for a chip."""
    return 0


def current_blas_handle() -> int:
    """cuBLAS's handle: 0, since tpu matmuls are compiled by XLA and no cuBLAS handle exists."""
    return 0


def install() -> None:
    """Map the tensor-level CUDA idioms to tpu for the rest of the process. Idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    torch.Tensor.is_cuda = property(_is_cuda)  # type: ignore[method-assign,assignment]
    for name in LEGACY_TENSOR_DTYPES:
        setattr(torch.cuda, name, legacy_tensor_type(name))
    torch.cuda.utilization = utilization
    torch.cuda.current_blas_handle = current_blas_handle
