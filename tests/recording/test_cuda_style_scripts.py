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
from tputrace.summary import NO_DEVICE_OPS_BEFORE_ERROR_TEXT, NO_DEVICE_OPS_TEXT, render_text, summarize

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


AMP_AND_EVENTS = """
import torch
device = torch.device("cuda")
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.cuda.amp.GradScaler()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
side = torch.cuda.Stream()
for step in range(3):
    x = torch.randn(16, 8, device=device)
    start.record()
    with torch.cuda.stream(side), torch.autocast("cuda"):
        loss = model(x).float().pow(2).mean()
    torch.cuda.current_stream().wait_stream(side)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    end.record()
    torch.cuda.synchronize()
    assert start.elapsed_time(end) > 0 and torch.cuda.max_memory_allocated() > 0
with torch.cuda.amp.autocast(dtype=torch.bfloat16):
    kept = model(x)
print("dtypes", model(x).dtype, kept.dtype)
"""


def test_as_cuda_maps_amp_events_and_streams(tmp_path: Path) -> None:
    """The CUDA AMP recipe (`torch.autocast("cuda")`, `GradScaler`) and event timing run unchanged: autocast works on
    tpu in float16 as on CUDA unless given a dtype, and events and streams are the tpu device's. The GradScaler's
    overflow check, a host read every step, is told to go with bfloat16."""
    pytest.importorskip("torch")
    script = tmp_path / "amp.py"
    script.write_text(AMP_AND_EVENTS)
    trace_path = tmp_path / "amp.tptrace"
    result = subprocess.run([str(CONSOLE_SCRIPT), "run", "--as-cuda", "-o", str(trace_path), str(script)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dtypes torch.float32 torch.bfloat16" in result.stdout
    with tputrace.open(trace_path) as trace:
        half_products = trace.sql("SELECT COUNT(*) FROM ops JOIN strings op ON op.id = ops.op_sid JOIN strings out ON out.id = ops.outputs_sid "
                                  "WHERE op.text LIKE 'aten.addmm%' AND out.text LIKE 'f16%'")[0][0]
        assert half_products >= 6
        assert trace.count("steps") >= 3
    scaler_line = AMP_AND_EVENTS.splitlines().index("    scaler.step(optimizer)") + 1
    scaler_syncs = [finding for finding in analyze_path(trace_path).findings
                    if finding.analyzer == "syncs" and finding.line == scaler_line]
    assert scaler_syncs and "drop the GradScaler" in scaler_syncs[0].suggestion


def test_a_script_that_raises_before_the_device_is_told_so(tmp_path: Path) -> None:
    """No op reached tpu because the script failed first: the report leads with the failure, not the device choice."""
    script = tmp_path / "fails.py"
    script.write_text('import torch\nx = torch.ones(3)\nraise ValueError("bad config")\n')
    trace_path = tmp_path / "fails.tptrace"
    result = subprocess.run([str(CONSOLE_SCRIPT), "run", "--as-cuda", "-o", str(trace_path), str(script)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 1
    assert NO_DEVICE_OPS_BEFORE_ERROR_TEXT in result.stderr and NO_DEVICE_OPS_TEXT not in result.stderr
    first = analyze_path(trace_path).findings[0]
    assert first.analyzer == "no_device_ops" and first.title.startswith("The script raised before any op ran")
    assert "ValueError: bad config" in first.explanation
