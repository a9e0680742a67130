"""Scripts that read wrong before: a step skipped on the host's check of a chip value (`if not
torch.isfinite(norm): continue`, `if torch.isnan(loss): continue`), told to use `torch.where` in general terms (now
told it is a skip each step waits for, and how to keep it on the chip)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

SKIPPED_STEP = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for step in range(6):
        x = torch.randn(16, 32, device="tpu")
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        {check}  {marker}
            continue
        opt.step()
'''


@pytest.mark.parametrize("check", ["if not torch.isfinite(norm):", "if torch.isnan(loss):"])
def test_a_step_skipped_on_a_non_finite_check_is_told_to_keep_the_skip_on_the_chip(tmp_path: Path, check: str) -> None:
    """The check reads a chip boolean every step to skip the update: the finding at its line says it is that skip and
    tells to zero the gradients on the chip (GradScaler's way) and count the skips, not a generic `torch.where`."""
    report, script, line = _run(tmp_path, "skipped_step", SKIPPED_STEP.replace("{check}", check))
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert sync.title.startswith(f"Host sync every step at {script.name}:{line} (bool)"), sync.title
    assert "to skip the update (`continue`)" in sync.explanation, sync.explanation
    assert "GradScaler" in sync.suggestion and "torch.isfinite" in sync.suggestion, sync.suggestion
    assert "inside the call" not in sync.explanation
