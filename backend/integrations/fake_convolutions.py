"""Fake-tensor strides of tpu convolutions: the CPU's channels-last rule, as eager tpu ops follow it.

torch's fake kernel for `convolution` and `convolution_backward` asks the device's conv backend
which memory format its outputs get; for a PrivateUse1 device the answer is always contiguous. So
`torch.compile`, `make_fx` and `torch.export` would trace a channels_last model on tpu as if its conv
outputs (and every op after them) were contiguous. `install()` wraps torch's fake kernel so that on
tpu a convolution's output and its backward's input and weight gradients take the input's or the
weight's channels-last format (`memory_formats.convolution_format`), as on the CPU and in eager,
with symbolic sizes too (decided from their hints, as torch's rule decides).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses import fake_impls
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from tputrace.backend.core.memory_formats import convolution_format, hinted_layout

aten = torch.ops.aten
DEVICE_TYPE = "tpu"
_FORWARDS = (aten.convolution.default, aten._convolution.default, aten._convolution.deprecated)
_BACKWARDS = (aten.convolution_backward.default,)
_installed = False

FakeRule = Callable[..., Any]


def install() -> None:
    """Wrap torch's fake kernels of the convolution ops (idempotent)."""
    global _installed
    if _installed:
        return
    for op in (*_FORWARDS, *_BACKWARDS):
        torch_rule = fake_impls.op_implementations_dict.get(op)
        if torch_rule is not None:
            fake_impls.op_implementations_dict[op] = _tpu_rule(torch_rule)
    _installed = True


def _tpu_rule(torch_rule: FakeRule) -> FakeRule:
    def rule(fake_mode: FakeTensorMode, func: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
        result = torch_rule(fake_mode, func, *args, **kwargs)
        input_tensor = _argument(func, args, kwargs, "input")
        weight = _argument(func, args, kwargs, "weight")
        if not isinstance(input_tensor, FakeTensor) or input_tensor.fake_device.type != DEVICE_TYPE or not isinstance(weight, torch.Tensor):
            return result
        input_layout, weight_layout = hinted_layout(input_tensor), hinted_layout(weight)
        if input_layout is None or weight_layout is None:
            return result
        memory_format = convolution_format(input_layout, weight_layout)
        if memory_format is None:
            return result
        with fake_mode:
            if func in _BACKWARDS:
                grad_input, grad_weight, grad_bias = result
                return _in_format(grad_input, memory_format), _in_format(grad_weight, memory_format), grad_bias
            return _in_format(result, memory_format)

    return rule


def _argument(func: torch._ops.OpOverload, args: tuple, kwargs: dict, name: str) -> Any:
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            return args[position] if position < len(args) else kwargs.get(name)
    return None


def _in_format(tensor: torch.Tensor | None, memory_format: torch.memory_format) -> torch.Tensor | None:
    if tensor is None or tensor.dim() != (4 if memory_format is torch.channels_last else 5):
        return tensor
    return tensor.contiguous(memory_format=memory_format)
