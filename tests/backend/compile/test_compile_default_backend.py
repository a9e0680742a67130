"""`torch.compile(model)` with no backend named (Inductor) on tpu tensors compiles with `"tpu"`."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import tputrace.backend  # noqa: F401 - registers the tpu device
from backend_helpers import host


def test_a_tpu_model_compiled_with_the_default_backend_trains_as_on_the_cpu() -> None:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    model.load_state_dict(reference.state_dict())
    model = model.to("tpu")
    compiled = torch.compile(model)
    inputs = torch.randn(5, 6)
    compiled(inputs.to("tpu")).square().mean().backward()
    reference(inputs).square().mean().backward()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert type(ours).__name__ == "TpuTensor"
        torch.testing.assert_close(host(ours.grad), theirs.grad, rtol=1e-5, atol=1e-6)
    assert not counters["inductor"], "the tpu graph reached Inductor"


def test_modes_and_tensors_made_inside_the_graph() -> None:
    torch._dynamo.reset()
    model = torch.nn.Linear(3, 2).to("tpu")
    inputs = torch.randn(4, 3)
    expected = host(model(inputs.to("tpu")))
    for mode in ("reduce-overhead", "max-autotune"):
        torch._dynamo.reset()
        torch.testing.assert_close(host(torch.compile(model, mode=mode)(inputs.to("tpu"))), expected)

    @torch.compile
    def make() -> torch.Tensor:
        return torch.arange(6, device="tpu").reshape(2, 3) * 2

    torch._dynamo.reset()
    assert make().device == torch.device("tpu:0")
    assert host(make()).tolist() == [[0, 2, 4], [6, 8, 10]]


_HOST_COMPILER = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


@pytest.mark.skipif(_HOST_COMPILER is None, reason="Inductor compiles host graphs with a C++ compiler, and none is installed")
def test_host_graphs_still_go_to_inductor() -> None:
    torch._dynamo.reset()
    counters.clear()

    @torch.compile
    def host_function(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2

    inputs = torch.randn(8)
    torch.testing.assert_close(host_function(inputs), torch.sin(inputs) * 2)
    assert counters["inductor"], "the host graph did not reach Inductor"
