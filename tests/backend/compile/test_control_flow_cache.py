"""A training loop through `torch.cond` and `torch.while_loop` compiles nothing once warm: torch builds
their backward as new graphs on every call, and tpu finds the program of a graph it has seen by the
graph's fingerprint (`graph_fingerprints`), in both eager modes and under torch.compile(backend="tpu").
Graphs of one structure with different constants (tensors, typed literals) keep their own programs,
and every result equals the CPU's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jax
import pytest
import torch
from torch._higher_order_ops.cond import cond_op
from torch._higher_order_ops.while_loop import while_loop_op
from torch.fx.experimental.proxy_tensor import make_fx

import tputrace
from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.integrations import graph_fingerprints
from tputrace.cli.main import main

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_XLA_KINDS = ("op", "fused", "xla")  # the trace's compile kinds that are XLA compiles ("aot" and "dynamo_frame" ones are not)
_backend_compiles: list[str] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **_: _backend_compiles.append(event) if event == _COMPILE_EVENT else None
)

# The branches call the layers' functions, not the layers: under `tputrace run` a module call inside
# a branch meets the recorder's module hook, which Dynamo skips when the package is symlinked.
_LOOP_SCRIPT = """
import json
import sys
import torch
import torch.nn.functional as F
from torch._higher_order_ops import while_loop

MODE, RESULTS = sys.argv[1], sys.argv[2]


class Routed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(6, 6)
        self.gate = torch.nn.Linear(6, 6)
        self.shift = torch.nn.Parameter(torch.randn(6) * 0.1)

    def forward(self, x):
        hidden = self.inp(x)
        weight, bias, shift = self.gate.weight, self.gate.bias, self.shift
        hidden = torch.cond(hidden.mean() > 0, lambda h: F.linear(h, weight, bias).tanh(), lambda h: (h * 0.5).relu(), (hidden,))
        count = torch.zeros((), dtype=torch.int64, device=x.device)
        _, hidden = while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, h * 0.9 + shift.sin()), (count, hidden))
        return (hidden ** 2).mean()


def train(device):
    torch.manual_seed(0)
    model = Routed().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    forward = torch.compile(model, backend="tpu") if device == "tpu" and MODE == "compile" else model
    losses = []
    for step in range(6):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step % 2)) * (1 if step % 2 else -1)
        loss = forward(x.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, [parameter.detach().cpu().tolist() for parameter in model.parameters()]


if MODE != "compile":
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, MODE))
cpu, tpu = train("cpu"), train("tpu")
with open(RESULTS, "w") as results:
    json.dump({"cpu": cpu, "tpu": tpu}, results)
"""


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE", "compile"])
def test_a_steady_training_loop_through_cond_and_while_loop_compiles_nothing_after_step_2(tmp_path: Path, mode: str) -> None:
    """Six steps whose batches alternate the taken branch: every compile falls in steps 0 and 1 of
    the trace, the trace holds every XLA compile JAX made, and losses and weights equal the CPU's."""
    script, results_path, trace_path = tmp_path / "loop.py", tmp_path / "results.json", tmp_path / "loop.tptrace"
    script.write_text(_LOOP_SCRIPT)
    before = len(_backend_compiles)
    assert main(["run", "-o", str(trace_path), str(script), mode, str(results_path)]) == 0
    xla_compiles = len(_backend_compiles) - before
    with tputrace.open(trace_path) as trace:
        # the loop's six optimizer steps, then the script's reads of the results (its closing `end` step)
        assert [step for (step,) in trace.sql("SELECT step FROM steps WHERE source != 'end' ORDER BY step")] == list(range(6))
        per_step = dict(trace.sql(f"SELECT step, COUNT(*) FROM compiles WHERE kind IN {_XLA_KINDS} GROUP BY step"))
        assert sum(per_step.values()) == xla_compiles
    assert per_step.get(0, 0) > 0
    assert {step: count for step, count in per_step.items() if step >= 2} == {}
    results = json.loads(results_path.read_text())
    (cpu_losses, cpu_parameters), (tpu_losses, tpu_parameters) = results["cpu"], results["tpu"]
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), atol=1e-6, rtol=1e-5)
    for got, want in zip(tpu_parameters, cpu_parameters):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-6, rtol=1e-5)


def _graph(fn: Callable[..., tuple], *examples: torch.Tensor) -> torch.fx.GraphModule:
    return make_fx(fn)(*examples)


