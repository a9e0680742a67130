"""Lazy modules (`nn.LazyLinear`, `nn.LazyConv2d`, `nn.LazyBatchNorm2d`) on tpu as on CUDA: moved or
built on tpu they stay uninitialized until their first forward (or `load_state_dict`), which
materialises them on their chip; they then train as the same model does on the CPU."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parameter import is_lazy

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
mode_ids = pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)


def lazy_net() -> nn.Sequential:
    return nn.Sequential(
        nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.LazyLinear(8), nn.ReLU(), nn.LazyLinear(3)
    )


def tensors_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def assert_uninitialized_on(model: nn.Module, device: str) -> None:
    for name, tensor in tensors_of(model).items():
        if name.endswith("num_batches_tracked"):
            continue  # a lazy batch norm's counter is an ordinary buffer
        assert is_lazy(tensor), name
        assert str(tensor.device) == device, name


def sgd_losses(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, steps: int = 3) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(4, 3, 6, 6, generator=generator), torch.randint(0, 3, (4,), generator=generator)


@mode_ids
def test_to_tpu_keeps_lazy_modules_uninitialized_until_the_first_forward(mode: EagerMode) -> None:
    """`.to("tpu")` made a lazy parameter an initialized empty one (the forward then asserted) and
    refused a lazy buffer (`as_subclass` of a tpu tensor); both stay uninitialized on tpu now."""
    with eager(mode):
        model = lazy_net().to("tpu")
        assert_uninitialized_on(model, "tpu:0")
        out = model(torch.randn(2, 3, 6, 6, device="tpu"))
        assert out.shape == (2, 3) and out.device.type == "tpu"
        shapes = {name: tuple(tensor.shape) for name, tensor in tensors_of(model).items()}
        assert shapes["0.weight"] == (4, 3, 3, 3) and shapes["1.running_mean"] == (4,) and shapes["4.weight"] == (8, 64)
        for name, tensor in tensors_of(model).items():
            assert not is_lazy(tensor) and tensor.device.type == "tpu", name
        for name, parameter in model.named_parameters():
            assert isinstance(parameter, nn.Parameter) and parameter.requires_grad and parameter.is_leaf, name
        assert [type(module) for module in model] == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.Flatten, nn.Linear, nn.ReLU, nn.Linear]


@mode_ids
def test_lazy_modules_built_on_tpu(mode: EagerMode) -> None:
    with eager(mode):
        parameter = nn.UninitializedParameter(device="tpu", dtype=torch.float64)
        assert is_lazy(parameter) and isinstance(parameter, nn.Parameter)
        assert parameter.device.type == "tpu" and parameter.dtype == torch.float64 and repr(parameter) == "<UninitializedParameter>"
        with pytest.raises(RuntimeError, match="Can't access the shape of an uninitialized parameter"):
            parameter.shape
        with pytest.raises(ValueError, match="Attempted to use an uninitialized parameter"):
            parameter + 1
        linear = nn.LazyLinear(4, device="tpu")
        with torch.device("tpu"):
            norm = nn.LazyBatchNorm1d()
        assert_uninitialized_on(linear, "tpu:0")
        assert_uninitialized_on(norm, "tpu:0")
        out = norm(linear(torch.randn(5, 3, device="tpu")))
        assert out.shape == (5, 4)
        assert host(norm.running_var).shape == (4,) and norm.num_batches_tracked.item() == 1


@mode_ids
def test_materialised_values_follow_torchs_initialisation(mode: EagerMode) -> None:
    with eager(mode):
        linear = nn.LazyLinear(256).to("tpu")
        norm = nn.LazyBatchNorm1d().to("tpu").eval()
        norm(linear(torch.randn(2, 64, device="tpu")))
    weight, bias = host(linear.weight), host(linear.bias)
    bound = 64**-0.5  # kaiming_uniform_(a=sqrt(5)) and the bias's bound, for 64 inputs
    assert weight.abs().max() <= bound and bias.abs().max() <= bound
    assert weight.std().item() == pytest.approx(bound / 3**0.5, rel=0.05)
    assert abs(weight.mean().item()) < 0.05 * bound
    assert torch.equal(host(norm.running_mean), torch.zeros(256)) and torch.equal(host(norm.running_var), torch.ones(256))
    assert torch.equal(host(norm.weight), torch.ones(256)) and torch.equal(host(norm.bias), torch.zeros(256))


@mode_ids
def test_training_matches_the_cpu_after_loading_its_state(mode: EagerMode, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    """An uninitialized lazy model on tpu materialises on `load_state_dict` (as torch's lazy modules
    do), and an optimizer made afterwards trains it as the CPU trains the same model."""
    inputs, targets = batch
    torch.manual_seed(0)
    cpu_model = lazy_net()
    cpu_model(inputs)
    with eager(mode):
        tpu_model = lazy_net().to("tpu")
        tpu_model.load_state_dict(cpu_model.state_dict())
        for name, tensor in tensors_of(tpu_model).items():
            assert not is_lazy(tensor) and tensor.device.type == "tpu", name
            torch.testing.assert_close(host(tensor), tensors_of(cpu_model)[name], rtol=0, atol=0)
        tpu_losses = sgd_losses(tpu_model, inputs.to("tpu"), targets.to("tpu"))
    cpu_losses = sgd_losses(cpu_model, inputs, targets)
    assert tpu_losses == pytest.approx(cpu_losses, rel=1e-5)
    for name, tensor in tensors_of(tpu_model).items():
        torch.testing.assert_close(host(tensor), tensors_of(cpu_model)[name], rtol=1e-4, atol=1e-5)


@mode_ids
def test_materialised_by_a_forward_then_trained_like_the_cpu(mode: EagerMode, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    inputs, targets = batch
    with eager(mode):
        tpu_model = lazy_net().to("tpu")
        tpu_model(inputs.to("tpu"))
        cpu_model = lazy_net()
        cpu_model(inputs)
        cpu_model.load_state_dict({name: host(tensor) for name, tensor in tpu_model.state_dict().items()})
        tpu_losses = sgd_losses(tpu_model, inputs.to("tpu"), targets.to("tpu"))
    assert tpu_losses == pytest.approx(sgd_losses(cpu_model, inputs, targets), rel=1e-5)


@mode_ids
def test_dtype_moves_state_dict_and_deepcopy_keep_lazy_tensors_on_tpu(mode: EagerMode) -> None:
    with eager(mode):
        model = lazy_net().to("tpu").double()
        assert_uninitialized_on(model, "tpu:0")
        assert {tensor.dtype for name, tensor in tensors_of(model).items() if is_lazy(tensor)} == {torch.float64}
        state = model.state_dict()
        assert is_lazy(state["0.weight"]) and is_lazy(state["1.running_var"])
        copied = copy.deepcopy(model)
        assert_uninitialized_on(copied, "tpu:0")
        assert copied(torch.randn(2, 3, 6, 6, device="tpu", dtype=torch.float64)).dtype == torch.float64
        assert_uninitialized_on(model, "tpu:0")


def test_moving_an_uninitialized_model_off_tpu_is_refused() -> None:
    """torch's `Module._apply` would keep an empty initialized parameter on the host (a host tensor
    cannot take a tpu tensor's place with `.data =`); the move says what to do instead."""
    model = nn.LazyLinear(4).to("tpu")
    with pytest.raises(RuntimeError, match="uninitialized parameter on tpu cannot move to cpu: run the lazy module's first forward"):
        model.cpu()
    model(torch.randn(2, 3, device="tpu"))
    assert model.cpu().weight.shape == (4, 3)


