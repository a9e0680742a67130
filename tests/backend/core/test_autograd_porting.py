"""Autograd as training code written for CUDA uses it, on `tpu` against the CPU, in both eager modes:
activation checkpointing with dropout, errors raised in backward hooks, inference tensors, in-place
ops with scalar exponents, and ops that must not run on the host."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
mode_ids = pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)


@mode_ids
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_recomputes_the_forwards_dropout_mask(mode: EagerMode, use_reentrant: bool) -> None:
    """The recomputation restores the chip's RNG state, so dropout's gradient uses the forward's mask."""
    with eager(mode):
        x = torch.ones(256, device="tpu", requires_grad=True)
        y = checkpoint(lambda t: F.dropout(t, 0.5) * 1.0, x, use_reentrant=use_reentrant)
        y.sum().backward()
        assert torch.equal(host(x.grad), (host(y) != 0).float() * 2)


@mode_ids
def test_inplace_ops_with_a_scalar_argument_match_the_cpu(mode: EagerMode) -> None:
    calls: list[Callable[[torch.Tensor], object]] = [
        lambda t: t.__ipow__(2),
        lambda t: t.pow_(3.0),
        lambda t: t.pow_(torch.full_like(t, 2.0)),
        lambda t: t.ldexp_(torch.full_like(t, 2.0)),
        lambda t: t.floor_divide_(torch.full_like(t, 2.0)),
    ]
    with eager(mode):
        for call in calls:
            expected, target = torch.tensor([1.5, -2.0, 3.0]), torch.tensor([1.5, -2.0, 3.0], device="tpu")
            call(expected)
            call(target)
            torch.testing.assert_close(host(target), expected)
        doubles = torch.tensor([1.5, -2.0], dtype=torch.float64, device="tpu")
        doubles.float_power_(2)
        assert host(doubles).tolist() == [2.25, 4.0]


@mode_ids
def test_views_and_detach_of_inference_tensors_stay_inference_tensors(mode: EagerMode) -> None:
    with eager(mode):
        with torch.inference_mode():
            frozen = torch.ones(3, device="tpu")
        assert frozen[:1].is_inference() and frozen.detach().is_inference()
        weight = torch.ones(3, device="tpu", requires_grad=True)
        with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
            weight * frozen[:3]
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
            frozen[:1].mul_(2)


def _tensor_hook(device: str) -> None:
    x = torch.ones(2, device=device, requires_grad=True)
    x.register_hook(lambda grad: {}["missing"])
    (x * 2).sum().backward()


def _module_hook(device: str) -> None:
    layer = nn.Linear(2, 2).to(device)
    layer.register_full_backward_hook(lambda module, grad_in, grad_out: 1 / 0)
    layer(torch.ones(1, 2, device=device, requires_grad=True)).sum().backward()


def _post_accumulate_hook(device: str) -> None:
    x = torch.ones(2, device=device, requires_grad=True)
    x.register_post_accumulate_grad_hook(lambda param: [][1])
    (x * 2).sum().backward()


def _autograd_grad_hook(device: str) -> None:
    x = torch.ones(2, device=device, requires_grad=True)
    y = x * 2
    y.register_hook(lambda grad: (_ for _ in ()).throw(ValueError("bad gradient")))
    torch.autograd.grad(y.sum(), x)


