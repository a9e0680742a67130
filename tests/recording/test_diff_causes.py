"""`tputrace diff` and `tputrace check` on three real DeferAndFuse runs of one training script: as it is, with a
`.item()` check in the loop, and with one smaller batch in step 5. The script already recompiles once after
warm-up (its step-1 graph differs from step 0's), so the diff must tell a recompile of a new cause at a line
that had one from the same recompile moved to the new sync's line, and a sync after the loop is no sync in
the steady steps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="recording needs torch (pip install -e .[backend])")

SCRIPT = """import sys
import torch
from torch import nn

variant = sys.argv[1]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
total = torch.zeros((), device="tpu")
for step in range(8):
    batch = 12 if variant == "smaller" and step == 5 else 16
    x = torch.randn(batch, 32, device="tpu")
    y = torch.randint(0, 4, (batch,), device="tpu")
    loss = nn.functional.cross_entropy(model(x), y)
    total += loss.detach()
    if variant == "checked" and loss.item() > 100:
        print("diverged")
    opt.zero_grad()
    loss.backward()
    opt.step()
print(total.item() / 8)
"""
STEP_LINE = 19
CHECK_LINE = 16


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("diff_causes")
    (folder / "train.py").write_text(SCRIPT)
    for variant in ("plain", "checked", "smaller"):
        completed = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "run", "-o", f"{variant}.tptrace",
                                    "train.py", variant], cwd=folder, capture_output=True, text=True, timeout=600)
        assert completed.returncode == 0, completed.stderr[-3000:]
    return folder


def _tputrace(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tputrace.cli.main", *args], cwd=folder, capture_output=True,
                          text=True, timeout=600)


def test_a_new_shape_at_a_line_that_already_recompiled_is_a_new_recompile(runs: Path) -> None:
    result = _tputrace(runs, "diff", "plain.tptrace", "smaller.tptrace")
    headline = result.stdout.splitlines()[0]
    assert headline.startswith(f"regression: new recompile at {runs / 'train.py'}:{STEP_LINE} "), headline
    assert "dim 0: 16 -> 12" in headline


def test_a_recompile_moved_to_a_new_sync_line_is_no_new_recompile(runs: Path) -> None:
    result = _tputrace(runs, "diff", "plain.tptrace", "checked.tptrace")
    lines = result.stdout.splitlines()
    assert lines[0] == (f"regression: new finding at {runs / 'train.py'}:{CHECK_LINE}: Host sync every step at "
                        f"train.py:{CHECK_LINE} (item)") + lines[0].split("(item)", 1)[1]
    assert not [line for line in lines if "new recompile" in line or "fixed recompile" in line]


def test_a_sync_after_the_loop_is_within_a_budget_of_no_syncs_per_step(runs: Path) -> None:
    (runs / "budget.toml").write_text("max_syncs_per_step = 0\nmax_transfers_per_step = 0\n")
    result = _tputrace(runs, "check", "plain.tptrace", "--budget", "budget.toml")
    assert result.returncode == 0, result.stdout
    result = _tputrace(runs, "check", "checked.tptrace", "--budget", "budget.toml")
    assert result.returncode == 1
    assert f"max_syncs_per_step = 0 exceeded: 1 host syncs per steady step at {runs / 'train.py'}:{CHECK_LINE}" in result.stdout
    # No transfers finding names the `.item()`'s copy to the host: the line with most of them does.
    assert f"max_transfers_per_step = 0 exceeded: 1 transfers per steady step at {runs / 'train.py'}:{CHECK_LINE}\n" in result.stdout


def test_a_recompile_budget_names_every_recompile_and_its_cause(runs: Path) -> None:
    (runs / "recompiles.toml").write_text("max_recompiles = 1\n")
    result = _tputrace(runs, "check", "smaller.tptrace", "--budget", "recompiles.toml")
    assert result.returncode == 1
    (line,) = result.stdout.splitlines()
    assert line.startswith("max_recompiles = 1 exceeded: 2 recompile(s) after warm-up: ")
    assert "in step 5 (" in line and "dim 0: 16 -> 12) at " in line