@mode_ids
def test_compile_of_a_materialised_lazy_model(mode: EagerMode, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    inputs, _ = batch
    with eager(mode):
        model = lazy_net().to("tpu").eval()
        expected = host(model(inputs.to("tpu")))
        compiled = torch.compile(model, backend="tpu")
        torch.testing.assert_close(host(compiled(inputs.to("tpu"))), expected, rtol=1e-5, atol=1e-6)


_SECOND_CHIP = """
import torch, torch.nn as nn, tputrace.backend
from torch.nn.parameter import is_lazy
model = nn.Sequential(nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d(), nn.Flatten(), nn.LazyLinear(2)).to("tpu:1")
print(sorted({str(t.device) for t in model.state_dict().values()}), all(is_lazy(p) for p in model.parameters()))
out = model(torch.randn(2, 3, 6, 6, device="tpu:1"))
print(out.device, sorted({str(t.device) for t in model.state_dict().values()}), any(is_lazy(p) for p in model.parameters()))
linear = nn.LazyLinear(3, device="tpu:1")
print(linear(torch.randn(2, 5, device="tpu:1")).device, linear.weight.device)
"""


def test_lazy_modules_materialise_on_the_second_chip(tmp_path: os.PathLike) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _SECOND_CHIP], capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "TPUTRACE_CHIPS": "2"}, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["['tpu:1'] True", "tpu:1 ['tpu:1'] False", "tpu:1 tpu:1"]