def _scaled(scale: float) -> torch.fx.GraphModule:
    """`x * scale + 1` with the scale a tensor constant of the graph (`_tensor_constant0`)."""
    constant = torch.tensor(scale)
    return _graph(lambda x: (x * constant + 1,), torch.ones(3))


def _added(one: int | float | bool) -> torch.fx.GraphModule:
    """`x + one` for an int tensor (an int or a bool keeps its dtype, a float does not)."""
    return _graph(lambda x: (x + one,), torch.ones(3, dtype=torch.int64))


def _shifted(one: int | float) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Branches adding and subtracting the literal `one`."""
    return _added(one), _graph(lambda x: (x - one,), torch.ones(3, dtype=torch.int64))


def test_graph_fingerprints_tell_constants_and_literal_types_apart() -> None:
    assert graph_fingerprints.fingerprint(_scaled(2.0)) == graph_fingerprints.fingerprint(_scaled(2.0))
    assert graph_fingerprints.fingerprint(_scaled(2.0)) != graph_fingerprints.fingerprint(_scaled(3.0))
    assert _scaled(2.0).code == _scaled(3.0).code
    literals = [graph_fingerprints.fingerprint(_added(one)) for one in (1, 1.0, True)]
    assert len(set(literals)) == 3
    assert graph_fingerprints.fingerprint(lambda x: x) is None
    holding_a_chip_tensor = _scaled(2.0)
    holding_a_chip_tensor._tensor_constant0 = torch.tensor(2.0, device="tpu")
    assert graph_fingerprints.fingerprint(holding_a_chip_tensor) is None


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_cond_graphs_of_one_structure_with_different_constants_give_their_own_results(mode: EagerMode) -> None:
    """New graphs equal to a seen pair compile nothing; a tensor constant's value or a literal's type
    that differs gives its own program, and every result equals the CPU's."""
    x, numbers = torch.arange(3.0) - 0.5, torch.tensor([4, -2, 7])
    with eager(mode):
        chip_x, chip_numbers = x.to("tpu"), numbers.to("tpu")
        for scale in (2.0, 3.0, 2.0, 3.0):
            (got,) = cond_op(chip_x.sum() > 0, _scaled(scale), _scaled(-1.0), (chip_x,))
            (want,) = cond_op(x.sum() > 0, _scaled(scale), _scaled(-1.0), (x,))
            torch.testing.assert_close(host(got), want)
        before = len(_backend_compiles)
        host(cond_op(chip_x.sum() > 0, _scaled(3.0), _scaled(-1.0), (chip_x,))[0])
        assert len(_backend_compiles) == before
        for one in (1, 1.0, 1, 1.0):
            (got,) = cond_op(chip_numbers.sum() > 0, *_shifted(one), (chip_numbers,))
            (want,) = cond_op(numbers.sum() > 0, *_shifted(one), (numbers,))
            assert host(got).dtype == want.dtype
            torch.testing.assert_close(host(got), want)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_while_loop_graphs_of_one_structure_with_different_constants_give_their_own_results(mode: EagerMode) -> None:
    def loop(limit: int, growth: float) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        constant = torch.tensor(growth)
        examples = (torch.zeros((), dtype=torch.int64), torch.ones(3))
        return _graph(lambda i, v: i < limit, *examples), _graph(lambda i, v: (i + 1, v * constant), *examples)

    start = torch.tensor([1.0, -2.0, 0.5])
    with eager(mode):
        chip_start = start.to("tpu")
        for limit, growth in ((3, 2.0), (3, 0.5), (4, 2.0), (3, 2.0)):
            steps, value = while_loop_op(*loop(limit, growth), (torch.zeros((), dtype=torch.int64, device="tpu"), chip_start), ())
            want_steps, want_value = while_loop_op(*loop(limit, growth), (torch.zeros((), dtype=torch.int64), start), ())
            assert int(host(steps)) == int(want_steps) == limit
            torch.testing.assert_close(host(value), want_value)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_eager_cond_branches_closing_over_different_floats_match_cpu(mode: EagerMode) -> None:
    """The same branch code closing over another float each call: Dynamo bakes the first into the
    graph and passes later ones in; each call computes with its own."""
    x = torch.linspace(-1.0, 2.0, 6)

    def scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: (x * scale).sin(), lambda x: x - scale, (x,))

    with eager(mode):
        chip_x = x.to("tpu")
        for scale in (2.0, 3.0, 0.5, 2.0):
            torch.testing.assert_close(host(scaled(chip_x, scale)), scaled(x, scale))
