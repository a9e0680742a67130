"""`pin_memory` for host tensors when `tpu` is the accelerator.

torch pins host memory with the accelerator's pinned-memory allocator, which a device written in
Python cannot provide (the C++ hooks interface has no Python binding for it), so `Tensor.pin_memory()`
and `DataLoader(pin_memory=True)` would fail. A chip copies host arrays itself (XLA:CPU even reads
torch's buffer in place), so no page-locked memory is needed: `pin_memory()` returns a contiguous host
copy, as torch's does, and `is_pinned()` stays False because nothing is page-locked. `torch.empty(...,
pin_memory=True)` still needs that allocator and raises torch's own error."""

from __future__ import annotations

import torch

_library: torch.library.Library | None = None


def _pin_memory(tensor: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    return tensor.clone(memory_format=torch.contiguous_format)


def register() -> None:
    """Register the host kernel once, when `tpu` is the accelerator (on a CUDA host torch pins for CUDA)."""
    global _library
    accelerator = torch.accelerator.current_accelerator()
    if _library is None and accelerator is not None and accelerator.type == "tpu":
        _library = torch.library.Library("aten", "IMPL")
        _library.impl("_pin_memory", _pin_memory, "CPU")
