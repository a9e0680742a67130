"""DeferAndFuse packs a graph's Python scalars into one array per kind; a foreach op's scalar arguments that are the
same value share one slot, so XLA derives from it once (a foreach division's reciprocal) instead of once per element."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

import tputrace
from backend_helpers import eager
from test_step_replay import replay_switched
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core.dispatch import dispatcher
from tputrace.cli.main import main

# Per step, the divisors of a foreach division over three tensors: the same values, then values that differ
# where the replayed step's were the same (its template shares their slot), then the same values again.
DIVISORS = [[2.0, 2.0, 2.0]] * 3 + [[2.0, 3.0, 2.0]] + [[2.0, 2.0, 2.0]] * 2 + [[5.0, 5.0, 7.0]]


def test_same_scalars_of_one_op_share_a_slot_and_a_replayed_step_checks_their_values() -> None:
    tensors = [torch.arange(1.0, 5.0) * (index + 1) for index in range(3)]
    with replay_switched(True), eager(EagerMode.DEFER_AND_FUSE):
        executor = dispatcher.executor
        chip_tensors = [tensor.to("tpu") for tensor in tensors]
        executor.flush("explicit")
        slots, states, results = [], [], []
        for divisors in DIVISORS:
            quotients = torch._foreach_div(chip_tensors, divisors)
            graph = executor.graphs[0]
            slots.append(list(graph.scalars[0]))
            states.append(graph.replay)
            results.append([quotient.cpu() for quotient in quotients])
    # Step 3 breaks the replay at the 3.0 and is recorded with a slot per value; step 5 replays step 3's
    # program (two slots, both 2.0); step 6's 7.0 breaks the replay of step 0's program (one slot).
    assert states == ["none", "none", "held", "broke", "none", "held", "broke"]
    assert slots == [[2.0], [2.0], [2.0], [2.0, 3.0], [2.0], [2.0, 2.0], [5.0, 7.0]]
    for divisors, quotients in zip(DIVISORS, results):
        for tensor, divisor, quotient in zip(tensors, divisors, quotients):
            torch.testing.assert_close(quotient, tensor / divisor)


def test_zeros_of_opposite_signs_keep_their_own_slots() -> None:
    ones = [torch.ones(3), torch.ones(3)]
    with eager(EagerMode.DEFER_AND_FUSE):
        quotients = torch._foreach_div([tensor.to("tpu") for tensor in ones], [0.0, -0.0])
        assert list(dispatcher.executor.graphs[0].scalars[0]) == [0.0, -0.0]
        assert [quotient.cpu().tolist() for quotient in quotients] == [[float("inf")] * 3, [float("-inf")] * 3]


def test_a_recompile_for_scalars_no_longer_the_same_says_so(tmp_path: Path) -> None:
    script = tmp_path / "divisors.py"
    script.write_text(textwrap.dedent("""
        import torch
        import tputrace
        tensors = [torch.ones(4, device="tpu") for _ in range(3)]
        for divisors in [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0], [2.0, 3.0, 2.0]]:
            tputrace.step()
            quotients = torch._foreach_div(tensors, divisors)
            quotients[0].sum().item()
        """))
    trace_path = tmp_path / "divisors.tptrace"
    assert main(["run", "--no-summary", "-o", str(trace_path), str(script)]) == 0
    with tputrace.open(trace_path) as trace:
        recompiles = [compile.diff for compile in trace.records("compiles") if compile.reason == "recompile" and compile.kind == "fused"]
    assert len(recompiles) == 1 and "aten._foreach_div.ScalarList" in recompiles[0], recompiles
    assert "Python scalar arguments that were the same value now differ" in recompiles[0]


def test_a_variance_s_correction_is_a_constant_of_its_program_not_a_packed_scalar() -> None:
    samples = torch.randn(4, 8, 5, generator=torch.Generator().manual_seed(0))
    with eager(EagerMode.DEFER_AND_FUSE):
        chip_samples = samples.to("tpu")
        for correction in (0, 1, 2):
            variance, mean = torch.var_mean(chip_samples, dim=1, correction=correction)
            assert all(not slots for slots in dispatcher.executor.graphs[0].scalars)
            expected_variance, expected_mean = torch.var_mean(samples, dim=1, correction=correction)
            torch.testing.assert_close(variance.cpu(), expected_variance)
            torch.testing.assert_close(mean.cpu(), expected_mean)
