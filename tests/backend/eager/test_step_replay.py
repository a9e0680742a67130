"""Step replay in DeferAndFuse: a training loop's graphs replay the previous step's, with the same results as
recording them op by op, and the trace says when replay held and why it broke."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import tputrace
from backend_helpers import eager
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core.dispatch import dispatcher
from tputrace.backend.eager import step_replay
from tputrace.cli.main import main
from tputrace.store.replays import replay_stats
from tputrace.summary import render_text, summarize

STEPS = 8
CHANGED_STEP = 5  # the step a variant changes

# A small classifier with dropout, AdamW (weight decay, in-place updates of parameters and state), gradient
# clipping and a learning rate that changes every step. `variant` changes step CHANGED_STEP only.
TRAINING = f"""
import sys
import torch
from torch import nn

variant, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
torch.tpu.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.2), nn.LayerNorm(32), nn.Linear(32, 4)).to("tpu")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
batches = torch.Generator().manual_seed(1)
losses, kept = [], []
for step in range({STEPS}):
    changed = step == {CHANGED_STEP}
    rows = 12 if variant == "shape" and changed else 8
    inputs = torch.randn(rows, 16, generator=batches).to("tpu")
    labels = torch.randint(0, 4, (rows,), generator=batches).to("tpu")
    logits = model(inputs)
    logits = torch.roll(logits, shifts=2 if variant == "baked" and changed else 1, dims=1)
    if variant == "branch" and changed:
        logits = logits * 0.5
    probabilities = torch.softmax(logits.detach(), dim=1)  # dropped at once, but where `kept` keeps it
    if variant == "kept" and changed:
        kept.append(probabilities)
    del probabilities
    loss = nn.functional.cross_entropy(logits, labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    losses.append(loss.detach())
state = [value.cpu() for per_parameter in optimizer.state.values() for value in per_parameter.values() if torch.is_tensor(value)]
torch.save({{"losses": torch.stack(losses).cpu(), "params": [p.detach().cpu() for p in model.parameters()], "state": state,
             "kept": [value.cpu() for value in kept]}}, out)
"""


@contextlib.contextmanager
def replay_switched(on: bool) -> Iterator[None]:
    """DeferAndFuse's executor with replay on or off for a block (what `TPUTRACE_STEP_REPLAY` sets at start)."""
    with eager(EagerMode.DEFER_AND_FUSE):
        executor = dispatcher.executor
    previous = executor.replay_chains
    executor.replay_chains = step_replay.Chains() if on else None
    try:
        yield
    finally:
        executor.replay_chains = previous


def _train(tmp_path: Path, variant: str, replay: bool) -> tuple[dict, Path]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAINING))
    name = f"{variant}_{'on' if replay else 'off'}"
    trace_path, results = tmp_path / f"{name}.tptrace", tmp_path / f"{name}.pt"
    with replay_switched(replay):
        assert main(["run", "--no-summary", "-o", str(trace_path), str(script), variant, str(results)]) == 0
    return torch.load(results), trace_path


def _assert_identical(replayed: dict, recorded: dict) -> None:
    assert torch.equal(replayed["losses"], recorded["losses"])
    for key in ("params", "state", "kept"):
        assert len(replayed[key]) == len(recorded[key])
        for with_replay, without in zip(replayed[key], recorded[key]):
            assert torch.equal(with_replay, without), key


def _flushes(trace_path: Path) -> list:
    with tputrace.open(trace_path) as trace:
        return [flush for flush in trace.records("flushes", order_by="id") if flush.n_ops]


def test_a_steady_loop_replays_every_flush_with_the_same_results(tmp_path: Path) -> None:
    replayed, trace_path = _train(tmp_path, "plain", replay=True)
    recorded, recorded_trace = _train(tmp_path, "plain", replay=False)
    _assert_identical(replayed, recorded)
    flushes = _flushes(trace_path)
    steady = [flush for flush in flushes if flush.step is not None and 2 <= flush.step < STEPS]
    assert steady and all(flush.replay == "held" for flush in steady), [(flush.step, flush.trigger, flush.replay, flush.replay_break) for flush in steady if flush.replay != "held"]
    # Only the work after the loop (saving the results) differs from a step.
    assert [flush.step for flush in flushes if flush.replay == "broke"] == [STEPS]
    assert all(flush.replay is None for flush in _flushes(recorded_trace))
    with tputrace.open(trace_path) as trace:
        stats = replay_stats(trace)
        assert stats is not None and stats.held >= len(steady) and stats.broke == 1
        assert f"replayed {stats.held} of {stats.flushes} flushes" in render_text(summarize(trace))


