"""A `--setup` for `../shared/eval/hf_zoo.py` that runs each architecture's forward through
`torch.compile(backend="tpu")` instead of eager mode (the CPU reference stays eager):

    cd ../shared/eval && python hf_zoo.py --device tpu --archs archs_public.txt --jobs 2 \\
        --setup "exec(open('<repo>/bench/hf_zoo_compiled.py').read())" --out compiled.json

The sweep's worker calls `_device_part(result, model, ...)`, which moves `model` to the device; the
model is handed over in a wrapper whose `.to(device)` moves it and compiles it, after clearing
Dynamo's caches so that each architecture compiles on its own.
"""

import sys

import torch

import tputrace.backend  # noqa: F401 - registers the tpu device

_zoo = sys.modules["__main__"]
_eager_device_part = _zoo._device_part


class _CompiledOnMove:
    """A model whose move to a device returns it compiled with the tpu backend."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def to(self, device: str) -> torch.nn.Module:
        torch._dynamo.reset()
        return torch.compile(self.model.to(device), backend="tpu")


def _compiled_device_part(result, model, inputs, expected, device, atol, rtol):  # noqa: ANN001, ANN202 - the sweep's signature
    return _eager_device_part(result, _CompiledOnMove(model), inputs, expected, device, atol, rtol)


_zoo._device_part = _compiled_device_part
