"""GRU layers without biases train on the chip as on the CPU: the fused cell's backward leaves the bias
gradients undefined, as torch's CUDA kernel does. And an op that fails on autograd's worker thread, even
one without a meta kernel to shape placeholder outputs, raises from backward() instead of aborting."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
REPO_ROOT = Path(__file__).resolve().parents[3]
STEPS = 3


def _gru_loss(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    return model(inputs)[0].pow(2).mean()


def _cell_loss(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    hidden = None
    for step in inputs.unbind(1):
        hidden = model(step, hidden)
    return hidden.pow(2).mean()


MODELS = {
    "GRU": (lambda: nn.GRU(3, 4, num_layers=2, bias=False, batch_first=True), _gru_loss),
    "GRUCell": (lambda: nn.GRUCell(3, 4, bias=False), _cell_loss),
}


def _train(kind: str, device: str) -> tuple[list[float], list[list[torch.Tensor]]]:
    """Losses and parameter gradients of a few SGD steps from a fixed seed."""
    build, loss_of = MODELS[kind]
    torch.manual_seed(0)
    model = build().to(device)
    inputs = torch.randn(2, 5, 3).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, gradients = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = loss_of(model, inputs)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        gradients.append([host(parameter.grad) for parameter in model.parameters()])
    return losses, gradients


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_training_without_bias_matches_cpu(mode: EagerMode, kind: str) -> None:
    cpu_losses, cpu_gradients = _train(kind, "cpu")
    with eager(mode):
        tpu_losses, tpu_gradients = _train(kind, "tpu")
    assert tpu_losses == pytest.approx(cpu_losses, abs=1e-5)
    for tpu_step, cpu_step in zip(tpu_gradients, cpu_gradients, strict=True):
        for got, want in zip(tpu_step, cpu_step, strict=True):
            assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_fused_gru_backward_leaves_bias_gradients_undefined(mode: EagerMode) -> None:
    """As torch's CUDA kernel: without biases the last two gradients are undefined tensors (None)."""
    with eager(mode):
        hy, workspace = torch.ops.aten._thnn_fused_gru_cell(torch.randn(2, 12, device="tpu"), torch.randn(2, 12, device="tpu"), torch.randn(2, 4, device="tpu"))
        grads = torch.ops.aten._thnn_fused_gru_cell_backward(torch.ones_like(hy), workspace, False)
        assert [None if grad is None else tuple(grad.shape) for grad in grads] == [(2, 12), (2, 12), (2, 4), None, None]


_FAILING_OPS_ON_THE_WORKER = """
    import sys
    import torch
    import tputrace.backend
    from tputrace.backend.compat.device_module import EagerMode, set_eager_mode
    from tputrace.backend.core.dispatch import dispatcher

    set_eager_mode(EagerMode[sys.argv[1]])
    library = torch.library.Library("tputrace_worker_test", "DEF")
    library.define("refuse(Tensor grad) -> Tensor")  # a CPU kernel that raises, and no meta kernel


    def refuse(*args, **kwargs):
        raise RuntimeError("refused on the host")


    library.impl("refuse", refuse, "CPU")


    class Refusing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return torch.ops.tputrace_worker_test.refuse(grad)


    def python_node(device):
        x = torch.ones(3, device=device, requires_grad=True)
        Refusing.apply(x).sum().backward()


    def cpp_node(device):  # the GRU cell's C++ backward calls an op that has no meta kernel
        cell = torch.nn.GRUCell(3, 4).to(device)
        cell(torch.ones(2, 3, device=device)).sum().backward()


    dispatcher.register_special(torch.ops.aten._thnn_fused_gru_cell_backward.default, refuse)
    for name, run in (("python node", python_node), ("C++ node", cpp_node)):
        try:
            run("tpu")
        except RuntimeError as error:
            print(name, "raised:", error)
        x = torch.ones(3, device="tpu", requires_grad=True)
        (x * 3).sum().backward()
        print("next backward:", x.grad.tolist())
"""


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_failing_op_without_meta_kernel_on_the_worker_raises_from_backward(mode: EagerMode) -> None:
    """The op's own error leaves backward(), from a Python autograd node and from a C++ one, and the
    next backward is clean. In a fresh process: the C++ node's case used to abort it (exit 134)."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FAILING_OPS_ON_THE_WORKER), mode.name], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        "python node raised: refused on the host", "next backward: [3.0, 3.0, 3.0]",
        "C++ node raised: refused on the host", "next backward: [3.0, 3.0, 3.0]",
    ]
