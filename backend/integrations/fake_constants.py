"""Fake-tensor constant propagation with tpu results: they stay fakes without a constant.

When every input of an op is a fake with a known value (a tensor the traced code built from Python
data, such as transformers' sliding-window cache's `torch.tensor(window)`), FakeTensorMode runs the
op for real and makes its small results constant fakes. `torch.tensor(4).to(x.device)` then gives a
real TpuTensor, whose fake is a TpuTensor around a fake inner tensor (it is a traceable wrapper
subclass), not a FakeTensor that can hold a constant; torch asserted ("fake_tensor must be a
FakeTensor with a constant"), and `torch.compile` of Mistral's forward failed there. `install()`
tells the mode that a tpu tensor does not turn constant: the op then runs on fakes, as it does for
inputs of unknown value, and its result is the usual fake tpu tensor.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

_installed = False


def install() -> None:
    """Wrap `FakeTensorMode.may_turn_const` (idempotent)."""
    global _installed
    if _installed:
        return
    from tputrace.backend.core.tensor import TpuTensor

    torch_rule = FakeTensorMode.may_turn_const

    def may_turn_const(self: FakeTensorMode, tensor: torch.Tensor) -> bool:
        return type(tensor) is not TpuTensor and torch_rule(self, tensor)

    may_turn_const.__wrapped__ = torch_rule  # type: ignore[attr-defined]
    FakeTensorMode.may_turn_const = may_turn_const  # type: ignore[method-assign]
    _installed = True
