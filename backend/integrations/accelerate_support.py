"""Hugging Face accelerate (and `transformers.Trainer`, built on it) on `tpu`, as on CUDA.

accelerate before 1.16 picks its device from a fixed list of vendors (cuda, xpu, npu, mps, ...) and
ignores `torch.accelerator`, so `Accelerator()` and the Trainer's accelerator chose the host CPU while
transformers put the model on `tpu:0`. The only switch it offers, `ACCELERATE_TORCH_DEVICE`, is an
environment variable that outranks `cpu=True`/`use_cpu=True` and reaches child processes that never
register tpu, so it is not set here. From 1.16 it asks `torch.accelerator` and picks `tpu` itself, but
a process started as one of several ranks then trains alone, silently, as accelerate has no tpu
distributed type. So, while tpu is torch's current accelerator:

- `PartialState.default_device` is `tpu` where accelerate would fall back to the CPU or picked `tpu`
  itself, and a process started as one of several ranks gets a one-line error instead;
- `get_max_memory()` (behind `device_map="auto"`, `infer_auto_device_map`, `get_balanced_memory`)
  lists each chip's free memory under its index, as it lists CUDA devices, so models are placed
  on the chips first and only what does not fit goes to the host;
- `save_state`/`load_state` and the Trainer's checkpoints also save and restore the tpu generators'
  states (`checkpoint_rng`).

Neither accelerate nor `transformers.trainer` is imported here (accelerate costs ~65 ms): a finder on
`sys.meta_path` adapts each right after it has been imported, or at once if it already was. The
Trainer needs its own: `transformers.trainer` imports accelerate before it defines `Trainer`.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
import sys
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tputrace.backend.compat import device_module
from tputrace.backend.integrations import checkpoint_rng

_PACKAGE = "accelerate"
_TRAINER_MODULE = "transformers.trainer"
_adapted = False
_trainer_adapted = False
_logger = logging.getLogger(__name__)

MemoryBudget = dict[int | str, int | str]


def _on_tpu() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "tpu"


def _launched_ranks() -> int:
    """How many processes the launcher (torchrun, `accelerate launch`, `tputrace run --nproc`) started."""
    return max(int(os.environ.get(name, "1")) for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"))


def _default_device(original: property) -> property:
    def default_device(state: Any) -> torch.device:
        device = original.fget(state)
        if device.type not in ("cpu", "tpu") or not _on_tpu():
            return device
        if _launched_ranks() > 1:
            raise RuntimeError(
                "accelerate has no multi-process mode for tpu; launch a single process, or train the "
                "ranks with dist.init_process_group('tpu') and DistributedDataParallel directly"
            )
        return torch.device("tpu")

    default_device.__doc__ = original.__doc__
    return property(default_device)


def _get_max_memory(original: Callable[..., dict[int | str, int]], to_bytes: Callable[[str], int]) -> Callable[..., Any]:
    def get_max_memory(max_memory: MemoryBudget | None = None) -> dict[int | str, int]:
        if not _on_tpu():
            return original(max_memory)
        chip_count = device_module.device_count()
        if max_memory is None:
            free_bytes: dict[int | str, int] = {index: device_module.mem_get_info(index)[0] for index in range(chip_count)}
            return {**free_bytes, **original(None)}
        for key, value in max_memory.items():  # in place, as accelerate converts them (transformers relies on it)
            if isinstance(value, str):
                max_memory[key] = to_bytes(value)
        chips = sorted(key for key in max_memory if isinstance(key, int))
        for index in chips:
            if not 0 <= index < chip_count:
                _logger.warning(f"Device {index} is not available, available devices are {list(range(chip_count))}")
        others = original({key: value for key, value in max_memory.items() if not isinstance(key, int)})
        return {**{index: max_memory[index] for index in chips}, **others}

    get_max_memory.__doc__ = original.__doc__
    get_max_memory.__tputrace_original__ = original  # type: ignore[attr-defined]
    return get_max_memory


def _rebind(original: object, replacement: object) -> None:
    """Point every name that a loaded module bound to `original` (under any name, such as
    transformers' `accelerate_max_memory`) at `replacement`."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name in [name for name, value in namespace.items() if value is original]:
            namespace[name] = replacement


def _warn_layout(package: str, consequence: str) -> None:
    version = getattr(sys.modules[package.split(".")[0]], "__version__", "?")
    warnings.warn(f"tputrace: this {package} ({version}) is laid out differently from the versions adapted to tpu; "
                  f"{consequence}", stacklevel=3)


def _adapt_device_and_memory() -> None:
    from accelerate.state import PartialState
    from accelerate.utils import modeling

    default_device = PartialState.__dict__.get("default_device")
    if not isinstance(default_device, property) or not callable(getattr(modeling, "get_max_memory", None)):
        _warn_layout(_PACKAGE, "Accelerator() may pick the CPU")
        return
    PartialState.default_device = _default_device(default_device)
    original_max_memory = modeling.get_max_memory
    _rebind(original_max_memory, _get_max_memory(original_max_memory, modeling.convert_file_size_to_int))


def _adapt_checkpoints() -> None:
    from accelerate import checkpointing

    save = getattr(checkpointing, "save_accelerator_state", None)
    load = getattr(checkpointing, "load_accelerator_state", None)
    rng_state_name = getattr(checkpointing, "RNG_STATE_NAME", None)
    if not callable(save) or not callable(load) or not isinstance(rng_state_name, str):
        _warn_layout(_PACKAGE, "save_state/load_state leave out the tpu generators' states")
        return
    _rebind(save, checkpoint_rng.saving_chip_states(save, rng_state_name))
    _rebind(load, checkpoint_rng.restoring_chip_states(load, rng_state_name))


def adapt() -> None:
    """Adapt the imported accelerate package to tpu (once)."""
    global _adapted
    if _adapted:
        return
    _adapted = True
    _adapt_device_and_memory()
    _adapt_checkpoints()


def adapt_trainer() -> None:
    """Make the imported `transformers.Trainer`'s checkpoints carry the tpu generators' states (once)."""
    global _trainer_adapted
    if _trainer_adapted:
        return
    _trainer_adapted = True
    trainer_class = getattr(sys.modules[_TRAINER_MODULE], "Trainer", None)
    if not all(callable(getattr(trainer_class, name, None)) for name in ("_save_rng_state", "_load_rng_state")):
        _warn_layout("transformers", "its Trainer's checkpoints leave out the tpu generators' states")
        return
    checkpoint_rng.adapt_trainer(trainer_class)  # type: ignore[arg-type]


class _AdaptingLoader:
    """A module's own loader, which runs its adaptation once the module has run."""

    def __init__(self, loader: Any, finder: _AdaptingFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._finder.adapt()
        sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not self._finder]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _AdaptingFinder:
    """Finds one module with the other finders and hands back its spec with an adapting loader. It
    stays until the module has been imported: `importlib.util.find_spec` (transformers' availability
    checks) asks finders without importing."""

    def __init__(self, module_name: str, adapt: Callable[[], None]) -> None:
        self.module_name = module_name
        self.adapt = adapt

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.module_name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _AdaptingLoader(spec.loader, self)
                return spec
        return None


def _adapt_on_import(module_name: str, adapt: Callable[[], None]) -> None:
    """Run `adapt` now if `module_name` is imported, else right after it is (nothing when its top-level
    package is not installed; that check imports nothing)."""
    if module_name in sys.modules:
        adapt()
    elif importlib.util.find_spec(module_name.split(".")[0]) is not None:
        if not any(isinstance(finder, _AdaptingFinder) and finder.module_name == module_name for finder in sys.meta_path):
            sys.meta_path.insert(0, _AdaptingFinder(module_name, adapt))


def install() -> None:
    """Adapt accelerate and the Trainer now if they are imported, else when they are."""
    _adapt_on_import(_PACKAGE, adapt)
    _adapt_on_import(_TRAINER_MODULE, adapt_trainer)
