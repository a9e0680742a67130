"""`tputrace numerics` on models the CPU replay must judge fairly: a convolution with a bias that a batch norm
follows (its bias gradient cancels to rounding noise on both sides), and an attention written by hand under the
device's autocast (its modules get bfloat16 inputs that their float32 CPU copies take outside autocast only
widened). Real runs on the tpu device, in process."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tputrace.cli.main import main
from tputrace.numerics.findings import replay_report
from tputrace.numerics.store import COMPARED, NumericsRecording, read_recording

CONV_BEFORE_BATCH_NORM = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(8, 5)).to("tpu")
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(4, 3, 16, 16, device="tpu")
    y = torch.randint(0, 5, (4,), device="tpu")
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

HAND_WRITTEN_ATTENTION_UNDER_AUTOCAST = """
import torch
from torch import nn


class NaiveAttention(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2)
        weights = torch.exp(scores)  # no max subtracted: overflows for large scores
        weights = weights / weights.sum(-1, keepdim=True)
        return weights @ self.v(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(16, 64)
        self.attention = NaiveAttention(64)
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        return self.head(self.attention(self.embed(x)))


torch.manual_seed(0)
model = Model().to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(2):
    x = torch.randn(4, 32, 16, device="tpu") * 6
    with torch.autocast("tpu", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _record(tmp_path: Path, body: str, name: str) -> NumericsRecording:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(body))
    output = tmp_path / f"{name}.tpnum"
    assert main(["numerics", "-o", str(output), str(script)]) == 0
    return read_recording(output)


def test_a_bias_gradient_that_a_batch_norm_cancels_is_no_divergence(tmp_path: Path) -> None:
    recording = _record(tmp_path, CONV_BEFORE_BATCH_NORM, "conv_bn")
    report = replay_report(recording)
    conv_parameters = [call for call in recording.calls if call.module == "Sequential.0" and call.phase == "parameters"]
    assert conv_parameters and all(call.outcome == COMPARED for call in conv_parameters)
    assert report.first_divergence is None, report.first_divergence
    assert report.first_nonfinite is None


def test_modules_under_autocast_are_replayed_in_full_precision(tmp_path: Path) -> None:
    recording = _record(tmp_path, HAND_WRITTEN_ATTENTION_UNDER_AUTOCAST, "autocast_attention")
    report = replay_report(recording)
    assert report.not_compared == []
    assert report.compared == report.calls
    divergence = report.first_divergence
    assert divergence is not None and divergence.call.module == "Model.embed" and divergence.call.phase == "forward"
    assert divergence.note == "bfloat16 on the tpu, float32 on the CPU"
    nonfinite = report.first_nonfinite
    assert nonfinite is not None and nonfinite.module == "Model.attention" and nonfinite.phase == "forward"
    assert report.reference_nonfinite is True  # float32 overflows too: the model's arithmetic, not the device
