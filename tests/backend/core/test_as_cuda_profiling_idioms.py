"""A CUDA script's profiling idioms under `tputrace run --as-cuda`: NVTX ranges (`range_push`/`range_pop`,
`nvtx.range`, `range_start`/`range_end`, `mark`) are recorded as named ranges, and `torch.cuda.memory_summary()`
describes the chip's memory, where torch raised without a CUDA build (`NVTX functions not installed`, a KeyError of
the CUDA allocator's statistics)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tputrace

CONSOLE_SCRIPT = Path(sys.executable).parent / "tputrace"

SCRIPT = """
import torch
from torch import nn

model = nn.Linear(8, 4).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    torch.cuda.nvtx.range_push(f"iteration{step}")
    with torch.cuda.nvtx.range("forward {}", step):
        loss = model(torch.randn(16, 8, device="cuda")).square().mean()
    handle = torch.cuda.nvtx.range_start("backward")
    loss.backward()
    torch.cuda.nvtx.range_end(handle)
    torch.cuda.nvtx.mark("stepping")
    opt.step()
    opt.zero_grad()
    torch.cuda.nvtx.range_pop()
print(torch.cuda.memory_summary())
"""

pytestmark = pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="the tputrace console script is not installed")


def test_nvtx_ranges_are_recorded_and_the_memory_summary_prints(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    script = tmp_path / "nvtx_ranges.py"
    script.write_text(textwrap.dedent(SCRIPT))
    trace_path = tmp_path / "nvtx_ranges.tptrace"
    result = subprocess.run([str(CONSOLE_SCRIPT), "run", "--as-cuda", "--quiet", "-o", str(trace_path), str(script)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tpu:0 memory summary" in result.stdout and "MiB at most" in result.stdout, result.stdout
    names = [name for (name,) in tputrace.open(trace_path).sql(
        "SELECT s.text FROM annotations a JOIN strings s ON s.id = a.name_sid WHERE a.source = 'record_function' "
        "ORDER BY a.start_ns")]
    ranges = [name for name in names if not name.startswith("Optimizer.")]
    assert ranges == [name for step in range(3) for name in (f"iteration{step}", f"forward {step}", "backward")], names
