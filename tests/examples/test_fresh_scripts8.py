"""Scripts that read wrong before: a GAN stepping its discriminator's and generator's optimizers in each iteration
(two steps an iteration, and a loss logged every other iteration read `every step`); a `torch.compile(fullgraph=True)`
whose error the script catches to fall back to the uncompiled function (no finding said it never compiled); a
mixture of experts selecting each expert's tokens by a mask (its storm was told to weight a masked loss)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_reads import MASKED_BAG
from test_fresh_scripts import _run
from test_fresh_scripts6 import MIXTURE_OF_EXPERTS

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

GAN_LOGGED_EVERY_OTHER_ITERATION = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    Z = 16
    G = nn.Sequential(nn.Linear(Z, 64), nn.LeakyReLU(0.2), nn.Linear(64, 32), nn.Tanh()).to("tpu")
    D = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)).to("tpu")
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    real = torch.randn(32, 32).to("tpu")
    for step in range(6):
        ones, zeros = torch.ones(32, 1, device="tpu"), torch.zeros(32, 1, device="tpu")
        fake = G(torch.randn(32, Z, device="tpu"))
        d_loss = bce(D(real), ones) + bce(D(fake.detach()), zeros)
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = bce(D(fake), ones)
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
        if step % 2 == 0:
            print(d_loss.item(), g_loss.item())  {marker}
'''


def test_a_gan_stepping_two_optimizers_is_one_step_per_iteration(tmp_path: Path) -> None:
    """Six iterations, each stepping the discriminator's and the generator's optimizer, are six steps, and the two
    losses read every other iteration are `2 times every 2 steps`, told to read less often (not `every step`)."""
    report, script, line = _run(tmp_path, "gan_every_other", GAN_LOGGED_EVERY_OTHER_ITERATION)
    assert report.step_count == 6
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert f"Host sync 2 times every 2 steps at {script.name}:{line} (item)" in sync.title, sync.title
    assert "read less often (every 8 steps)" in sync.suggestion, sync.suggestion


CAUGHT_FULLGRAPH_ERROR = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)


    def train_loss(x, y):
        loss = nn.functional.mse_loss(model(x), y)
        if loss > 1.0:  {marker}
            loss = loss.clamp(max=1.0)
        return loss


    try:
        step_loss = torch.compile(train_loss, fullgraph=True, backend="tpu")
        step_loss(torch.randn(16, 32, device="tpu"), torch.randn(16, 1, device="tpu"))
    except Exception as error:
        print("compiling failed, running eagerly:", type(error).__name__)
        step_loss = train_loss

    for step in range(4):
        x = torch.randn(16, 32, device="tpu")
        y = torch.randn(16, 1, device="tpu")
        loss = step_loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_a_fullgraph_error_the_script_catches_is_still_named_at_its_line(tmp_path: Path) -> None:
    """The script falls back to the uncompiled function when compiling raises: the run ends well, and a warning at
    the `if` Dynamo names says it raised, that the script went on uncompiled, and how to make it compile."""
    report, script, line = _run(tmp_path, "caught_fullgraph", CAUGHT_FULLGRAPH_ERROR)
    (raised,) = [finding for finding in report.findings if "raised at" in finding.title]
    assert (raised.file, raised.line, raised.severity) == (str(script), line, "warning"), raised.title
    assert raised.title == (f"torch.compile(fullgraph=True) raised at {script.name}:{line}: Data-dependent branching; "
                            "the script caught it and ran the function uncompiled")
    assert "`torch.where(condition, a, b)`" in raised.suggestion
    assert any(evidence.text == "the call of the compiled function that raised" and evidence.line == line + 7
               for evidence in raised.evidence), [evidence.text for evidence in raised.evidence]


def test_a_mixture_of_experts_storm_is_told_to_route_with_a_fixed_capacity(tmp_path: Path) -> None:
    """The counts of `x[rows]` are how many tokens the top-k gate sent to each expert: the storm at that line says so
    and tells a fixed capacity per expert (or every expert on every token, weighted), not a masked loss."""
    report, script, line = _run(tmp_path, "moe_routing", MIXTURE_OF_EXPERTS, ("--mode", "strict"))
    (storm,) = [finding for finding in report.findings if finding.title.startswith("Recompilation storm")]
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert "how many tokens a routing chose for each expert" in storm.explanation
    assert storm.suggestion.startswith(f"At {script.name}:{line}: route with a fixed capacity per expert"), storm.suggestion
    assert "reduction=" not in storm.suggestion


def test_a_masked_mean_storm_keeps_the_mask_weighting_fix(tmp_path: Path) -> None:
    """A mask selecting the valid positions of a bag, with no choice made by a top-k, is no routing."""
    report, script, line = _run(tmp_path, "masked_bag_fix", MASKED_BAG, ("--mode", "strict"))
    (storm,) = [finding for finding in report.findings if finding.title.startswith("Recompilation storm")]
    assert "weight by the mask" in storm.suggestion and "capacity" not in storm.suggestion, storm.suggestion
