"""Host syncs read wrong, run under `tputrace run` in a subprocess: a script's single read was a warning told about a
read every iteration, a comprehension reading a tensor's elements one at a time was told to accumulate a detached
value, and a sync's cost in all passed the stall measured at its line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

from tputrace.analysis import Report
from tputrace.analysis.findings import Finding
from tputrace.analysis.syncs import SyncsData

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

MARKER = "# the planted line"

# One read after a chain of matmuls queued on the chip, more work after it: the wait is long, and made once.
ONE_READ = '''
    import torch

    torch.manual_seed(0)
    w = torch.randn(768, 768, device="tpu") / 28
    h = torch.randn(768, 768, device="tpu")
    for _ in range(12):
        h = torch.tanh(h @ w)
    scale = h.abs().max().item()  {marker}
    out = (h / scale).sum(0)
    print(out.shape)
'''

# Each step reads the elements of a small tensor one at a time; the warm-up step's reads are mostly compiles.
ELEMENT_READS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for step in range(5):
        x = torch.randn(32, 64, device="tpu")
        y = torch.randint(0, 8, (32,), device="tpu")
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        per_class = logits.mean(0)
        history.append([value.item() for value in per_class])  {marker}
'''


def _sync_at_marker(tmp_path: Path, name: str, source: str) -> tuple[Report, Finding]:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source.format(marker=MARKER)))
    line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if MARKER in text)
    report = record(script, tmp_path / f"{name}.tptrace", [])
    syncs = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert len(syncs) == 1, [f"{finding.analyzer}: {finding.title}" for finding in report.findings]
    return report, syncs[0]


def test_a_single_read_is_info_and_told_of_one_wait(tmp_path: Path) -> None:
    _, finding = _sync_at_marker(tmp_path, "one_read", ONE_READ)
    assert finding.severity == "info", finding.title
    assert "once" in finding.suggestion
    assert "iteration" not in finding.suggestion and "every N" not in finding.suggestion, finding.suggestion


def test_element_reads_are_told_to_read_the_tensor_once_at_no_more_than_their_stall(tmp_path: Path) -> None:
    report, finding = _sync_at_marker(tmp_path, "element_reads", ELEMENT_READS)
    assert "`per_class.tolist()`" in finding.suggestion, finding.suggestion
    assert "detach" not in finding.suggestion
    data = report.data(SyncsData)
    assert data is not None
    measured = sum(line.stall_ns for line in data.lines
                   if line.where == f"element_reads.py:{finding.line}" and line.kind == "item")
    assert finding.cost_per_step_ns is not None
    assert 0 < finding.cost_total_ns <= measured
