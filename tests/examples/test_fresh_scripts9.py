"""Scripts that read wrong before: a WGAN stepping its critic's optimizer five times per generator step (a step per
critic step, and the losses read each iteration told to read less often)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

WGAN = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    Z = 16
    G = nn.Sequential(nn.Linear(Z, 64), nn.ReLU(), nn.Linear(64, 32)).to("tpu")
    C = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)).to("tpu")
    opt_g = torch.optim.RMSprop(G.parameters(), lr=5e-5)
    opt_c = torch.optim.RMSprop(C.parameters(), lr=5e-5)
    for it in range(4):
        for _ in range(5):
            real = torch.randn(32, 32, device="tpu")
            fake = G(torch.randn(32, Z, device="tpu")).detach()
            c_loss = C(fake).mean() - C(real).mean()
            opt_c.zero_grad()
            c_loss.backward()
            opt_c.step()
            for p in C.parameters():
                p.data.clamp_(-0.01, 0.01)
        g_loss = -C(G(torch.randn(32, Z, device="tpu"))).mean()
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
        print(it, c_loss.item(), g_loss.item())  {marker}
'''


def test_a_wgan_with_five_critic_steps_per_generator_step_is_one_step_per_iteration(tmp_path: Path) -> None:
    """The critic's optimizer steps five times in an inner loop before the generator's steps once: each iteration of
    the outer loop is one step, from the first (the generator's step is found in the loop around the critic's), and
    the two losses read each iteration are read per step, told to keep them on the chip."""
    report, script, line = _run(tmp_path, "wgan", WGAN)
    assert report.step_count == 4
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert f"Host sync 2 times per step at {script.name}:{line} (item)" in sync.title, sync.title
    assert "already reads every" not in sync.suggestion, sync.suggestion
