"""scaled_dot_product_attention on tpu follows the backends a user selects with `sdpa_kernel` as the
CPU does: MATH takes the math path (double backward and forward AD work), a selection the CPU finds
no kernel for raises the CPU's error, and the default keeps the flash op."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from backend_helpers import OpNames, assert_matches_cpu, eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
FLASH_OP = "aten::_scaled_dot_product_flash_attention_for_cpu"


def _qkv(shape: tuple[int, ...] = (2, 2, 4, 8), seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=generator) for _ in range(3)]


def _gradient_penalty_grad(device: str, backends: list[SDPBackend], is_causal: bool) -> torch.Tensor:
    """The query's gradient of a gradient penalty: a double backward through the attention."""
    q, k, v = (tensor.to(device).requires_grad_() for tensor in _qkv())
    with sdpa_kernel(backends):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    (grad_q,) = torch.autograd.grad((out**2).sum(), q, create_graph=True)
    return host(torch.autograd.grad((grad_q**2).sum(), q)[0])


def _jacobian(device: str) -> torch.Tensor:
    q, k, v = (tensor.to(device) for tensor in _qkv((1, 2, 3, 4), seed=1))
    with sdpa_kernel(SDPBackend.MATH):
        return host(torch.func.jacfwd(lambda query: F.scaled_dot_product_attention(query, k, v))(q))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_double_backward_under_math_matches_the_cpu(mode: EagerMode, is_causal: bool) -> None:
    expected = _gradient_penalty_grad("cpu", [SDPBackend.MATH], is_causal)
    with eager(mode):
        got = _gradient_penalty_grad("tpu", [SDPBackend.MATH], is_causal)
    assert_matches_cpu(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_jacfwd_under_math_matches_the_cpu(mode: EagerMode) -> None:
    expected = _jacobian("cpu")
    with eager(mode):
        got = _jacobian("tpu")
    assert_matches_cpu(got, expected)


def _forward_op_names(backends: list[SDPBackend] | None) -> list[str]:
    q, k, v = (tensor.to("tpu").requires_grad_() for tensor in _qkv())
    with eager(EagerMode.DEFER_AND_FUSE), OpNames() as recorded:
        if backends is None:
            F.scaled_dot_product_attention(q, k, v)
        else:
            with sdpa_kernel(backends):
                F.scaled_dot_product_attention(q, k, v)
    return [name for name in recorded.names if name != "aten::detach"]


def test_the_default_selection_still_runs_the_flash_op() -> None:
    assert _forward_op_names(None) == [FLASH_OP]


@pytest.mark.parametrize(
    "backends, flash",
    [([SDPBackend.MATH], False), ([SDPBackend.FLASH_ATTENTION], True), ([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH], True)],
    ids=["math", "flash", "flash_and_math"],
)
def test_the_selection_picks_the_path(backends: list[SDPBackend], flash: bool) -> None:
    names = _forward_op_names(backends)
    assert (FLASH_OP in names) == flash
    assert ("aten::_safe_softmax" in names) == (not flash)


def _case(name: str) -> tuple[list[torch.Tensor], dict]:
    generator = torch.Generator().manual_seed(3)
    q, k, v = _qkv((2, 4, 4, 8), seed=3)
    if name == "bool_mask":
        allowed = torch.rand(4, 4, generator=generator) > 0.4
        allowed[0] = False  # a fully masked row: zeros from the CPU's flash kernel too
        return [q, k, v], {"attn_mask": allowed}
    if name == "float_mask":
        return [q, k, v], {"attn_mask": torch.randn(2, 1, 4, 4, generator=generator)}
    if name == "grouped_heads":
        return [q, k[:, :2], v[:, :2]], {"enable_gqa": True}
    if name == "dropout":
        return [q, k, v], {"dropout_p": 0.5}
    if name == "three_d":
        return [q[0], k[0], v[0]], {}
    if name == "broadcast_batch":
        return [q, k[:1], v[:1]], {}
    if name == "value_head_size":
        return [q, k, v[..., :6]], {}
    if name in ("plain", "key_last_stride"):
        return [q, k, v], {}
    raise ValueError(name)


def _on_device_layout(name: str, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    """The inputs as the call gets them: a copy to tpu is contiguous, so strides are made there."""
    if name != "key_last_stride":
        return leaves
    query, key, value = leaves
    return [query, key.transpose(-1, -2).contiguous().transpose(-1, -2), value]


def _outcome(device: str, backends: list[SDPBackend], name: str) -> tuple[torch.Tensor, list[torch.Tensor]] | str:
    """The output and input gradients, or the error torch raised."""
    tensors, kwargs = _case(name)
    leaves = [tensor.to(device).requires_grad_() for tensor in tensors]
    moved = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in kwargs.items()}
    try:
        with sdpa_kernel(backends), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = F.scaled_dot_product_attention(*_on_device_layout(name, leaves), **moved)
    except RuntimeError as error:
        return f"RuntimeError: {error}"
    out.sum().backward()
    return host(out), [host(leaf.grad) for leaf in leaves]


def _assert_matches_the_cpu(backends: list[SDPBackend], name: str, mode: EagerMode) -> None:
    expected = _outcome("cpu", backends, name)
    with eager(mode):
        got = _outcome("tpu", backends, name)
    if isinstance(expected, str):
        assert got == expected
    else:
        assert_matches_cpu(got, expected)


_NO_KERNEL_CASES = ["dropout", "three_d", "broadcast_batch", "value_head_size", "key_last_stride"]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("name", ["plain", "bool_mask", "float_mask", "grouped_heads", *_NO_KERNEL_CASES])
def test_flash_only_runs_or_refuses_as_the_cpu(mode: EagerMode, name: str) -> None:
    _assert_matches_the_cpu([SDPBackend.FLASH_ATTENTION], name, mode)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize(
    "backends",
    [[SDPBackend.EFFICIENT_ATTENTION], [SDPBackend.CUDNN_ATTENTION], [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]],
    ids=["efficient", "cudnn", "efficient_and_cudnn"],
)
@pytest.mark.parametrize("name", ["plain", "bool_mask", "three_d"])
def test_cuda_only_backends_raise_the_cpus_error(mode: EagerMode, backends: list[SDPBackend], name: str) -> None:
    _assert_matches_the_cpu(backends, name, mode)


def test_flash_only_warns_why_the_flash_kernel_refuses() -> None:
    q, k, v = (tensor.to("tpu") for tensor in _qkv())
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), pytest.warns(UserWarning, match="non-zero dropout"), pytest.raises(RuntimeError, match="No available kernel"):
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
