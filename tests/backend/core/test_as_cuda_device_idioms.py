"""A CUDA script's device and profiling idioms under `tputrace run --as-cuda`: NVTX ranges (`range_push`/`range_pop`,
`nvtx.range`, `range_start`/`range_end`, `mark`) are recorded as named ranges, `torch.cuda.memory_summary()` describes
the chip's memory, `get_device_capability()` answers 8.0 (bfloat16 and fused attention, which a chip has), and the
caching allocator's settings (`set_per_process_memory_fraction`, `reset_accumulated_memory_stats`, `ipc_collect`)
change nothing, where torch raised without a CUDA build (`NVTX functions not installed`, a KeyError of the CUDA
allocator's statistics, missing `torch._C._cuda_*` functions, no `major` in the device properties)."""

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

torch.cuda.set_per_process_memory_fraction(0.8)
torch.cuda.reset_accumulated_memory_stats()
torch.cuda.ipc_collect()
amp_dtype = torch.bfloat16 if torch.cuda.get_device_capability()[0] >= 8 else torch.float16
print("capability", torch.cuda.get_device_capability(0), amp_dtype)
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


def test_nvtx_ranges_are_recorded_and_device_queries_answer_for_the_chip(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    script = tmp_path / "nvtx_ranges.py"
    script.write_text(textwrap.dedent(SCRIPT))
    trace_path = tmp_path / "nvtx_ranges.tptrace"
    result = subprocess.run([str(CONSOLE_SCRIPT), "run", "--as-cuda", "--quiet", "-o", str(trace_path), str(script)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "capability (8, 0) torch.bfloat16" in result.stdout, result.stdout
    assert "tpu:0 memory summary" in result.stdout and "MiB at most" in result.stdout, result.stdout
    names = [name for (name,) in tputrace.open(trace_path).sql(
        "SELECT s.text FROM annotations a JOIN strings s ON s.id = a.name_sid WHERE a.source = 'record_function' "
        "ORDER BY a.start_ns")]
    ranges = [name for name in names if not name.startswith("Optimizer.")]
    assert ranges == [name for step in range(3) for name in (f"iteration{step}", f"forward {step}", "backward")], names