def _op_error_in_backward(device: str) -> None:
    class Doubling(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
            return grad[:1].expand(3).add_(1.0)  # writes into an expanded tensor: torch refuses

    x = torch.ones(3, device=device, requires_grad=True)
    torch.autograd.grad(Doubling.apply(x).sum(), x)


RAISING_BACKWARDS = {
    "tensor hook": _tensor_hook,
    "module full backward hook": _module_hook,
    "post-accumulate-grad hook": _post_accumulate_hook,
    "hook under autograd.grad": _autograd_grad_hook,
    "op error under autograd.grad": _op_error_in_backward,
}


@mode_ids
@pytest.mark.parametrize("case", sorted(RAISING_BACKWARDS))
def test_an_error_in_backward_is_raised_by_the_backward_call(mode: EagerMode, case: str) -> None:
    """As on the CPU: the exception leaves backward() or autograd.grad(); the process does not abort."""
    run = RAISING_BACKWARDS[case]
    with pytest.raises(Exception) as on_cpu:
        run("cpu")
    with eager(mode), pytest.raises(type(on_cpu.value)) as on_tpu:
        run("tpu")
    assert str(on_tpu.value) == str(on_cpu.value)
    with eager(mode):  # the next backward is unaffected
        x = torch.ones(2, device="tpu", requires_grad=True)
        x.register_hook(lambda grad: grad * 3)
        (x * 2).sum().backward()
        assert host(x.grad).tolist() == [6.0, 6.0]


@mode_ids
def test_comparisons_distributions_and_weight_norm_stay_on_the_chip(mode: EagerMode) -> None:
    """allclose/equal, distribution argument checks and weight_norm's backward: no CPU fallback."""
    values = torch.tensor([1.0, 2.0, float("nan")])
    nearby = values + torch.tensor([1e-9, 0.0, 0.0])
    torch.manual_seed(0)
    cpu_layer = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3))
    inputs = torch.arange(8.0).reshape(2, 4)
    cpu_layer(inputs).pow(2).sum().backward()
    with eager(mode), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        a, b = values.to("tpu"), nearby.to("tpu")
        assert not torch.allclose(a, b) and torch.allclose(a, b, equal_nan=True)
        assert not torch.equal(a, a) and torch.equal(a[:2], a[:2].clone()) and not torch.equal(a[:2], a)
        # Explicit validate_args: torch.compile's first use turns the process-wide default off.
        normal = torch.distributions.Normal(torch.zeros(3, device="tpu"), torch.ones(3, device="tpu"), validate_args=True)
        assert normal.log_prob(torch.ones(3, device="tpu")).sum().item() == pytest.approx(3 * (-0.5 - 0.9189385), rel=1e-5)
        with pytest.raises(ValueError, match="scale"):
            torch.distributions.Normal(torch.zeros(3, device="tpu"), -torch.ones(3, device="tpu"), validate_args=True)
        torch.manual_seed(0)
        layer = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3)).to("tpu")
        layer(inputs.to("tpu")).pow(2).sum().backward()
    for on_chip, on_host in zip(layer.parameters(), cpu_layer.parameters()):
        torch.testing.assert_close(host(on_chip.grad), on_host.grad, rtol=1e-4, atol=1e-4)


def test_writing_a_tpu_result_into_a_host_tensor_is_a_device_error() -> None:
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.zeros(3).add_(torch.ones(3, device="tpu"))


@mode_ids
def test_gamma_rsample_gradient_runs_on_the_chip(mode: EagerMode) -> None:
    """Reparameterized Gamma samples (`_standard_gamma` and its implicit gradient) stay on the chip."""
    with eager(mode), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        concentration = torch.tensor([0.5, 1.0, 3.0], device="tpu", requires_grad=True)
        sample = torch.distributions.Gamma(concentration, torch.ones(3, device="tpu")).rsample()
        sample.sum().backward()
        expected = torch._standard_gamma_grad(host(concentration), host(sample))
        torch.testing.assert_close(host(concentration.grad), expected, rtol=1e-3, atol=1e-5)


