"""Scripts that read wrong before: a GAN stepping its discriminator's and generator's optimizers in each iteration
(two steps an iteration, and a loss logged every other iteration read `every step`); a `torch.compile(fullgraph=True)`
whose error the script catches to fall back to the uncompiled function (no finding said it never compiled); a
mixture of experts selecting each expert's tokens by a mask (its storm was told to weight a masked loss); an
early-stopping loop reading its validation loss once per epoch (told to read less often and to sum a logged loss on
the chip, a warning); an accuracy counted on the chip after `optimizer.step()` into a counter made before the loop
(the second step's recompile had no finding: its diff swaps the set-up for the tail); a clipped gradient norm read
into a list each step (told to accumulate `loss.detach()`); a dropout mask drawn with `torch.bernoulli` on the host
(told to pass `device=` to a draw that takes none); predictions copied to the host into a list each step (told to
stack two reads per step)."""

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
    (raised,) = [finding for finding in report.findings if "could not compile" in finding.title]
    assert (raised.file, raised.line, raised.severity) == (str(script), line, "warning"), raised.title
    assert raised.title == (f"torch.compile could not compile the function at {script.name}:{line}: Data-dependent "
                            "branching; it runs uncompiled")
    assert "under `fullgraph=True`, the script caught the error" in raised.explanation, raised.explanation
    assert "`torch.where(condition, a, b)`" in raised.suggestion
    assert any(evidence.text == "the call of the compiled function" and evidence.line == line + 7
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


EARLY_STOPPING = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train = [(torch.randn(16, 32), torch.randn(16, 1)) for _ in range(4)]
    val = [(torch.randn(16, 32), torch.randn(16, 1)) for _ in range(2)]
    best, patience = float("inf"), 0
    for epoch in range(3):
        model.train()
        for x, y in train:
            x, y = x.to("tpu"), y.to("tpu")
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            {validation}
        if val_loss < best:
            best, patience = val_loss, 0
        else:
            patience += 1
            if patience >= 2:
                break
    print(best)
'''
READ_ONCE = ("total = sum(nn.functional.mse_loss(model(x.to(\"tpu\")), y.to(\"tpu\")) for x, y in val)\n"
             "            val_loss = total.item() / len(val)  {marker}")
READ_PER_BATCH = ("val_loss = 0.0\n"
                  "            for x, y in val:\n"
                  "                val_loss += nn.functional.mse_loss(model(x.to(\"tpu\")), y.to(\"tpu\")).item() / len(val)  {marker}")


def test_a_validation_loss_read_once_per_epoch_is_the_evaluations_own_wait(tmp_path: Path) -> None:
    """The read ends the evaluation it waits for (the model's forward ran for it), once per epoch: an info finding
    that says so, not advice to read less often or to sum a logged loss."""
    report, script, line = _run(tmp_path, "early_stopping", EARLY_STOPPING.replace("{validation}", READ_ONCE))
    (read,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert read.severity == "info", read.title
    assert read.suggestion.startswith(f"The read at {script.name}:{line} ends an evaluation the loop runs every 4 steps"), read.suggestion
    assert "`Sequential`" in read.suggestion and "loss.detach()" not in read.suggestion


def test_validation_losses_read_per_batch_are_told_to_be_summed_on_the_chip(tmp_path: Path) -> None:
    """Two reads per evaluation, one per validation batch: told to add them on the chip and read once."""
    report, script, line = _run(tmp_path, "early_stopping_per_batch", EARLY_STOPPING.replace("{validation}", READ_PER_BATCH))
    (read,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "2 times every 4 steps" in read.title, read.title
    assert "`total += loss`" in read.suggestion and "instead of 2" in read.suggestion, read.suggestion


ACCURACY_ON_THE_CHIP = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    correct = torch.zeros((), device="tpu", dtype=torch.long)
    seen = 0
    for step in range(6):
        x = torch.randn(16, 32, device="tpu")
        y = torch.randint(0, 10, (16,), device="tpu")
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        correct += (logits.argmax(-1) == y).sum()  {marker}
        seen += 16
    print(correct.item() / seen)
'''


def test_a_metric_after_the_step_into_a_counter_made_before_the_loop_is_the_tails_finding(tmp_path: Path) -> None:
    """The first step's graph begins with the counter's `zero_`, the second with the metric's ops: the recompile is
    the step tail's, at the metric's line, telling also to run the set-up before the loop."""
    report, script, line = _run(tmp_path, "accuracy_on_chip", ACCURACY_ON_THE_CHIP)
    (tail,) = [finding for finding in report.findings if finding.analyzer == "step_tail"]
    assert (tail.file, tail.line) == (str(script), line), tail.title
    assert f"made before the loop at {script.name}:{line - 10} (aten.zero_.default)" in tail.explanation, tail.explanation
    assert f"Run the set-up at {script.name}:{line - 10} before the loop too" in tail.suggestion, tail.suggestion


GRADIENT_NORMS_KEPT = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    norms = []
    for step in range(6):
        x = torch.randn(16, 32, device="tpu")
        y = torch.randint(0, 10, (16,), device="tpu")
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        norms.append(norm.item())  {marker}
        opt.step()
    print(max(norms))
'''


def test_a_gradient_norm_read_into_a_list_each_step_is_told_to_keep_it_on_the_chip(tmp_path: Path) -> None:
    """The value read is the norm, kept in a list: the fix names it and stacks the kept values after the loop."""
    report, script, line = _run(tmp_path, "gradient_norms", GRADIENT_NORMS_KEPT)
    (read,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert read.suggestion.startswith("Keep the value on the chip: append `norm.detach()` in place of `norm.item()`"), read.suggestion
    assert "loss.detach()" not in read.suggestion


HOST_BERNOULLI_MASK = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    l1, l2 = nn.Linear(32, 64).to("tpu"), nn.Linear(64, 1).to("tpu")
    opt = torch.optim.SGD([*l1.parameters(), *l2.parameters()], lr=0.01)
    for step in range(6):
        h = torch.relu(l1(torch.randn(16, 32, device="tpu")))
        keep = torch.bernoulli(torch.full(h.shape, 0.8)).to("tpu")  {marker}
        loss = l2(h * keep / 0.8).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_a_mask_drawn_by_bernoulli_on_the_host_is_told_to_draw_from_a_chip_tensor(tmp_path: Path) -> None:
    """`torch.bernoulli` takes no `device=`: the fix is to make its probabilities on the chip, or `rand_like < p`."""
    report, script, line = _run(tmp_path, "bernoulli_mask", HOST_BERNOULLI_MASK)
    (copy,) = [finding for finding in report.findings if finding.analyzer == "transfers" and finding.line == line]
    assert "`torch.bernoulli` draws where its input is" in copy.suggestion, copy.suggestion
    assert "`torch.rand_like(x) < p`" in copy.suggestion and "bernoulli(..., device=" not in copy.suggestion


PREDICTIONS_COLLECTED = '''
    import numpy as np
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    preds, labels = [], []
    for step in range(6):
        x = torch.randn(16, 32, device="tpu")
        y = torch.randint(0, 10, (16,), device="tpu")
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        preds.append(logits.argmax(-1).cpu().numpy())  {marker}
        labels.append(y.cpu().numpy())
    print((np.concatenate(preds) == np.concatenate(labels)).mean())
'''


def test_predictions_copied_into_a_list_each_step_are_told_to_be_copied_once_after_the_loop(tmp_path: Path) -> None:
    """Both lines copy to the host every step to append: keep the tensors and copy the lists once after the loop."""
    report, script, line = _run(tmp_path, "predictions", PREDICTIONS_COLLECTED)
    reads = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line in (line, line + 1)]
    assert len(reads) == 2, [finding.title for finding in report.findings]
    for read in reads:
        assert read.suggestion.startswith("Keep the values on the chip while the loop runs"), read.suggestion
        assert "`torch.cat(values).cpu()`" in read.suggestion and "torch.stack([a, b])" not in read.suggestion
