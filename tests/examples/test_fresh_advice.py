"""Scripts whose advice a user would find wrong, run under `tputrace run` in a subprocess: a fused q/k/v projection's
width (3 x the model's) told to change alone, a synthetic batch's input features made on the chip told to become
another size, and reads of a tensor and a scalar in the same steps told to `torch.stack` together."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

from tputrace.analysis import Report
from tputrace.analysis.findings import Finding

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

FUSED_QKV = '''
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)


    class Block(nn.Module):
        def __init__(self, width, heads=4):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(width, 3 * width)
            self.out = nn.Linear(width, width)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return x + self.out(attended.transpose(1, 2).reshape(b, t, d))


    class LM(nn.Module):
        def __init__(self, vocab=512, width=96):
            super().__init__()
            self.emb = nn.Embedding(vocab, width)
            self.blocks = nn.Sequential(Block(width), Block(width))
            self.head = nn.Linear(width, vocab)

        def forward(self, ids):
            return self.head(self.blocks(self.emb(ids)))


    model = LM().to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(4):
        ids = torch.randint(0, 512, (8, 129), device="tpu")
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 512), ids[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

SYNTHETIC_IMAGES = '''
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        images = torch.randn(256, 1, 28, 28, device="tpu")
        labels = torch.randint(0, 10, (256,), device="tpu")
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

COPIED_BATCH_BESIDE_HEADS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=40, nhead=4, dim_feedforward=160, batch_first=True).to("tpu")
    head = nn.Linear(40, 2).to("tpu")
    optimizer = torch.optim.Adam([*layer.parameters(), *head.parameters()], lr=1e-3)
    for step in range(5):
        x = torch.randn(64, 128, 40).to("tpu")
        y = torch.randint(0, 2, (64,)).to("tpu")
        loss = nn.functional.cross_entropy(head(layer(x).mean(1)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

TENSOR_BESIDE_SCALAR = '''
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, predictions = [], []
    for step in range(6):
        x = torch.randn(64, 64, device="tpu")
        y = torch.randint(0, 10, (64,), device="tpu")
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        predicted = logits.argmax(-1).cpu()
        loss_value = float(loss)
        predictions.append(predicted)
        losses.append(loss_value)
    print(len(losses))
'''


def _run(source: str, tmp_path: Path) -> Report:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    return record(script, tmp_path / "train.tptrace", [])


def _padding(report: Report, size: int) -> Finding:
    found = [finding for finding in report.findings if finding.analyzer == "padding" and f" {size} is off" in finding.title]
    assert len(found) == 1, [finding.title for finding in report.findings]
    return found[0]


def test_fused_projection_width_names_the_model_width(tmp_path: Path) -> None:
    report = _run(FUSED_QKV, tmp_path)
    suggestion = _padding(report, 288).suggestion
    assert "288 is 3 x 96" in suggestion and "change 96 itself" in suggestion, suggestion
    assert "instead of 288" not in suggestion, suggestion


def test_input_features_made_on_the_chip_are_the_data_s(tmp_path: Path) -> None:
    report = _run(SYNTHETIC_IMAGES, tmp_path)
    finding = _padding(report, 784)
    assert finding.severity == "info" and "input features 784" in finding.title, finding.title
    assert "on the chip at train.py:10" in finding.suggestion, finding.suggestion
    assert "instead of 784" not in finding.suggestion, finding.suggestion


def test_heads_with_the_copied_batch_s_bytes_are_not_its_input_features(tmp_path: Path) -> None:
    """The queries split into 4 heads of 10 (f32[128,256,10] in `q @ k.T`) have the bytes of the batch copied each step
    (f32[64,128,40]): the head width is the model's, told that the MXU pads it whatever its value, not the input's."""
    report = _run(COPIED_BATCH_BESIDE_HEADS, tmp_path)
    finding = _padding(report, 10)
    assert "input features" not in finding.title, finding.title
    assert "fewer, wider heads" in finding.suggestion, finding.suggestion


def test_tensor_read_beside_a_scalar_is_not_told_to_stack(tmp_path: Path) -> None:
    report = _run(TENSOR_BESIDE_SCALAR, tmp_path)
    together = [finding for finding in report.findings
                if finding.analyzer == "syncs" and "reads in the same steps as" in finding.suggestion]
    assert len(together) == 2, [(finding.title, finding.suggestion) for finding in report.findings]
    for finding in together:
        assert "torch.stack([a, b])" not in finding.suggestion, finding.suggestion
        assert "torch.cat([a.reshape(-1).float(), b.reshape(-1).float()])" in finding.suggestion, finding.suggestion
        assert "train.py:18 copies 512 bytes a read" in finding.suggestion, finding.suggestion
