"""`tputrace run --as-cuda`: run a script written for CUDA unchanged on the `tpu` device.

`install()` makes the CUDA spellings a script uses to choose and reach its device mean `tpu`:

- `torch.cuda`'s device functions (`is_available`, `device_count`, `current_device`, `set_device`,
  `synchronize`, `manual_seed(_all)`, `get_device_name`, `memory_allocated`, `empty_cache`,
  `is_bf16_supported`) answer for the tpu chips;
- `torch.cuda`'s streams and events (`Stream`, `Event`, `current_stream`, `stream`, ...), peak and reserved
  memory, device properties and generator state: the tpu device module's, where work runs in one queue per
  chip and recording an event waits for the chip;
- `torch.autocast("cuda")` and `torch.cuda.amp.autocast` autocast on tpu, in float16 unless given a dtype,
  as on CUDA;
- `Tensor.cuda()` and `Module.cuda()` move to the tpu chip of the same index;
- `tensor.is_cuda`, the legacy tensor types (`torch.cuda.FloatTensor`, ...), `torch.cuda.utilization()` and
  `current_blas_handle()`: see `cuda_tensor_idioms`;
- `torch.load` restores storages mapped to `cuda` or `cuda:N` (`map_location="cuda"`, or a checkpoint saved on a
  GPU) onto the tpu chip of the same index;
- `torch.cuda.nvtx`'s ranges are profiler ranges (`record_function`), recorded as named ranges;
- torch's own lookup of the accelerator (`torch._utils._get_available_device_type`, which `nn.DataParallel`
  asks) answers `tpu`, so DataParallel splits batches over the tpu chips as it does for a tpu script;
- a torch function mode rewrites every `device=` keyword and every device argument of `Tensor.to`
  (`"cuda"`, `"cuda:1"`, `torch.device("cuda")`) to the tpu device of the same index.

Not mapped: a `torch.device("cuda")` object itself (its `.type` stays `"cuda"`, so a script comparing
`x.device.type == "cuda"` sees `"tpu"` on its tensors), and CUDA-only kernels and libraries.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch._utils
from torch.overrides import TorchFunctionMode

from tputrace.backend.compat import cuda_tensor_idioms, device_module, nvtx_ranges
from tputrace.backend.integrations import checkpoints

DEVICE_TYPE = "tpu"
# torch.cuda functions replaced by the tpu device module's function of the same name.
MAPPED_CUDA_FUNCTIONS = (
    "is_available",
    "device_count",
    "current_device",
    "set_device",
    "synchronize",
    "manual_seed",
    "manual_seed_all",
    "get_device_name",
    "memory_allocated",
    "empty_cache",
    "is_bf16_supported",
    "is_initialized",
    "device",
    "seed",
    "seed_all",
    "initial_seed",
    "get_rng_state",
    "set_rng_state",
    "get_rng_state_all",
    "set_rng_state_all",
    "get_device_properties",
    "max_memory_allocated",
    "reset_peak_memory_stats",
    "memory_reserved",
    "max_memory_reserved",
    "reset_max_memory_allocated",
    "mem_get_info",
    "memory_stats",
    "memory_summary",
    "set_per_process_memory_fraction",
    "reset_accumulated_memory_stats",
    "ipc_collect",
    "Event",
    "Stream",
    "current_stream",
    "default_stream",
    "stream",
    "set_stream",
)

_mode: CudaToTpuMode | None = None


def tpu_device(device: Any) -> Any:
    """`device` with a CUDA device (a string or `torch.device`) turned into the tpu device of the same
    index; anything else unchanged."""
    if isinstance(device, str) and (device == "cuda" or device.startswith("cuda:")):
        return torch.device(DEVICE_TYPE + device[len("cuda"):])
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device(DEVICE_TYPE, device.index) if device.index is not None else torch.device(DEVICE_TYPE)
    return device


class CudaToTpuMode(TorchFunctionMode):
    """Rewrites CUDA devices in `device=` keywords and in `Tensor.to`'s arguments to tpu devices."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = tpu_device(kwargs["device"])
        if func is torch.Tensor.to or getattr(func, "__name__", None) == "to":
            args = tuple(tpu_device(arg) for arg in args)
        return func(*args, **kwargs)


def _tensor_cuda(tensor: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> torch.Tensor:
    return tensor.to(_indexed_tpu(device), non_blocking=non_blocking, **kwargs)


def _module_cuda(module: torch.nn.Module, device: Any = None) -> torch.nn.Module:
    return module.to(_indexed_tpu(device))


def _indexed_tpu(device: Any) -> torch.device:
    if device is None:
        return torch.device(DEVICE_TYPE)
    if isinstance(device, int):
        return torch.device(DEVICE_TYPE, device)
    mapped = tpu_device(device)
    return mapped if isinstance(mapped, torch.device) else torch.device(mapped)


def _autocast_on_tpu(init: Callable[..., None]) -> Callable[..., None]:
    """`torch.autocast`'s constructor with the `cuda` device type made `tpu`, in the dtype CUDA's autocast
    defaults to (float16) unless one is given (`torch.cuda.amp.autocast` passes its own through it too)."""

    @functools.wraps(init)
    def make(self: Any, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
             cache_enabled: bool | None = None) -> None:
        if device_type == "cuda":
            device_type, dtype = DEVICE_TYPE, torch.float16 if dtype is None else dtype
        init(self, device_type, dtype, enabled, cache_enabled)

    return make


def _available_device_type() -> str:
    """torch's `_get_available_device_type` under `--as-cuda`: CUDA is tpu, so the accelerator is."""
    return DEVICE_TYPE


def install() -> None:
    """Map CUDA to tpu for the rest of the process (this thread's torch function modes included).
    Idempotent."""
    global _mode
    if _mode is not None:
        return
    for name in MAPPED_CUDA_FUNCTIONS:
        setattr(torch.cuda, name, getattr(device_module, name))
    torch.Tensor.cuda = _tensor_cuda  # type: ignore[method-assign,assignment]
    torch.nn.Module.cuda = _module_cuda  # type: ignore[method-assign,assignment]
    # DataParallel's module (`torch.nn.parallel.data_parallel` is also the name of a function) imported the lookup by name.
    for module in (torch._utils, importlib.import_module("torch.nn.parallel.data_parallel")):
        module._get_available_device_type = _available_device_type  # type: ignore[attr-defined]
    autocast_class = torch.amp.autocast_mode.autocast
    autocast_class.__init__ = _autocast_on_tpu(autocast_class.__init__)  # type: ignore[method-assign]
    checkpoints.register_cuda_locations()
    nvtx_ranges.install()
    cuda_tensor_idioms.install()
    _mode = CudaToTpuMode()
    _mode.__enter__()
