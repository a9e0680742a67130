"""Recompilation storms on real runs name the line where the varying shape is made: a collate function padding
each batch to its longest item, a tokenizer-like pad to the longest text, a slice of varying length made on
the chip, and a batch made on the chip at a new size each step that reaches every program of a compiled model. Each script is written here, run under `tputrace run` in a subprocess, and its trace analysed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

from tputrace.analysis import Report

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

MARKER = "# the varying shape"

COLLATE = '''
    import torch
    from torch import nn
    from torch.nn.utils.rnn import pad_sequence
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    lengths = [23, 31, 47, 52, 64, 70, 85, 99]
    items = [torch.randint(1, 100, (length,)) for length in lengths for _ in range(4)]

    def collate(batch):
        return pad_sequence(batch, batch_first=True)  {marker}

    model = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 2)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for tokens in DataLoader(items, batch_size=4, collate_fn=collate):
        loss = model(tokens.to("tpu")).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

TOKENIZER = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    texts = [["word"] * length for length in (12, 19, 27, 33, 41, 56)]

    def encode(batch, vocab):
        ids = [[vocab.setdefault(word, len(vocab) + 1) for word in text] for text in batch]
        longest = max(len(row) for row in ids)
        return torch.tensor([row + [0] * (longest - len(row)) for row in ids])  {marker}

    vocab = {{}}
    model = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 2)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for text in texts:
        tokens = encode([text, text[: len(text) // 2]], vocab).to("tpu")
        loss = model(tokens).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

CHIP_SLICE = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 4)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(1, 64, (8, 128)).to("tpu")
    for length in (40, 57, 71, 88, 93, 104):
        window = tokens[:, :length]  {marker}
        loss = model(window).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''


CHIP_BATCH = '''
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(32, 64)
            self.b = nn.Linear(64, 8)

        def forward(self, x):
            h = torch.relu(self.a(x))
            if h.sum() > 0:  # a graph break: the model runs as two graphs
                h = h * 2
            return self.b(h)

    torch.manual_seed(0)
    net = Net().to("tpu")
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    compiled = torch.compile(net, backend="tpu")
    for step in range(6):
        x = torch.randn(16 + step, 32, device="tpu")  {marker}
        loss = compiled(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(loss.item())
'''


GREEDY = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 50)).to("tpu")
    tokens = torch.randint(1, 50, (1, 4)).to("tpu")
    with torch.no_grad():
        for _ in range(8):
            logits = model(tokens)[:, -1]
            tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], dim=1)  {marker}
            if (tokens[:, -1] == 0).all():  # an end-of-sequence check per token, as generate makes
                break
    print(tokens.shape)
'''


def _run(tmp_path: Path, name: str, source: str) -> tuple[Report, Path, int]:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source.format(marker=MARKER)))
    line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if MARKER in text)
    return record(script, tmp_path / f"{name}.tptrace", []), script, line


@pytest.mark.parametrize("name,source", [("collate", COLLATE), ("tokenizer", TOKENIZER)])
def test_storm_is_at_the_host_line_that_made_the_batch(tmp_path: Path, name: str, source: str) -> None:
    report, script, line = _run(tmp_path, name, source)
    storm = next(finding for finding in report.findings if finding.analyzer == "recompiles")
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert f"the batches made at {script.name}:{line}" in storm.title
    # where the shape enters the model stays as evidence
    assert any("enters the program as arg 1 dim 1 of aten.embedding" in evidence.text for evidence in storm.evidence)


def test_storm_is_at_the_chip_op_that_made_the_length(tmp_path: Path) -> None:
    report, script, line = _run(tmp_path, "chip_slice", CHIP_SLICE)
    storm = next(finding for finding in report.findings if finding.analyzer == "recompiles")
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert f"aten.slice.Tensor at {script.name}:{line} changes end" in storm.title
    (data,) = report.results["recompiles"].data.chip_shape_storms
    assert data.lengths == (40, 57, 71, 88, 93, 104)


def test_one_size_made_on_the_chip_is_one_storm_over_every_program_it_reaches(tmp_path: Path) -> None:
    report, script, line = _run(tmp_path, "chip_batch", CHIP_BATCH)
    storms = [finding for finding in report.findings if finding.analyzer == "recompiles" and "storm" in finding.title]
    assert len(storms) == 1, [finding.title for finding in storms]
    (storm,) = storms
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert f"as the shape entering at {script.name}:{line} changes (6 sizes)" in storm.title
    programs = report.results["recompiles"].data.storms
    assert len(programs) >= 4  # the eager programs and both graphs' forward and backward
    assert all(program.proposed == programs[0].proposed for program in programs)
    assert "16, 17, 18, 19, 20, 21" in storm.explanation
    assert "aten.normal_.default at" in storm.explanation


def test_a_sequence_grown_by_one_token_per_call_is_told_to_keep_one_size(tmp_path: Path) -> None:
    report, script, line = _run(tmp_path, "greedy", GREEDY)
    storm = next(finding for finding in report.findings if finding.analyzer == "recompiles")
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert "grows by 1 at each compile" in storm.title
    assert "Allocate it once at its largest size" in storm.suggestion and "collate_fn" not in storm.suggestion
    assert f"extend a tensor with `torch.cat` at {script.name}:{line}" in storm.explanation
