"""`tputrace numerics` on real runs on the tpu device: a planted bfloat16 layer, a NaN from a log of zero in the
backward, dropout, clean models in strict and DEFER_AND_FUSE, and the comparison of two recordings."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from tputrace.cli.main import main
from tputrace.numerics.findings import compare_report, replay_report
from tputrace.numerics.report_findings import numerics_findings
from tputrace.numerics.store import NumericsRecording, read_full_tensors, read_recording

MLP_WITH_A_BFLOAT16_BLOCK = """
import sys
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width, reduced):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.reduced = reduced

    def forward(self, x):
        if self.reduced:
            with torch.autocast("tpu", dtype=torch.bfloat16):
                return torch.relu(self.fc(x)).float()  # the planted cast
        return torch.relu(self.fc(x))


class MLP(nn.Module):
    def __init__(self, reduced):
        super().__init__()
        self.first = Block(16, reduced=False)
        self.second = Block(16, reduced=reduced)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.second(self.first(x)))


torch.manual_seed(0)
model = MLP(reduced="--reduced" in sys.argv).to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(2):
    x = torch.randn(8, 16, device="tpu")
    loss = ((model(x) - 1.0) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

LOG_OF_ZERO_IN_THE_BACKWARD = """
import torch
from torch import nn


class Entropy(nn.Module):
    def forward(self, probabilities):
        terms = torch.where(probabilities > 0, probabilities * torch.log(probabilities), torch.zeros_like(probabilities))
        return -terms.sum(dim=-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.entropy = Entropy()

    def forward(self, x):
        probabilities = torch.relu(self.fc(x))
        probabilities = probabilities / (probabilities.sum(dim=-1, keepdim=True) + 1e-6)
        return self.entropy(probabilities)  # the entropy call


torch.manual_seed(0)
model = Model().to("tpu")
model(torch.randn(16, 8, device="tpu")).mean().backward()
"""

CLEAN_MLP_WITH_DROPOUT = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 1)).to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(2):
    x = torch.randn(8, 16, device="tpu")
    loss = ((model(x) - 1.0) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _record(
    tmp_path: Path, body: str, name: str, *options: str, script_args: tuple[str, ...] = ()
) -> tuple[Path, NumericsRecording]:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(body))
    output = tmp_path / f"{name}.tpnum"
    assert main(["numerics", "-o", str(output), *options, str(script), *script_args]) == 0
    return script, read_recording(output)


def _line_of(script: Path, marker: str) -> int:
    return next(number for number, text in enumerate(script.read_text().splitlines(), 1) if marker in text)


