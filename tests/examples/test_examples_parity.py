"""The examples train on `tpu` as they do on the CPU: losses over 20 steps agree within tolerance."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tputrace.backend  # noqa: F401 - registers the tpu device

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


@pytest.mark.parametrize("example", ["quickstart", "cnn_train"])
def test_losses_over_20_steps_match_the_cpu(example: str) -> None:
    module = __import__(example)
    cpu_losses = module.train("cpu", 20)
    tpu_losses = module.train("tpu", 20)
    assert len(tpu_losses) == 20
    # XLA and torch sum float32 in different orders; over 20 steps of training that drifts ~1e-3.
    assert tpu_losses == pytest.approx(cpu_losses, rel=2e-3, abs=1e-4)
    assert tpu_losses[-1] < tpu_losses[0]
