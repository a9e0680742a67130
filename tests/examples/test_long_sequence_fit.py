"""A model over a long sequence with a batch of 2 that does not fit a small target: the smaller-batch change divides
the batch at most by its size (2 -> 1), however far the peak is over, in both eager modes."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_problems import record

from tputrace.analysis.memory import MemoryData
from tputrace.analysis.report import analyze_path

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

LONG_SEQUENCE = """import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5)
        return self.out(scores.softmax(-1) @ v)


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attention = Attention(width)

    def forward(self, x):
        return x + self.attention(self.norm(x))


torch.manual_seed(0)
model = nn.Sequential(Block(64), Block(64)).to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    x = torch.randn(2, 1024, 64, device="tpu")
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(loss.item())
"""


@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_a_batch_of_two_is_divided_by_two_at_most(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "long_sequence.py"
    script.write_text(LONG_SEQUENCE)
    trace = tmp_path / "long_sequence.tptrace"
    record(script, trace, [], ("--mode", mode))
    memory = analyze_path(trace, "v5e:1MiB").data(MemoryData)
    assert memory is not None and memory.fits and not memory.fits[0].fits
    (smaller_batch,) = [change for change in memory.fits[0].changes if change.change == "batch"]
    assert smaller_batch.description.startswith("a batch 2x smaller per step (2 -> 1 a step)"), smaller_batch.description
