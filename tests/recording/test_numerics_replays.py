"""`tputrace numerics` on models the CPU replay must judge fairly: a convolution with a bias that a batch norm
follows (its bias gradient cancels to rounding noise on both sides), and an attention written by hand under the
device's autocast (its modules get bfloat16 inputs that their float32 CPU copies take outside autocast only
widened). Real runs on the tpu device, in process."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tputrace.cli.main import main
from tputrace.numerics.findings import render, replay_report
from tputrace.numerics.report_findings import numerics_findings
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


OVERFLOW_IN_A_FORWARD = """
import torch
from torch import nn


class Energy(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(32, 64)
        self.energy = nn.Linear(64, 64)
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        h = torch.relu(self.embed(x))
        e = torch.exp(self.energy(h) * 12.0)  # past float16's largest value
        return self.head(e / e.sum(-1, keepdim=True))


torch.manual_seed(0)
model = Energy().to("tpu").to(torch.float16)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(2):
    x = torch.randn(16, 32, device="tpu", dtype=torch.float16) * 4
    loss = model(x).float().pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


PADDED_TOKENS_IN_FLOAT16 = """
import torch
from torch import nn


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 32, padding_idx=0)
        self.norm = nn.LayerNorm(32, eps=1e-12)
        self.out = nn.Linear(32, 5)

    def forward(self, tokens):
        return self.out(self.norm(self.embed(tokens)))


torch.manual_seed(0)
model = Tagger().to("tpu").half()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(2):
    tokens = torch.randint(1, 100, (8, 12), device="tpu")
    tokens[:, 8:] = 0  # padding: all-zero embeddings, rows of zero variance
    loss = model(tokens).float().pow(2).mean()
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
    assert not report.nonfinite_given  # the attention's own forward made them


def test_a_nan_made_between_module_calls_is_placed_in_the_forward_that_made_it(tmp_path: Path) -> None:
    recording = _record(tmp_path, OVERFLOW_IN_A_FORWARD, "overflow")
    report = replay_report(recording)
    assert report.first_nonfinite is not None and report.first_nonfinite.module == "Energy.head"
    assert report.nonfinite_given and report.nonfinite_given_by == "Energy"
    assert report.reference_nonfinite is True
    assert "the code of Energy's own forward made them before this call" in render(report)
    (finding,) = [finding for finding in numerics_findings(report) if "NaN/Inf" in finding.title]
    assert finding.title == "NaN/Inf first made in Energy's forward before it calls Energy.head (Linear), step 1"
    assert finding.module == "Energy" and finding.line == 16 and finding.severity == "info"


def test_a_reference_that_overflows_where_the_tpu_does_not_says_so(tmp_path: Path) -> None:
    """A float16 LayerNorm with eps 1e-12 over zero-variance padding rows: the CPU's float16 backward overflows,
    the tpu's (float32 inside) does not; the divergence must say which side has the NaN/Inf."""
    recording = _record(tmp_path, PADDED_TOKENS_IN_FLOAT16, "padded_float16")
    report = replay_report(recording)
    divergence = report.first_divergence
    assert divergence is not None and divergence.call.module == "Tagger.norm" and divergence.call.phase == "backward"
    assert report.first_nonfinite is None
    text = render(report)
    assert "NaN/Inf: 0 on the tpu, 1,024 in the CPU reference: the reference's own kernel overflows" in text
    (finding,) = [finding for finding in numerics_findings(report) if finding.title.startswith("Numerics:")]
    assert "the CPU reference has NaN/Inf where the tpu has none: its float16 kernel overflows" in finding.explanation
