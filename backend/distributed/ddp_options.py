"""DistributedDataParallel options a device written in Python cannot run, refused in one line.

`find_unused_parameters=True` and `static_graph=True` make DDP's C++ reducer copy its map of used
parameters to the device through a pinned host buffer, allocated with the device's
`PrivateUse1HooksInterface::getPinnedMemoryAllocator`, which torch's Python device hooks cannot
provide: the first backward raised a `NotImplementedError` naming C++ hooks. The constructor now says
so, and what to write instead.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

_installed = False

_MESSAGE = (
    "DistributedDataParallel({option}=True) is not supported on tpu: torch's reducer needs a pinned-memory "
    "allocator that a device written in Python cannot register; leave it False and make every parameter "
    "take part in each step's loss (e.g. add 0.0 * parameter.sum() for parameters a step skips)"
)


def _on_tpu(module: torch.nn.Module) -> bool:
    return any(parameter.device.type == "tpu" for parameter in module.parameters())


def install() -> None:
    """Wrap DDP's constructor to refuse those options for a model on tpu (once)."""
    global _installed
    if _installed:
        return
    original = DistributedDataParallel.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        arguments = signature.bind(self, *args, **kwargs).arguments
        for option in ("find_unused_parameters", "static_graph"):
            if arguments.get(option) and _on_tpu(arguments["module"]):
                raise RuntimeError(_MESSAGE.format(option=option))
        original(self, *args, **kwargs)

    DistributedDataParallel.__init__ = __init__  # type: ignore[method-assign]
    _installed = True
