"""safetensors loads named for a chip: `load_file(path, device="tpu:1")`, `safe_open(path,
framework="pt", device="tpu")`, `load_model(model, path, device="tpu")`, as CUDA code names `cuda:N`.

safetensors' Rust core checks the device against the names it knows (cpu, cuda, mps, npu, xpu, ...)
and refuses any other ("device tpu is invalid"); it offers no hook to add one, and its `safe_open`
class cannot be subclassed. It does take a bare index, which torch resolves against the current
accelerator, tpu. So `safe_open` becomes a function that turns a tpu device into its chip index and
returns safetensors' own handle: each tensor is read on the host and copied to the chip by torch's
`.to`, which the dispatcher records as every other host-to-chip copy.

`load_file` and `load_model` look `safe_open` up in `safetensors.torch` at each call; a module that
bound safetensors' class before the backend was imported (`from safetensors import safe_open` in
transformers, accelerate or a script) is rebound to the function as well, one imported later gets it.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import torch

from tputrace.backend.compat import device_module
from tputrace.backend.core import chips

_TORCH_FRAMEWORKS = ("pt", "torch", "pytorch")
_installed = False


def _is_tpu(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "tpu"
    return isinstance(device, str) and (device == "tpu" or device.startswith("tpu:"))


def chip_for(device: Any) -> int:
    """The chip index safetensors is given for a tpu device: one that exists, on tpu as torch's accelerator."""
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type != "tpu":
        raise RuntimeError(
            f"safetensors: device={str(device)!r} needs tpu as torch's current accelerator (it is {accelerator}); "
            "load with device='cpu' and move the tensors with .to('tpu:N')"
        )
    chip = device_module.chip_index(device)
    chips.device(chip)  # a chip that does not exist is the backend's one-line error
    return chip


def _wrap(original: type) -> Any:
    def safe_open(filename: Any, framework: str, device: Any = "cpu", **options: Any) -> Any:
        if framework in _TORCH_FRAMEWORKS and _is_tpu(device):
            device = chip_for(device)
        return original(filename, framework, device, **options)

    safe_open.__doc__ = original.__doc__
    safe_open.__tputrace_original__ = original  # type: ignore[attr-defined]
    return safe_open


def install() -> None:
    """Replace safetensors' `safe_open` where it is bound (once; nothing when safetensors is absent)."""
    global _installed
    if _installed or importlib.util.find_spec("safetensors") is None:
        return
    import safetensors
    import safetensors.torch

    original = safetensors.safe_open
    ours = _wrap(original)
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get("safe_open") is original:
            namespace["safe_open"] = ours
    _installed = True