def test_a_planted_bfloat16_layer_is_the_first_divergent_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script, recording = _record(
        tmp_path, MLP_WITH_A_BFLOAT16_BLOCK, "bf16", "--ops", "--modules", "MLP.second.fc", script_args=("--reduced",)
    )
    report = replay_report(recording)
    assert report.first_divergence is not None
    call = report.first_divergence.call
    assert (call.module, call.module_type, call.phase, call.step) == ("MLP.second.fc", "Linear", "forward", 1)
    assert (call.path, call.line) == (str(script), _line_of(script, "the planted cast"))
    assert report.first_divergence.divergence > report.first_divergence.tolerance == 1e-4
    assert report.first_divergence.note == "bfloat16 on the tpu, float32 on the CPU"
    assert report.first_nonfinite is None
    assert report.first_divergent_op is not None and report.first_divergent_op.tpu_dtype == "bfloat16"
    assert "_to_copy" in report.ops_only_on_tpu  # autocast's casts, which the CPU run does not make
    full = read_full_tensors(recording.path, [call.event_id])
    assert {(t.side, t.dtype, t.shape, len(t.data)) for t in full} == {
        ("tpu", "bfloat16", (8, 16), 256),
        ("cpu", "float32", (8, 16), 512),
    }
    assert (
        f"first divergent module: MLP.second.fc (Linear) forward, step 1, at bf16.py:{call.line}"
        in capsys.readouterr().out
    )
    # `tputrace report` on the recording leads with the same module and line, and the views show it.
    assert main(["report", str(recording.path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("1. [warning] Numerics: MLP.second.fc (Linear) forward, step 1 leaves the CPU's values")
    assert f"at {script}:{call.line} · module MLP.second.fc" in lines[2]
    assert any("Compute aten.t in float32, as the CPU does" in line for line in lines)
    _check_views(tmp_path, recording, call)


def _check_views(tmp_path: Path, recording: NumericsRecording, call: Any) -> None:
    """The HTML page and the TUI of a recording with a divergent call lead with it."""
    import asyncio

    page = tmp_path / "numerics.html"
    assert main(["plot", str(recording.path), "-o", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert 'id="fig-numerics-divergence"' in text and "Numerics: MLP.second.fc (Linear) forward" in text
    calls_section = text[text.index('<section id="calls"'):text.index('<section id="ops"')]
    assert f"{call.path}:{call.line}" in calls_section
    assert "aten._to_copy" in text[text.index('<section id="ops"'):]

    from tputrace.numerics.findings import replay_report
    from tputrace.tui.numerics_app import NumericsApp

    async def drive() -> None:
        app = NumericsApp(recording, replay_report(recording))
        async with app.run_test(size=(150, 40)) as pilot:
            await pilot.pause()
            await pilot.press("d")
            await pilot.pause()
            table = app.query_one("#numerics-calls")
            row = table.get_row_at(table.cursor_row)
            assert [str(cell) for cell in row[2:4]] == ["forward", "MLP.second.fc"]
            detail = str(app.query_one("#numerics-detail").render())
            assert "op #3 aten.t: bfloat16 vs float32" in detail
            assert "Numerics: MLP.second.fc" in str(app.query_one("#numerics-status").render())

    asyncio.run(drive())


def test_comparing_two_recordings_names_the_layer_the_change_made_bfloat16(tmp_path: Path) -> None:
    _, reduced = _record(tmp_path, MLP_WITH_A_BFLOAT16_BLOCK, "reduced", "--steps", "0", script_args=("--reduced",))
    _, full = _record(tmp_path, MLP_WITH_A_BFLOAT16_BLOCK, "full", "--steps", "0")
    assert all(call.outcome == "digest only" for call in reduced.calls)
    report = compare_report(reduced, full)
    assert report.first_divergence is not None
    assert (report.first_divergence.call.module, report.first_divergence.call.phase) == ("MLP.second.fc", "forward")
    assert report.first_divergence.note == "bfloat16 here, float32 in the reference"
    assert compare_report(full, full).first_divergence is None


def test_a_nan_from_a_log_of_zero_in_the_backward_is_named(tmp_path: Path) -> None:
    script, recording = _record(tmp_path, LOG_OF_ZERO_IN_THE_BACKWARD, "entropy")
    report = replay_report(recording)
    assert report.first_nonfinite is not None
    call = report.first_nonfinite
    assert (call.module, call.phase, call.line) == ("Model.entropy", "backward", _line_of(script, "the entropy call"))
    assert report.reference_nonfinite is True  # the CPU gives the NaN too: the model's arithmetic
    nan_finding = numerics_findings(report)[0]
    assert nan_finding.title.startswith("NaN/Inf first in Model.entropy (") and nan_finding.title.endswith("as on the CPU")
    assert (nan_finding.file, nan_finding.line) == (str(script), call.line)
    assert all(earlier.nonfinite == 0 for earlier in recording.calls[: recording.calls.index(call)])
    assert report.first_divergence is None


NAN_PARAMETERS_AFTER_A_PADDED_ROW = """
import torch
from torch import nn


class RowNorm(nn.Module):
    def forward(self, x):
        return x / (x.pow(2).sum(-1, keepdim=True).sqrt() + 1e-6)  # sqrt(0) of a padded row: a NaN gradient


model = nn.Sequential(nn.Linear(16, 16, bias=False), RowNorm(), nn.Linear(16, 4)).to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(8, 16, device="tpu")
    x[6:] = 0
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


EXPLICIT_BFLOAT16_CAST = """
import torch
from torch import nn


class Fast(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x):
        return torch.tanh(self.fc(x).to(torch.bfloat16)).float()


model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), Fast(), nn.Linear(32, 4)).to("tpu")
for step in range(2):
    model(torch.randn(16, 32, device="tpu")).pow(2).mean().backward()  # the model call
"""


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_an_explicit_bfloat16_cast_diverges_from_the_full_precision_reference(tmp_path: Path, mode: str) -> None:
    script, recording = _record(tmp_path, EXPLICIT_BFLOAT16_CAST, f"cast-{mode}", "--mode", mode)
    first = replay_report(recording).first_divergence
    assert first is not None
    call = first.call
    assert (call.module, call.phase, call.line) == ("Sequential.2", "forward", _line_of(script, "the model call"))
    assert first.divergence > first.tolerance == 1e-4


def test_modules_fed_nan_parameters_are_compared_not_called_random(tmp_path: Path) -> None:
    _, recording = _record(tmp_path, NAN_PARAMETERS_AFTER_A_PADDED_ROW, "nan_parameters")
    report = replay_report(recording)
    assert report.first_nonfinite is not None and report.first_nonfinite.module == "Sequential.1"
    assert report.first_nonfinite.phase == "backward" and report.first_nonfinite.step == 1
    assert not [call for call in recording.calls if call.reason and "random stream" in call.reason]
    assert report.first_divergence is None


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_a_clean_model_does_not_diverge(tmp_path: Path, mode: str) -> None:
    _, recording = _record(tmp_path, CLEAN_MLP_WITH_DROPOUT, f"clean-{mode}", "--mode", mode)
    report = replay_report(recording)
    assert recording.info["mode"] == mode
    assert report.first_divergence is None and report.first_nonfinite is None
    # Dropout's calls are replayed with the mask the tpu drew, so every call is compared.
    assert report.not_compared == [] and numerics_findings(report) == ()
    assert report.compared == len(recording.calls)
    dropout = [call for call in recording.calls if call.module == "Sequential.2"]
    assert {call.phase for call in dropout} == {"forward", "backward"} and all(call.outcome == "compared" for call in dropout)


def test_strict_and_defer_recordings_of_one_script_agree(tmp_path: Path) -> None:
    _, strict = _record(tmp_path, MLP_WITH_A_BFLOAT16_BLOCK, "strict", "--mode", "strict", "--steps", "0")
    _, deferred = _record(tmp_path, MLP_WITH_A_BFLOAT16_BLOCK, "defer", "--mode", "defer", "--steps", "0")
    report = compare_report(deferred, strict)
    assert report.compared == len(strict.calls) > 0
    assert report.first_divergence is None


WRONG_TANH_LOWERING = """
import jax.numpy as jnp
import torch
from torch import nn

import tputrace.backend  # noqa: F401
from tputrace.backend.ops.registry import LOWERINGS, Lowering

# A test build with one lowering made wrong: tanh off by 1% (nothing else changes).
tanh = torch.ops.aten.tanh.default
LOWERINGS[tanh] = Lowering(tanh, lambda x: jnp.tanh(x) * 1.01)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x):
        hidden = self.act(self.fc1(x))  # the wrongly lowered op
        return self.fc2(hidden)


torch.manual_seed(0)
model = Net().to("tpu")
for step in range(2):
    loss = model(torch.randn(8, 16, device="tpu")).square().mean()
    loss.backward()
"""


def _record_apart(tmp_path: Path, body: str, name: str, *options: str) -> tuple[Path, NumericsRecording]:
    """`_record` in a process of its own: a script that patches a lowering must not reach other tests' programs."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(body))
    output = tmp_path / f"{name}.tpnum"
    result = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "numerics", "-o", str(output), *options,
                             str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    return script, read_recording(output)


def test_a_wrong_lowering_is_named_with_its_module_line_and_op(tmp_path: Path) -> None:
    script, recording = _record_apart(tmp_path, WRONG_TANH_LOWERING, "wrong_tanh", "--ops", "--mode", "strict")
    report = replay_report(recording)
    assert report.first_divergence is not None
    call = report.first_divergence.call
    assert (call.module, call.module_type, call.phase, call.step) == ("Net.act", "Tanh", "forward", 1)
    assert call.line == _line_of(script, "the wrongly lowered op")
    assert report.first_divergence.note is None  # same dtype on both sides: the values differ, not the precision
    assert report.first_divergent_op is not None and report.first_divergent_op.op_name == "tanh"
    finding = numerics_findings(report)[0]
    assert finding.suggestion.startswith("aten.tanh gives other values than the CPU's in the same dtype")


WRONG_SUM_LOWERING = """
import jax.numpy as jnp
import torch
from torch import nn

import tputrace.backend  # noqa: F401
from tputrace.backend.ops.registry import LOWERINGS, Lowering

# A test build with one lowering made wrong: a sum over dims off by 1%. Here only the bias gradients use it.
total = torch.ops.aten.sum.dim_IntList
LOWERINGS[total] = Lowering(total, lambda x, dims, keepdim=False, dtype=None: jnp.sum(x, axis=tuple(dims), keepdims=keepdim) * 1.01)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))  # the layers


torch.manual_seed(0)
model = Net().to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(2):
    loss = model(torch.randn(8, 16, device="tpu")).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_parameter_gradients_are_compared_when_the_optimizer_steps(tmp_path: Path) -> None:
    _, recording = _record_apart(tmp_path, WRONG_SUM_LOWERING, "wrong_sum", "--mode", "strict")
    report = replay_report(recording)
    assert report.first_divergence is not None
    call = report.first_divergence.call
    # Outputs and input gradients match; the bias gradients (a sum over the batch) do not.
    assert call.phase == "parameters" and call.module in ("Net.fc1", "Net.fc2") and call.step == 1
    assert not [row for row in recording.calls if row.phase != "parameters" and row.diverged]
    parameters = [row for row in recording.calls if row.phase == "parameters"]
    assert {row.module for row in parameters} == {"Net.fc1", "Net.fc2"} and all(row.diverged for row in parameters)
    assert "parameter gradients" in numerics_findings(report)[0].explanation


RANDOM_MODULE_WITH_A_CAST = """
import torch
from torch import nn
from torch.nn import functional as F


class NoisyHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 4) / 4)

    def forward(self, x):
        dropped = F.dropout(x, 0.25, self.training)
        with torch.autocast("tpu", dtype=torch.bfloat16):
            return (dropped @ self.weight).float()  # the planted cast


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(16, 16)
        self.head = NoisyHead()

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))  # the head's call


torch.manual_seed(0)
model = Net().to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(2):
    loss = model(torch.randn(8, 16, device="tpu")).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_a_module_that_draws_random_numbers_is_replayed_with_the_tpu_draws(tmp_path: Path, mode: str) -> None:
    script, recording = _record(tmp_path, RANDOM_MODULE_WITH_A_CAST, f"noisy-{mode}", "--mode", mode)
    report = replay_report(recording)
    assert report.not_compared == []
    assert report.first_divergence is not None
    call = report.first_divergence.call
    assert (call.module, call.phase, call.step) == ("Net.head", "forward", 1)
    assert call.line == _line_of(script, "the head's call")
    # bfloat16's rounding (a relative difference of ~1e-3), not another dropout mask (one of order 1).
    assert 1e-4 < report.first_divergence.divergence < 0.05


def test_the_cpu_reference_multiplies_at_the_highest_precision_whatever_the_script_set() -> None:
    torch = pytest.importorskip("torch")
    from tputrace.numerics.full_precision import FullPrecision

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        with FullPrecision():
            assert torch.get_float32_matmul_precision() == "highest"
            x = torch.ones(2, 2)
            assert x.to(torch.bfloat16) is x
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(previous)
