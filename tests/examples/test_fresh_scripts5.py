"""Scripts whose diagnoses read wrong before: BERT-style fine-tuning with each batch padded to its own longest
sequence (in strict mode its views and matmuls compile per length at dims that are multiples and squares of it),
two batches whose lengths change independently (two storms, not one), and a validation loop after training that
keeps each score with its graph (and the same loop, clean, under `torch.no_grad()`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

DYNAMIC_PADDING = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    V, D, H, C = 100, 32, 4, 2
    HD = D // H


    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.qkv = nn.Linear(D, 3 * D)
            self.out = nn.Linear(D, D)
            self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
            self.norm = nn.LayerNorm(D)
            self.cls = nn.Linear(D, C)

        def forward(self, ids, mask):
            b, t = ids.shape
            x = self.emb(ids)
            q, k, v = self.qkv(x).view(b, t, 3, H, HD).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-1, -2) / HD ** 0.5
            scores = scores.masked_fill(~mask[:, None, None, :], -1e9)
            att = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, D)
            x = self.norm(x + self.out(att))
            x = self.norm(x + self.ff(x))
            return self.cls(x[:, 0])


    def collate(samples):
        longest = max(len(s) for s, _ in samples)
        ids = torch.zeros(len(samples), longest, dtype=torch.long)
        mask = torch.zeros(len(samples), longest, dtype=torch.bool)
        for row, (s, _) in enumerate(samples):
            ids[row, : len(s)] = torch.tensor(s)
            mask[row, : len(s)] = True
        labels = torch.tensor([label for _, label in samples])
        return ids, mask, labels


    lengths = [9, 13, 17, 11, 21, 15, 19, 12]
    data = [[([1 + (i * j) % (V - 1) for j in range(n)], i % C) for i in range(4)] for n in lengths]
    model = Encoder().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for samples in data:
        ids, mask, labels = collate(samples)  {marker}
        ids, mask, labels = ids.to("tpu"), mask.to("tpu"), labels.to("tpu")
        loss = nn.functional.cross_entropy(model(ids, mask), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

TWO_LENGTHS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    V, D, H = 50, 16, 2
    HD = D // H


    class Attend(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.qkv = nn.Linear(D, 3 * D)

        def forward(self, ids):
            b, t = ids.shape
            q, k, v = self.qkv(self.emb(ids)).view(b, t, 3, H, HD).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-1, -2)).softmax(-1) @ v
            return att.transpose(1, 2).reshape(b, t, D).mean(1)


    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.proj = nn.Linear(D, 2 * D)

        def forward(self, ids):
            b, t = ids.shape
            x = self.proj(self.emb(ids)).view(b, t, 2, D)[:, :, 0]
            weights = (x @ x.transpose(1, 2)).softmax(-1)
            return (weights @ x).reshape(b * t, D).view(b, t, D).mean(1)


    text, code = Attend().to("tpu"), Pool().to("tpu")
    opt = torch.optim.SGD([*text.parameters(), *code.parameters()], lr=0.1)
    text_lengths = [7, 11, 5, 13, 9, 6, 12, 8]
    code_lengths = [10, 4, 15, 6, 14, 12, 5, 9]
    for step, (n, m) in enumerate(zip(text_lengths, code_lengths)):
        words = torch.randint(0, V, (4, n)).to("tpu")  {marker}
        tokens = torch.randint(0, V, (4, m)).to("tpu")
        loss = -(text(words) * code(tokens)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

VALIDATION_KEEPING_SCORES = '''
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(256, 1024)
            self.b = nn.Linear(1024, 10)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return self.b(h)


    torch.manual_seed(0)
    model = Net().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    y = torch.randint(0, 10, (64,), device="tpu")
    for step in range(3):
        loss = nn.functional.cross_entropy(model(torch.randn(64, 256, device="tpu")), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    scores = []
    for batch in range(8):
        out = model(torch.randn(64, 256, device="tpu"))
        score = out.softmax(-1).max(-1).values.mean()  {marker}
        scores.append(score)
    print(sum(s.item() for s in scores))
'''

VALIDATION_UNDER_NO_GRAD = '''
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(256, 1024)
            self.b = nn.Linear(1024, 10)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return self.b(h)


    torch.manual_seed(0)
    model = Net().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    y = torch.randint(0, 10, (64,), device="tpu")
    for step in range(3):
        loss = nn.functional.cross_entropy(model(torch.randn(64, 256, device="tpu")), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    scores = []
    with torch.no_grad():
        for batch in range(8):
            out = model(torch.randn(64, 256, device="tpu"))
            score = out.softmax(-1).max(-1).values.mean()  {marker}
            scores.append(score)
    print(sum(s.item() for s in scores))
'''


@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_a_batch_padded_to_its_longest_sequence_is_one_storm_in_either_mode(tmp_path: Path, mode: str) -> None:
    """Each batch is padded to its own longest sequence. In strict mode the views and matmuls of the attention compile
    per length at dims that are functions of it (4 times it for the flattened batch, 4 * 4 * its square for the
    scores): they join the batch's storm, so the one cause is one finding, at the line that copies the batch."""
    report, script, line = _run(tmp_path, f"dynamic_padding_{mode}", DYNAMIC_PADDING,
                                ("--mode", "strict") if mode == "strict" else ())
    storms = [finding for finding in report.findings if finding.title.startswith("Recompilation storm")]
    assert len(storms) == 1, [storm.title for storm in storms]
    (storm,) = storms
    assert f"as the batches copied to the chip at {script.name}:{line + 1} change shape (8 sizes)" in storm.title, storm.title