class _HostGradient(torch.autograd.Function):
    """Scales its first input by its second; the backward gives the second a gradient made on the host
    (`torch.ones(shape)`), the first a gradient on the incoming gradient's device."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * weight

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad * 2, torch.ones(grad.shape)


def _leaf_backward(device: str) -> torch.Tensor:
    weight = torch.ones(3, device=device, requires_grad=True)
    _HostGradient.apply(torch.ones(3, device=device, requires_grad=True), weight).sum().backward()
    return weight


def _non_leaf_backward(device: str) -> torch.Tensor:
    weight = torch.ones(3, device=device, requires_grad=True)
    _HostGradient.apply(torch.ones(3, device=device), weight * torch.ones(3, device=device)).sum().backward()
    return weight


def _autograd_grad(device: str) -> torch.Tensor:
    weight = torch.ones(3, device=device, requires_grad=True)
    torch.autograd.grad(_HostGradient.apply(torch.ones(3, device=device), weight).sum(), weight)
    return weight


HOST_GRADIENTS = {"leaf": _leaf_backward, "non-leaf": _non_leaf_backward, "autograd.grad": _autograd_grad}


@mode_ids
@pytest.mark.parametrize("case", sorted(HOST_GRADIENTS))
def test_a_function_returning_a_host_gradient_for_a_tpu_input_raises_torchs_device_error(mode: EagerMode, case: str) -> None:
    """torch's engine refuses a gradient on another device than its input (a `meta` input here, as a
    `cuda` one), but skips the check for tensor subclasses: the tpu device makes it, with torch's message."""
    run = HOST_GRADIENTS[case]
    with pytest.raises(RuntimeError) as on_meta:
        run("meta")
    expected = "Function _HostGradientBackward returned an invalid gradient at index 1 - expected device tpu:0 but got cpu"
    assert str(on_meta.value) == expected.replace("tpu:0", "meta")
    with eager(mode):
        with pytest.raises(RuntimeError) as on_tpu:
            run("tpu")
        assert str(on_tpu.value) == expected
        weight = torch.ones(3, device="tpu", requires_grad=True)  # the next backward is unaffected
        (weight * 2).sum().backward()
        assert host(weight.grad).tolist() == [2.0, 2.0, 2.0]


def test_a_function_returning_a_tpu_gradient_for_a_host_input_raises_torchs_device_error() -> None:
    class ToChip(torch.autograd.Function):
        @staticmethod
        def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
            return grad.to("tpu")

    x = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="^Function ToChipBackward returned an invalid gradient at index 0 - expected device cpu but got tpu:0$"):
        ToChip.apply(x).sum().backward()
    assert x.grad is None


class _Doubling(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, grad_shape: tuple[int, ...] | None) -> torch.Tensor:
        ctx.grad_shape = grad_shape
        return x * 2

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.grad_shape is None:
            return grad * 2, None
        return torch.full(ctx.grad_shape, 5.0), None


@mode_ids
def test_function_gradients_on_the_chip_and_host_gradients_of_0_dim_inputs_are_kept(mode: EagerMode) -> None:
    """A gradient on the input's device passes; a host gradient of a 0-dim input (also one that torch
    sums to 0-dim) is moved to the chip, as torch moves it to `cuda`; a host gradient whose shape does
    not fit gets torch's shape error, which the engine checks before the device."""
    with eager(mode):
        x = torch.ones(3, device="tpu", requires_grad=True)
        _Doubling.apply(x * 1.0, None).sum().backward()
        assert x.grad.device.type == "tpu" and host(x.grad).tolist() == [2.0, 2.0, 2.0]
        (grad,) = torch.autograd.grad(_Doubling.apply(x, None).sum(), x)
        assert grad.device.type == "tpu" and host(grad).tolist() == [2.0, 2.0, 2.0]
        for grad_shape in [(), (1,), (1, 1)]:
            scalar = torch.tensor(1.0, device="tpu", requires_grad=True)
            _Doubling.apply(scalar, grad_shape).backward()
            assert scalar.grad.device.type == "tpu" and scalar.grad.shape == () and scalar.grad.item() == 5.0
        with pytest.raises(RuntimeError, match=r"^Function _DoublingBackward returned an invalid gradient at index 0 - got \[\] but expected shape compatible with \[3\]$"):
            _Doubling.apply(x, ()).sum().backward()
