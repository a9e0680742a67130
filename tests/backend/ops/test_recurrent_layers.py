"""`nn.LSTM`, `nn.GRU` and `nn.RNN` run on tpu as one `tputrace::rnn_layer` per layer and direction, a scan XLA
compiles once: outputs, states and every gradient match the CPU's in both eager modes, double backward and
autocast included, and a recorded run holds the layer ops instead of a cell per time step, in inference mode too."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import tputrace
from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
LAYERS: dict[str, Callable[[], nn.Module]] = {
    "lstm": lambda: nn.LSTM(5, 6, num_layers=2, batch_first=True, bidirectional=True),
    "lstm_no_bias": lambda: nn.LSTM(5, 6, bias=False),
    "lstm_projected": lambda: nn.LSTM(5, 6, proj_size=3, batch_first=True),
    "gru": lambda: nn.GRU(5, 6, num_layers=2, bidirectional=True),
    "rnn_tanh": lambda: nn.RNN(5, 6, num_layers=2, batch_first=True),
    "rnn_relu": lambda: nn.RNN(5, 6, nonlinearity="relu", bidirectional=True),
}


def _run(layer: nn.Module, device: str, with_state: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The outputs and the gradients of every parameter, the input and the initial states."""
    torch.manual_seed(1)
    inputs = torch.randn(3, 4, 5)
    directions = 2 if layer.bidirectional else 1
    batch = inputs.shape[0] if layer.batch_first else inputs.shape[1]
    leaves = [inputs.to(device).requires_grad_()]
    hidden_size = layer.proj_size or layer.hidden_size
    if with_state:
        leaves.append(torch.randn(layer.num_layers * directions, batch, hidden_size).to(device).requires_grad_())
        if isinstance(layer, nn.LSTM):
            leaves.append(torch.randn(layer.num_layers * directions, batch, layer.hidden_size).to(device).requires_grad_())
    state = None if not with_state else (tuple(leaves[1:]) if isinstance(layer, nn.LSTM) else leaves[1])
    output, last = layer(leaves[0], state)
    states = list(last) if isinstance(last, tuple) else [last]
    loss = output.square().sum() + sum((index + 2) * value.sum() for index, value in enumerate(states))
    grads = torch.autograd.grad(loss, [*layer.parameters(), *leaves])
    return [output, *states], list(grads)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_recurrent_layers_match_the_cpu(kind: str, mode: EagerMode) -> None:
    torch.manual_seed(0)
    layer = LAYERS[kind]()
    for with_state in (False, True):
        expected_values, expected_grads = _run(layer, "cpu", with_state)
        layer.to("tpu")
        with eager(mode):
            values, grads = _run(layer, "tpu", with_state)
            values, grads = [host(value) for value in values], [host(grad) for grad in grads]
        layer.to("cpu")
        for got, expected in zip(values + grads, expected_values + expected_grads, strict=True):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_double_backward_through_an_lstm_matches_the_cpu() -> None:
    """A gradient penalty differentiates the LSTM's backward again."""
    torch.manual_seed(0)
    layer = nn.LSTM(5, 6, num_layers=2, bidirectional=True)
    inputs = torch.randn(4, 2, 5)

    def penalty_grads(device: str) -> list[torch.Tensor]:
        leaf = inputs.to(device).requires_grad_()
        (input_grad,) = torch.autograd.grad(layer(leaf)[0].square().sum(), leaf, create_graph=True)
        return [host(grad) for grad in torch.autograd.grad(input_grad.square().sum(), list(layer.parameters()))]

    expected = penalty_grads("cpu")
    layer.to("tpu")
    for got, want in zip(penalty_grads("tpu"), expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_autocast_keeps_the_products_at_autocasts_dtype() -> None:
    """Under autocast the layer takes torch's path, whose products autocast casts one `linear` at a time."""
    torch.manual_seed(0)
    layer = nn.GRU(5, 6)
    inputs = torch.randn(4, 2, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = layer(inputs)[0]
    layer.to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        got = layer(inputs.to("tpu"))[0]
    assert got.dtype == expected.dtype
    torch.testing.assert_close(host(got), expected, atol=2e-2, rtol=2e-2)


SCRIPT = '''
    import torch
    from torch import nn

    model = nn.LSTM(8, 16, batch_first=True, bidirectional=True).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randn(4, 12, 8).to("tpu")
    for step in range(3):
        model(tokens)[0].square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.inference_mode():
        model(tokens)[0].sum().item()
'''


def test_a_recorded_lstm_runs_one_op_per_layer_and_direction(tmp_path: Path) -> None:
    """In training and under `torch.inference_mode` (where the call reaches the device below autograd)."""
    script = tmp_path / "lstm_loop.py"
    script.write_text(textwrap.dedent(SCRIPT))
    trace = tmp_path / "lstm.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace), str(script)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    with tputrace.open(trace) as recorded:
        counts = dict(recorded.sql("SELECT s.text, COUNT(*) FROM ops JOIN strings s ON s.id = ops.op_sid GROUP BY s.text"))
    assert counts.get("tputrace.rnn_layer.default") == 4 * 2, counts  # three training steps and one inference
    assert counts.get("tputrace.rnn_layer_backward.default") == 3 * 2, counts
    assert not any("lstm_cell" in name for name in counts), counts