def test_two_lengths_that_change_independently_stay_two_storms(tmp_path: Path) -> None:
    """Two batches, each at its own changing length: the programs of each join the storm of its own copy, never the
    other's (no fixed function maps one length onto the other)."""
    report, script, line = _run(tmp_path, "two_lengths", TWO_LENGTHS, ("--mode", "strict"))
    storms = [finding for finding in report.findings if finding.title.startswith("Recompilation storm")]
    copies = {finding.line for finding in storms if "as the batches" in finding.title}
    assert copies == {line, line + 1}, [storm.title for storm in storms]
    assert len(storms) <= 3, [storm.title for storm in storms]


@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_a_validation_loop_keeping_each_score_with_its_graph_is_growth_at_the_kept_values_line(tmp_path: Path, mode: str) -> None:
    """After the last training step, a loop without `no_grad` appends each score: the graph's activations (made in
    the model's forward) pile up iteration after iteration, with no step to measure growth by. The finding names the
    line that made the kept value, the last of the piling lines each iteration, not the activations' line, and is at
    the line that keeps it (`scores.append(score)`, which runs no op), telling to keep it detached and to evaluate
    under `no_grad`."""
    report, script, line = _run(tmp_path, f"validation_{mode}", VALIDATION_KEEPING_SCORES,
                                ("--mode", "strict") if mode == "strict" else ())
    (growth,) = [finding for finding in report.findings if finding.analyzer == "memory"]
    assert (growth.file, growth.line) == (str(script), line + 1), growth.title
    assert f"made at {script.name}:{line} is kept at {script.name}:{line + 1} " in growth.title, growth.title
    assert growth.suggestion.startswith(f"At {script.name}:{line + 1}, keep"), growth.suggestion
    assert growth.title.startswith("Live memory grows by ") and "every iteration of a loop without steps" in growth.title
    piled = re.search(r"loop's last step, (\d+) iterations' buffers were live at once", growth.explanation)
    assert piled is not None and int(piled[1]) >= 8, growth.explanation
    assert "`.detach()`" in growth.suggestion and "`torch.no_grad()`" in growth.suggestion


def test_a_validation_loop_under_no_grad_has_no_growth(tmp_path: Path) -> None:
    """The same loop under `torch.no_grad()` keeps only its 4-byte scores: no memory finding."""
    report, _, _ = _run(tmp_path, "validation_no_grad", VALIDATION_UNDER_NO_GRAD)
    assert not [finding.title for finding in report.findings if finding.analyzer == "memory"]
