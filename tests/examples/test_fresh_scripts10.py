"""Scripts that read wrong before: a step skipped on the host's check of a chip value (`if not
torch.isfinite(norm): continue`, `if torch.isnan(loss): continue`), told to use `torch.where` in general terms (now
told it is a skip each step waits for, and how to keep it on the chip); a second optimizer stepped every other
iteration and two training phases with their own optimizers (an iteration merged with the next); anomaly detection
left on (its reads at the backward line told to accumulate the loss on the chip)."""

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


BODY_STEPPED_EVERY_OTHER_ITERATION = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    head = nn.Linear(64, 10).to("tpu")
    body = nn.Sequential(nn.Linear(32, 64), nn.ReLU()).to("tpu")
    opt_head = torch.optim.SGD(head.parameters(), lr=1e-2)
    opt_body = torch.optim.SGD(body.parameters(), lr=1e-3)
    for step in range(8):
        x = torch.randn(16, 32, device="tpu")
        y = torch.randint(0, 10, (16,), device="tpu")
        loss = nn.functional.cross_entropy(head(body(x)), y)
        opt_head.zero_grad()
        opt_body.zero_grad()
        loss.backward()
        opt_head.step()
        if step % 2 == 0:
            opt_body.step()  {marker}
'''


def test_a_second_optimizer_stepped_every_other_iteration_keeps_one_step_per_iteration(tmp_path: Path) -> None:
    """The body's optimizer steps under `if step % 2 == 0:`: the loop's iterations do not wait for it, so eight
    iterations are eight steps (they were six, an iteration without the body's step merged with the next)."""
    report, _, _ = _run(tmp_path, "every_other", BODY_STEPPED_EVERY_OTHER_ITERATION)
    assert report.step_count == 8


TWO_PHASES = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
    warm_up = torch.optim.SGD(model[2].parameters(), lr=1e-2)
    full = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def batch():
        return torch.randn(16, 32, device="tpu"), torch.randint(0, 10, (16,), device="tpu")

    for it in range(3):
        x, y = batch()
        loss = nn.functional.cross_entropy(model(x), y)
        warm_up.zero_grad()
        loss.backward()
        warm_up.step()
    for it in range(4):
        x, y = batch()
        loss = nn.functional.cross_entropy(model(x), y)
        full.zero_grad()
        loss.backward()
        full.step()  {marker}
'''


def test_two_training_phases_with_their_own_optimizers_are_one_step_per_iteration(tmp_path: Path) -> None:
    """A warm-up loop stepping the head's optimizer, then a loop stepping the whole model's: the first loop does not
    wait for the second's optimizer, nor the second for the first's, so 3 + 4 iterations are 7 steps (they were 5:
    the first step of each phase merged with the next)."""
    report, _, _ = _run(tmp_path, "two_phases", TWO_PHASES)
    assert report.step_count == 7


ANOMALY_DETECTION = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.autograd.set_detect_anomaly(True)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for step in range(5):
        x = torch.randn(16, 32, device="tpu")
        y = torch.randint(0, 10, (16,), device="tpu")
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()  {marker}
        opt.step()
'''


def test_anomaly_detection_left_on_is_named_as_the_backward_lines_reads(tmp_path: Path) -> None:
    """`set_detect_anomaly(True)` reads whether each backward function's output has a NaN: the reads at the backward
    line are named as anomaly detection and told to turn it off, not to accumulate the loss on the chip."""
    report, script, line = _run(tmp_path, "anomaly", ANOMALY_DETECTION)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "anomaly detection" in sync.explanation, sync.explanation
    assert sync.suggestion.startswith("Anomaly detection is a debugging mode"), sync.suggestion
    fusion = [finding for finding in report.findings if finding.analyzer == "fusion" and finding.line == line]
    assert all("set_detect_anomaly(False)" in finding.suggestion for finding in fusion)