@pytest.mark.parametrize(
    ("variant", "reason"),
    [
        ("shape", "other inputs, input 1 dim 0: 8 -> 12"),  # a batch of another shape: its first op's plan reads other specs
        ("branch", "aten.mul.Tensor"),  # an extra op where the previous step's loss began
        ("baked", "aten.roll.default): other constant arguments"),  # a constant baked into the program changed
        ("kept", "outputs differ: 1 more kept"),  # a value the script keeps alive: one more output
    ],
)
def test_a_step_that_differs_breaks_replay_with_its_reason_and_the_same_results(tmp_path: Path, variant: str, reason: str) -> None:
    replayed, trace_path = _train(tmp_path, variant, replay=True)
    recorded, _ = _train(tmp_path, variant, replay=False)
    _assert_identical(replayed, recorded)
    flushes = _flushes(trace_path)
    broken = [flush for flush in flushes if flush.replay == "broke"]
    assert broken and broken[0].step == CHANGED_STEP, [(flush.step, flush.replay, flush.replay_break) for flush in flushes]
    assert reason in (broken[0].replay_break or ""), broken[0].replay_break
    assert all(flush.replay == "held" for flush in flushes if flush.step == STEPS - 1)  # held again after the change
    with tputrace.open(trace_path) as trace:
        text = render_text(summarize(trace))
    assert f"first in step {CHANGED_STEP}: " in text and reason in text


def test_replay_off_by_environment_and_a_trace_without_the_columns(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAINING))
    trace_path = tmp_path / "off.tptrace"
    environment = {**os.environ, "TPUTRACE_STEP_REPLAY": "0"}
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--no-summary", "-o", str(trace_path), str(script), "plain", str(tmp_path / "off.pt")]
    completed = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    flushes = _flushes(trace_path)
    assert flushes and all(flush.replay is None and flush.replay_break is None for flush in flushes)
    with tputrace.open(trace_path) as trace:
        assert replay_stats(trace) is None
        assert not any(line.startswith("replay ") for line in render_text(summarize(trace)).splitlines())
    # A file written before the columns: records read them as None, the summary has no replay line.
    with sqlite3.connect(trace_path) as connection:
        connection.execute("DROP VIEW IF EXISTS flushes_v")
        connection.execute("ALTER TABLE flushes DROP COLUMN replay_break_sid")
        connection.execute("ALTER TABLE flushes DROP COLUMN replay")
    assert [flush.replay for flush in _flushes(trace_path)] == [None] * len(flushes)
    with tputrace.open(trace_path) as trace:
        assert replay_stats(trace) is None and "wall" in render_text(summarize(trace))
    bad = subprocess.run(command, env={**os.environ, "TPUTRACE_STEP_REPLAY": "yes"}, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "TPUTRACE_STEP_REPLAY='yes' must be 0 (off) or 1 (on, the default)" in bad.stderr


def test_an_argument_of_another_kind_breaks_replay_at_that_argument() -> None:
    """The same ops on the same shapes, but an op reads an earlier op's output where the previous occurrence read an
    array from outside the graph (and back): replay breaks at that argument, and the values are the ones recorded."""
    base, other = torch.arange(6.0).reshape(2, 3), torch.full((2, 3), 2.0)
    with replay_switched(True), eager(EagerMode.DEFER_AND_FUSE):
        executor = dispatcher.executor
        chip_base, chip_other = base.to("tpu"), other.to("tpu")
        executor.flush("explicit")
        results, states = [], []
        for step in range(6):
            shifted = chip_base + 1
            product = shifted * (shifted if step == 3 else chip_other)
            graph = executor.graphs[0]
            states.append((graph.replay, graph.replay_break))
            results.append(product.sum().item())
    assert states[2] == ("held", None)
    assert states[3] == ("broke", "op 1 (aten.mul.Tensor) argument 1: op 0's output 0 where the previous occurrence read input array 1")
    assert states[4] == ("none", None)  # no graph followed step 3's before
    # Step 4's graph was followed by step 3's last time: step 5 follows that one, and reads an array where it read an output.
    assert states[5] == ("broke", "op 1 (aten.mul.Tensor) argument 1: a new input array where the previous occurrence read op 0's output 0")
    assert results == [((base + 1) * ((base + 1) if step == 3 else other)).sum().item() for step in range(6)]
