"""Live memory that grows step by step on real runs: a training loop that keeps each step's output in a list (its
graph's output outlives the step) is a memory-growth finding at the append that keeps them, with the line that made them, in both eager
modes; the same loop keeping `loss.item()` has none. The kept output is small (64 KiB a step), as in a short test of a
real script, where a leak is caught before it fills the chip."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

SCRIPT = '''
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    for step in range(10):
        x = torch.randn(64, 256).to("tpu")
        out = model(x)  # the kept buffers
        loss = (out - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        kept.append({kept})
    print(len(kept))
'''


def _growth_findings(tmp_path: Path, kept: str, mode: str) -> list:
    script = tmp_path / "keeps.py"
    script.write_text(textwrap.dedent(SCRIPT.format(kept=kept)))
    report = record(script, tmp_path / "keeps.tptrace", [], ("--mode", mode))
    return [finding for finding in report.findings if finding.analyzer == "memory" and "grows" in finding.title]


@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_outputs_kept_in_a_list_are_growth_at_the_append_and_the_line_that_made_them(tmp_path: Path, mode: str) -> None:
    findings = _growth_findings(tmp_path, "out", mode)
    assert len(findings) == 1, [finding.title for finding in findings]
    growth = findings[0]
    assert growth.file is not None and growth.file.endswith("keeps.py") and growth.line == 15  # kept.append(out)
    assert any(item.line == 10 for item in growth.evidence)  # the line that made them
    assert "64.0 KiB every step" in growth.title and growth.severity == "warning"


def test_a_loop_that_keeps_python_numbers_has_no_growth(tmp_path: Path) -> None:
    assert _growth_findings(tmp_path, "loss.item()", "defer") == []
