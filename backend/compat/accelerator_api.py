"""`torch.accelerator` (device-generic code: recent transformers and accelerate call it) on `tpu`.

Its device and memory functions call into a C++ device guard and caching allocator, which a device
written in Python cannot supply (torch raises "Backend doesn't support synchronizing..." or an
internal assert). While `tpu` is the current accelerator, those functions answer from `torch.tpu`;
for any other accelerator they are torch's own. Streams are `torch.tpu`'s too: torch's own
`torch.Stream` for tpu cannot wait on a `torch.tpu.Event`, which FSDP2 records and then waits on
through `torch.accelerator.current_stream()`.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.accelerator
import torch.accelerator.memory

from tputrace.backend.compat import device_module
from tputrace.backend.core.dtypes import TORCH_TO_JAX

_installed = False


def _device_capability(device: Any = None, /) -> dict[str, Any]:
    device_module.chip_index(device)
    return {"supported_dtypes": set(TORCH_TO_JAX)}


def _memory_stats(device: Any = None, /) -> collections.OrderedDict[str, Any]:
    return collections.OrderedDict(sorted(device_module.memory_stats(device).items()))


def _reset_accumulated_memory_stats(device: Any = None, /) -> None:
    """Nothing accumulates beyond the live and peak counts."""


_OURS: dict[str, Callable[..., Any]] = {
    "synchronize": device_module.synchronize,
    "get_device_capability": _device_capability,
    "empty_cache": device_module.empty_cache,
    "get_memory_info": device_module.mem_get_info,
    "memory_allocated": device_module.memory_allocated,
    "max_memory_allocated": device_module.max_memory_allocated,
    "memory_reserved": device_module.memory_reserved,
    "max_memory_reserved": device_module.max_memory_reserved,
    "memory_stats": _memory_stats,
    "reset_peak_memory_stats": device_module.reset_peak_memory_stats,
    "reset_accumulated_memory_stats": _reset_accumulated_memory_stats,
    "current_stream": device_module.current_stream,
    "set_stream": device_module.set_stream,
}


def _on_tpu() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "tpu"


def _routed(original: Callable[..., Any], ours: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def routed(*args: Any, **kwargs: Any) -> Any:
        return ours(*args, **kwargs) if _on_tpu() else original(*args, **kwargs)

    routed.__tputrace_routed__ = True  # type: ignore[attr-defined]
    return routed


def install() -> None:
    """Route the functions in both `torch.accelerator` and `torch.accelerator.memory` (once)."""
    global _installed
    if _installed:
        return
    for namespace in (torch.accelerator, torch.accelerator.memory):
        for name, ours in _OURS.items():
            original = getattr(namespace, name, None)
            if original is not None and not getattr(original, "__tputrace_routed__", False):
                setattr(namespace, name, _routed(original, ours))
    _installed = True
