"""`nn.DataParallel` on tpu, and moving a module to tpu while a CPU graph still holds its parameters."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import tputrace.backend  # noqa: F401 - registers the tpu device
from tputrace.backend.compat.device_module import EagerMode, set_eager_mode


@pytest.fixture(params=["DEFER_NEVER", "DEFER_AND_FUSE"])
def eager_mode(request: pytest.FixtureRequest):
    set_eager_mode(getattr(EagerMode, request.param))
    yield request.param
    set_eager_mode(EagerMode.DEFER_NEVER)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def test_data_parallel_trains_on_one_chip_as_on_the_cpu(eager_mode: str) -> None:
    cpu_model = _mlp()
    model = copy.deepcopy(cpu_model).to("tpu")
    parallel = nn.DataParallel(model)
    assert parallel.device_ids == [0]
    inputs, targets = torch.randn(6, 8), torch.randn(6, 4)
    optimizer = torch.optim.SGD(parallel.parameters(), lr=0.1)
    cpu_optimizer = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    for _ in range(3):
        output = parallel(inputs.to("tpu"))
        loss = ((output - targets.to("tpu")) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        cpu_loss = ((cpu_model(inputs) - targets) ** 2).mean()
        cpu_optimizer.zero_grad()
        cpu_loss.backward()
        cpu_optimizer.step()
        assert output.device == torch.device("tpu:0")
        assert loss.item() == pytest.approx(cpu_loss.item(), rel=1e-5)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor.cpu(), cpu_model.state_dict()[name], rtol=1e-5, atol=1e-6, msg=name)


def test_data_parallel_with_a_host_batch(eager_mode: str) -> None:
    cpu_model = _mlp().eval()
    parallel = nn.DataParallel(copy.deepcopy(cpu_model).to("tpu"))
    inputs = torch.randn(5, 8)
    with torch.no_grad():
        output = parallel(inputs)
    assert output.device == torch.device("tpu:0")
    torch.testing.assert_close(output.cpu(), cpu_model(inputs), rtol=1e-5, atol=1e-6)


def test_data_parallel_splits_a_batch_over_two_chips() -> None:
    code = """
import copy, torch, tputrace.backend
from torch import nn
for mode in ("DEFER_NEVER", "DEFER_AND_FUSE"):
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode))
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    inputs = torch.randn(7, 8)
    expected = cpu_model(inputs)
    replicas_saw = []
    model = copy.deepcopy(cpu_model).to("tpu")
    model[0].register_forward_hook(lambda module, args, out: replicas_saw.append((args[0].device.index, args[0].shape[0])))
    with torch.no_grad():
        output = nn.DataParallel(model)(inputs.to("tpu"))
        reversed_output = nn.DataParallel(model.to("tpu:1"), device_ids=[1, 0], output_device=0)(inputs.to("tpu:1"))
    assert sorted(replicas_saw) == [(0, 3), (0, 4), (1, 3), (1, 4)], replicas_saw
    assert output.device == torch.device("tpu:0") and reversed_output.device == torch.device("tpu:0")
    torch.testing.assert_close(output.cpu(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(reversed_output.cpu(), expected, rtol=1e-5, atol=1e-6)
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "TPUTRACE_CHIPS": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_moving_a_module_whose_cpu_graph_is_alive(eager_mode: str) -> None:
    """As on CUDA: the module moves and keeps its parameter objects, so an optimizer made before
    the move steps the tpu parameters; a backward through the old graph raises torch's swap error."""
    model = _mlp()
    weight = model[0].weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stale_output = model(torch.randn(4, 8))
    model.to("tpu")
    assert model[0].weight is weight and weight.device == torch.device("tpu:0")
    model(torch.randn(4, 8, device="tpu")).sum().backward()
    before = weight.detach().cpu()
    optimizer.step()
    torch.testing.assert_close(weight.detach().cpu(), before - 0.1 * weight.grad.cpu())
    with pytest.raises(RuntimeError, match="poisoned by swap_tensors"):
        stale_output.sum().backward()


def test_changing_dtype_on_tpu_while_a_graph_is_alive() -> None:
    model = _mlp().to("tpu")
    alive = model(torch.randn(4, 8, device="tpu"))
    model.to(torch.float64)
    assert model[0].weight.dtype == torch.float64 and alive.dtype == torch.float32
    assert model(torch.randn(4, 8, device="tpu", dtype=torch.float64)).dtype == torch.float64
