"""Backward through tensors on several chips of one process (`TPUTRACE_CHIPS=2`): a model split over
two chips, `torch.autograd.grad` with a double backward on `tpu:1`, and `nn.DataParallel` training,
each against the same computation on the CPU, in both eager modes. Each case runs in a subprocess,
since the chip count is fixed when JAX starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_SPLIT_MODEL = """
import copy, sys, torch, tputrace.backend
from torch import nn
torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, sys.argv[1]))
torch.manual_seed(0)
first, second = nn.Sequential(nn.Linear(8, 16), nn.GELU()), nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 3))
tpu_first, tpu_second = copy.deepcopy(first).to("tpu:0"), copy.deepcopy(second).to("tpu:1")
cpu_optimizer = torch.optim.AdamW([*first.parameters(), *second.parameters()], lr=0.01)
tpu_optimizer = torch.optim.AdamW([*tpu_first.parameters(), *tpu_second.parameters()], lr=0.01)
seen_on = []
tpu_second[1].weight.register_hook(lambda grad: seen_on.append(str(grad.device)))
for step in range(3):
    inputs, targets = torch.randn(5, 8), torch.randint(0, 3, (5,))
    cpu_loss = nn.functional.cross_entropy(second(first(inputs)), targets)
    cpu_optimizer.zero_grad(); cpu_loss.backward(); cpu_optimizer.step()
    hidden = tpu_first(inputs.to("tpu:0")).to("tpu:1")
    tpu_loss = nn.functional.cross_entropy(tpu_second(hidden), targets.to("tpu:1"))
    tpu_optimizer.zero_grad(); tpu_loss.backward(); tpu_optimizer.step()
    torch.testing.assert_close(tpu_loss.cpu(), cpu_loss, rtol=1e-5, atol=1e-6)
for module, chip in ((tpu_first, 0), (tpu_second, 1)):
    assert all(p.device == torch.device("tpu", chip) and p.grad.device == p.device for p in module.parameters())
for expected, actual in zip([*first.parameters(), *second.parameters()], [*tpu_first.parameters(), *tpu_second.parameters()]):
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-5)
assert seen_on == ["tpu:1"] * 3, seen_on

weight = torch.randn(4, requires_grad=True)
tpu_weight = weight.detach().to("tpu:1").requires_grad_()
def penalty(w, x):
    (grad,) = torch.autograd.grad((w * x).pow(3).sum(), w, create_graph=True)
    return grad.pow(2).sum()
x = torch.randn(4)
penalty(weight, x).backward()
penalty(tpu_weight, x.to("tpu:1")).backward()
assert tpu_weight.grad.device == torch.device("tpu:1")
torch.testing.assert_close(tpu_weight.grad.cpu(), weight.grad, rtol=1e-5, atol=1e-5)
print("ok")
"""

_DATA_PARALLEL = """
import copy, sys, torch, tputrace.backend
from torch import nn
torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, sys.argv[1]))
torch.manual_seed(0)
cpu_model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
model = copy.deepcopy(cpu_model).to("tpu")
parallel = nn.DataParallel(model)
chips_seen = set()
model[0].register_forward_hook(lambda module, args, out: chips_seen.add(args[0].device.index))
cpu_optimizer = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
tpu_optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    inputs, targets = torch.randn(7, 8), torch.randn(7, 4)
    cpu_loss = nn.functional.mse_loss(cpu_model(inputs), targets)
    cpu_optimizer.zero_grad(); cpu_loss.backward(); cpu_optimizer.step()
    tpu_loss = nn.functional.mse_loss(parallel(inputs.to("tpu")), targets.to("tpu"))
    tpu_optimizer.zero_grad(); tpu_loss.backward(); tpu_optimizer.step()
    torch.testing.assert_close(tpu_loss.cpu(), cpu_loss, rtol=1e-5, atol=1e-6)
assert chips_seen == {0, 1}, chips_seen
for expected, actual in zip(cpu_model.parameters(), model.parameters()):
    assert actual.device == torch.device("tpu:0")
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-5, atol=1e-6)
print("ok")
"""


def _run_on_two_chips(code: str, eager_mode: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", code, eager_mode], capture_output=True, text=True, env={**os.environ, "TPUTRACE_CHIPS": "2"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("eager_mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_a_model_split_over_two_chips_trains_as_on_the_cpu(eager_mode: str) -> None:
    _run_on_two_chips(_SPLIT_MODEL, eager_mode)


@pytest.mark.parametrize("eager_mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_data_parallel_trains_on_two_chips_as_on_the_cpu(eager_mode: str) -> None:
    _run_on_two_chips(_DATA_PARALLEL, eager_mode)



_CHECKPOINTED_STEPS = """
import torch, tputrace.backend
from torch import nn
from torch.utils.checkpoint import checkpoint
torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
block, head = nn.Sequential(nn.Linear(8, 16), nn.GELU()).to("tpu"), nn.Linear(16, 3).to("tpu")
optimizer = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.1)
for step in range(3):
    hidden = checkpoint(block, torch.randn(5, 8, device="tpu", requires_grad=True), use_reentrant=True)
    loss = head(hidden).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    tputrace.step()
"""


def _ops_and_flushes(tmp_path: Path, chips: int) -> tuple[list[tuple], list[tuple]]:
    from tputrace.store.reader import open_trace

    script, trace_path = tmp_path / "train.py", tmp_path / f"run{chips}.tptrace"
    script.write_text(_CHECKPOINTED_STEPS)
    result = subprocess.run(
        [sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace_path), str(script)],
        capture_output=True, text=True, env={**os.environ, "TPUTRACE_CHIPS": str(chips)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trace = open_trace(trace_path)
    ops = trace.sql(
        "SELECT o.step, s.text, f.line FROM ops o JOIN strings s ON s.id = o.op_sid LEFT JOIN frames f ON f.id = o.frame_id ORDER BY o.seq"
    )
    return ops, trace.sql("SELECT trigger, n_ops FROM flushes ORDER BY id")


def test_a_backward_on_two_chips_is_a_step_boundary_with_its_line(tmp_path: Path) -> None:
    """On several chips the backward runs on the calling thread: it still ends in its own flush (a reentrant
    checkpoint's inner backward does not end it early) and its ops take the line that called backward(),
    as on one chip, where it runs on autograd's worker."""
    ops, flushes = _ops_and_flushes(tmp_path, 2)
    backward_line = _CHECKPOINTED_STEPS.splitlines().index("    loss.backward()") + 1
    assert ("aten.gelu_backward.default", backward_line) in {(op, line) for _, op, line in ops}
    assert [trigger for trigger, _ in flushes].count("backward_end") == 3
    assert (ops, flushes) == _ops_and_flushes(tmp_path, 1)
