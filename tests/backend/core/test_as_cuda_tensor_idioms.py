"""A CUDA script's tensor idioms under `tputrace run --as-cuda`: `tensor.is_cuda` is true for a tensor on the chip
(so `if x.is_cuda:` takes the GPU branch, also inside torch's own modules), the legacy tensor types
(`torch.cuda.FloatTensor(4, 3)`, `torch.cuda.LongTensor([1, 2, 3])`) make chip tensors of their dtype, and
`torch.cuda.utilization()` and `current_blas_handle()` answer 0, where each was false or raised for want of CUDA."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CONSOLE_SCRIPT = Path(sys.executable).parent / "tputrace"

SCRIPT = """
import torch
from torch import nn

model = nn.Linear(8, 4).cuda()
x = torch.randn(16, 8).cuda()
print("is_cuda", x.is_cuda, next(model.parameters()).is_cuda, torch.randn(2).is_cuda)
weights = torch.cuda.FloatTensor(4).fill_(0.5)
labels = torch.cuda.LongTensor([0, 1, 2, 3] * 4)
print("legacy", weights.device.type, weights.dtype, labels.dtype, labels.tolist()[:4],
      isinstance(weights, torch.cuda.FloatTensor), isinstance(labels, torch.cuda.FloatTensor))
print("utilization", torch.cuda.utilization(), "blas", torch.cuda.current_blas_handle())
attention = nn.MultiheadAttention(8, 2, batch_first=True).cuda().eval()
with torch.no_grad():
    attended, _ = attention(x[None], x[None], x[None])
if x.is_cuda:
    loss = nn.functional.cross_entropy(model(x), labels, weight=weights)
    loss.backward()
    print("gpu branch", attended.shape[1], round(float(loss), 3) > 0)
"""

pytestmark = pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="the tputrace console script is not installed")


def test_is_cuda_and_legacy_tensor_types_answer_for_the_chip(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    script = tmp_path / "tensor_idioms.py"
    script.write_text(textwrap.dedent(SCRIPT))
    result = subprocess.run([str(CONSOLE_SCRIPT), "run", "--as-cuda", "--quiet", "-o", str(tmp_path / "t.tptrace"),
                             str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "is_cuda True True False" in result.stdout, result.stdout
    assert "legacy tpu torch.float32 torch.int64 [0, 1, 2, 3] True False" in result.stdout, result.stdout
    assert "utilization 0 blas 0" in result.stdout, result.stdout
    assert "gpu branch 16 True" in result.stdout, result.stdout
