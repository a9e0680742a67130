"""On XLA:CPU a weight gradient (`grad.t() @ x`) runs on YNNPACK's dot kernel: its transposed left
operand is copied row by row first, where XLA would otherwise fold the transpose into a generic dot."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

import tputrace
from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core import chips
from tputrace.cli.main import main

pytestmark = pytest.mark.skipif(chips.platform() != "cpu", reason="the layout rule is XLA:CPU's")

_TRAIN_A_LINEAR_LAYER = """
    import torch
    import tputrace.backend  # noqa: F401

    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 512).to("tpu")
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    inputs = torch.randn(128, 256).to("tpu")
    for _ in range(3):
        loss = layer(inputs).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(loss.item())
"""


def test_a_weight_gradient_runs_in_a_ynnpack_fusion(tmp_path: Path) -> None:
    script = tmp_path / "linear.py"
    script.write_text(textwrap.dedent(_TRAIN_A_LINEAR_LAYER))
    trace_path = tmp_path / "linear.tptrace"
    assert main(["run", "-o", str(trace_path), str(script)]) == 0
    with tputrace.open(trace_path) as trace:
        weight_gradients = [fusion.name for fusion in trace.records("fusions") if fusion.aten == "aten.mm.default" and fusion.ops == "dot"]
    assert weight_gradients and all(name.startswith("ynn_fusion") for name in weight_gradients), weight_gradients


@pytest.mark.parametrize("mode", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE])
def test_products_of_transposed_operands_match_the_cpu(mode: EagerMode) -> None:
    torch.manual_seed(0)
    grad, inputs, bias = torch.randn(64, 96), torch.randn(64, 32), torch.randn(96, 32)
    with eager(mode):
        on_chip = (grad.to("tpu"), inputs.to("tpu"), bias.to("tpu"))
        weight_gradient = host(on_chip[0].t() @ on_chip[1])
        affine = host(torch.addmm(on_chip[2], on_chip[0].t(), on_chip[1], beta=0.5))
        batched = host(torch.func.vmap(torch.mm)(on_chip[0].t()[None], on_chip[1][None]))
    assert torch.allclose(weight_gradient, grad.t() @ inputs, atol=1e-4)
    assert torch.allclose(affine, torch.addmm(bias, grad.t(), inputs, beta=0.5), atol=1e-4)
    assert torch.allclose(batched[0], grad.t() @ inputs, atol=1e-4)
