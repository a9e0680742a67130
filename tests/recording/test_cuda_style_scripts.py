"""A script written the CUDA way (`device = "cuda" if torch.cuda.is_available() else "cpu"`), recorded for
real: under plain `tputrace run` none of its ops reach tpu and every view says so first; under
`tputrace run --as-cuda` it runs unchanged on tpu."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tputrace
from tputrace.analysis import analyze_path
from tputrace.summary import NO_DEVICE_OPS_TEXT, render_text, summarize

CONSOLE_SCRIPT = Path(sys.executable).parent / "tputrace"

CUDA_STYLE = """
import torch
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(8, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(16, 8, device=device)
    y = torch.randn(16, 4).cuda() if torch.cuda.is_available() else torch.randn(16, 4)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("devices", x.device.type, y.device.type, next(model.parameters()).device.type, torch.device("cuda", 0) != x.device)
"""

pytestmark = [
    pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="the tputrace console script is not installed"),
]


def _record(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    script = tmp_path / "cuda_style.py"
    script.write_text(textwrap.dedent(CUDA_STYLE))
    trace_path = tmp_path / "cuda_style.tptrace"
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), "run", *options, "-o", str(trace_path), str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    return result, trace_path


def test_a_cuda_style_run_without_tpu_ops_says_so_first(tmp_path: Path) -> None:
    result, trace_path = _record(tmp_path)
    assert "devices cpu cpu cpu" in result.stdout
    assert NO_DEVICE_OPS_TEXT in result.stderr
    assert "[critical] No op ran on the tpu device" in result.stderr
    report = analyze_path(trace_path)
    first = report.findings[0]
    assert first.analyzer == "no_device_ops" and first.severity == "critical"
    assert first.line == 3 and first.file == str(tmp_path / "cuda_style.py")
    assert any('device = "cuda" if torch.cuda.is_available() else "cpu"' in item.text for item in first.evidence)
    assert "--as-cuda" in first.suggestion
    with tputrace.open(trace_path) as trace:
        assert render_text(summarize(trace)).splitlines()[0].endswith(NO_DEVICE_OPS_TEXT)


def test_as_cuda_runs_the_script_unchanged_on_tpu(tmp_path: Path) -> None:
    result, trace_path = _record(tmp_path, "--as-cuda")
    assert "devices tpu tpu tpu True" in result.stdout
    assert NO_DEVICE_OPS_TEXT not in result.stderr
    with tputrace.open(trace_path) as trace:
        assert trace.count("ops") > 0
        assert trace.count("steps") >= 3
        assert trace.sql("SELECT COUNT(*) FROM ops JOIN strings ON strings.id = ops.op_sid WHERE strings.text LIKE 'aten.addmm%'")[0][0] >= 3
    assert all(finding.analyzer != "no_device_ops" for finding in analyze_path(trace_path).findings)
