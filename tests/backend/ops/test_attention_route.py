"""scaled_dot_product_attention on tpu: one fused op where it computes as torch's math path does,
torch's math path elsewhere; values and gradients match the CPU in both eager modes."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from backend_helpers import OpNames, eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)


def _attention_case(mask: str, seed: int = 0) -> tuple[list[torch.Tensor], dict]:
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, 8, 16, generator=generator) for _ in range(3))
    kwargs: dict = {}
    if mask == "causal":
        kwargs["is_causal"] = True
    elif mask == "scale":
        kwargs["scale"] = 0.3
    elif mask == "bool":
        allowed = torch.rand(8, 8, generator=generator) > 0.4
        allowed[0] = False  # a fully masked row: zeros in torch's math path
        kwargs["attn_mask"] = allowed
    elif mask == "float":
        kwargs["attn_mask"] = torch.randn(8, 8, generator=generator)
    return [q, k, v], kwargs


def _run(device: str, tensors: list[torch.Tensor], kwargs: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [tensor.detach().to(device).requires_grad_() for tensor in tensors]
    moved = {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in kwargs.items()}
    out = F.scaled_dot_product_attention(*leaves, **moved)
    (out * torch.linspace(-1, 1, out.shape[-1], device=device)).sum().backward()
    return host(out), [host(leaf.grad) for leaf in leaves]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("mask", ["none", "causal", "scale", "bool", "float"])
def test_attention_and_its_gradients_match_the_cpu(mode: EagerMode, mask: str) -> None:
    tensors, kwargs = _attention_case(mask)
    expected_out, expected_grads = _run("cpu", tensors, kwargs)
    with eager(mode):
        out, grads = _run("tpu", tensors, kwargs)
    assert not expected_out.isnan().any()
    torch.testing.assert_close(out, expected_out, atol=1e-5, rtol=1e-5)
    for grad, expected in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask, fused", [("causal", True), ("none", True), ("bool", False), ("float", False)])
def test_only_cases_the_fused_op_computes_alike_take_it(mask: str, fused: bool) -> None:
    tensors, kwargs = _attention_case(mask)
    leaves = [tensor.detach().to("tpu").requires_grad_() for tensor in tensors]
    moved = {name: value.to("tpu") if isinstance(value, torch.Tensor) else value for name, value in kwargs.items()}
    with eager(EagerMode.DEFER_AND_FUSE), OpNames() as forward:
        out = F.scaled_dot_product_attention(*leaves, **moved)
    with eager(EagerMode.DEFER_AND_FUSE), OpNames() as backward:
        out.sum().backward()
    if fused:
        assert [name for name in forward.names if name != "aten::detach"] == ["aten::_scaled_dot_product_flash_attention_for_cpu"]
        assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in backward.names
        assert "aten::bmm" not in backward.names
    else:
        assert "aten::_safe_softmax" in forward.names and "aten::bmm" in forward.names


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_the_flash_op_with_a_float_mask_and_its_backward_match_the_cpu(mode: EagerMode) -> None:
    tensors, kwargs = _attention_case("float", seed=1)

    def run(device: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
        leaves = [tensor.detach().to(device).requires_grad_() for tensor in tensors]
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(*leaves, 0.0, False, attn_mask=kwargs["attn_mask"].to(device), scale=0.2)[0]
        (out * out).sum().backward()
        return host(out), [host(leaf.grad) for leaf in leaves]

    expected_out, expected_grads = run("cpu")
    with eager(mode):
        out, grads = run("tpu")
    torch.testing.assert_close(out, expected_out, atol=1e-5, rtol=1e-5)
    for grad, expected in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize(
    "shapes",
    [((2, 3, 8, 16), (2, 3, 8, 16), (2, 3, 8, 12)), ((2, 3, 8, 16), (1, 3, 8, 16), (1, 3, 8, 16)), ((2, 3, 5, 16), (2, 3, 8, 16), (2, 3, 8, 16))],
    ids=["value_head_size", "broadcast_batch", "cross_lengths"],
)
def test_shapes_the_flash_op_refuses_run_and_match_the_cpu(mode: EagerMode, shapes: tuple) -> None:
    generator = torch.Generator().manual_seed(2)
    tensors = [torch.randn(*shape, generator=generator) for shape in shapes]
    expected_out, expected_grads = _run("cpu", tensors, {})
    with eager(mode):
        out, grads = _run("tpu", tensors, {})
    torch.testing.assert_close(out, expected_out, atol=1e-5, rtol=1e-5)
    for grad, expected in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-5)
