"""`torch.load` in a CUDA script run with `tputrace run --as-cuda`: storages mapped to `cuda` (`map_location="cuda"`,
`torch.device("cuda:0")`) or saved on a GPU (tagged `cuda:0` in the file) are restored onto the tpu chip of the same
index with their values, where torch's CUDA deserializer raised `Storage device not recognized: cuda`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CONSOLE_SCRIPT = Path(sys.executable).parent / "tputrace"

SCRIPT = """
import torch
import torch.serialization
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 3).cuda()
torch.save({"model": model.state_dict(), "step": 3}, "saved_on_chip.pt")
# A checkpoint as a GPU writes it: its storages tagged cuda:0.
gpu_tag = (0, lambda storage: "cuda:0" if storage.device.type == "cpu" else None, lambda storage, location: None)
torch.serialization._package_registry.insert(0, gpu_tag)
torch.save({"table": torch.arange(6.0).view(2, 3)}, "saved_on_gpu.pt")
torch.serialization._package_registry.remove(gpu_tag)

for where in ("cuda", torch.device("cuda:0"), {"tpu:0": "cuda:0"}):
    checkpoint = torch.load("saved_on_chip.pt", map_location=where)
    weight = checkpoint["model"]["weight"]
    print("chip", weight.device, torch.equal(weight.cpu(), model.weight.detach().cpu()), checkpoint["step"])
for where in (None, "cuda"):
    table = torch.load("saved_on_gpu.pt", map_location=where)["table"]
    print("gpu", table.device, table.cpu().tolist())
model.load_state_dict(torch.load("saved_on_chip.pt", map_location="cuda")["model"])
"""

pytestmark = pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="the tputrace console script is not installed")


def test_checkpoints_mapped_to_cuda_load_onto_the_chip(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    script = tmp_path / "load_on_cuda.py"
    script.write_text(textwrap.dedent(SCRIPT))
    result = subprocess.run([str(CONSOLE_SCRIPT), "run", "--as-cuda", "--no-trace", "--quiet", str(script)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith(("chip ", "gpu "))]
    assert lines == ["chip tpu:0 True 3"] * 3 + ["gpu tpu:0 [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]"] * 2, result.stdout
