"""The `tpu` device: importing this module registers it with PyTorch (nothing happens before).

After `import tputrace.backend`: `torch.device("tpu")`, `tensor.to("tpu")`, `.tpu()`, `.is_tpu`,
`module.to("tpu")` and the `torch.tpu` module work; ATen ops on tpu tensors run as XLA programs.
"""

from __future__ import annotations

import gc

from tputrace.backend.core import chips

chips.configure()

import jax  # noqa: E402 - XLA flags must be set before JAX initialises

jax.config.update("jax_enable_x64", True)

from tputrace.backend.core import compile_cache, exit_wait  # noqa: E402

exit_wait.register()

compile_cache.enable_from_environment()

from tputrace.backend.compat.registration import register  # noqa: E402

register()

from tputrace.backend.compat.device_module import EagerMode, eager_mode, set_eager_mode  # noqa: E402
from tputrace.backend.core.tensor import TpuTensor  # noqa: E402

# What is loaded by now (torch, JAX, the lowerings: ~370k objects) lives as long as the process.
# Frozen, it is no longer re-scanned by every full collection: DeferAndFuse's pending graphs keep
# enough objects alive to trigger one every few thousand ops, ~200 ms each here without the freeze.
gc.freeze()

from tputrace.recording import interface  # noqa: E402

interface.backend_loaded()  # a process a recorded script started records as its child

__all__ = ["EagerMode", "TpuTensor", "eager_mode", "set_eager_mode"]
