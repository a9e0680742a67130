"""Single-chip training scripts of kinds that read wrong before: LoRA adapters on a frozen base whose token count
equals a frozen layer's output width (input gradients read as frozen weights' gradients); two epochs whose last,
smaller batch compiled once at the first epoch's end (unnamed) and whose evaluation's accuracy read was told to read
less often; a strict-mode run told only to batch more; edge lists over a fixed node count told to pad the nodes; and a
best-so-far compare skipped in the first iteration read as a period."""

from __future__ import annotations

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

LORA = '''
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)


    class LoRALinear(nn.Module):
        def __init__(self, base, r=8):
            super().__init__()
            self.base = base
            self.base.requires_grad_({base_trains})
            self.A = nn.Parameter(torch.randn(r, base.in_features) * 0.01)
            self.B = nn.Parameter(torch.zeros(base.out_features, r))

        def forward(self, x):
            return self.base(x) + x @ self.A.t() @ self.B.t() * 2.0  {marker}


    class Block(nn.Module):
        def __init__(self, d=64):
            super().__init__()
            self.fc1 = LoRALinear(nn.Linear(d, 4 * d))
            self.fc2 = LoRALinear(nn.Linear(4 * d, d))

        def forward(self, x):
            return x + self.fc2(F.gelu(self.fc1(x)))


    blocks = nn.ModuleList([Block() for _ in range(2)]).to("tpu")
    head = nn.Linear(64, 10).to("tpu").requires_grad_(False)
    opt = torch.optim.AdamW([p for name, p in blocks.named_parameters() if name.endswith(("A", "B"))], lr=1e-3)
    for step in range(4):
        x = torch.randn(4, 64, 64, device="tpu")  # 256 tokens: as many as fc1's outputs
        y = torch.randint(0, 10, (4, 64), device="tpu")
        for block in blocks:
            x = checkpoint(block, x, use_reentrant=False)
        loss = F.cross_entropy(head(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_lora_input_gradients_through_a_frozen_base_are_no_weight_gradients(tmp_path) -> None:
    """The base frozen with requires_grad_(False): the backward's products through its weights (and the frozen head's)
    are input gradients the adapters before them need, though 256 tokens make some of a base weight's shape: no
    finding. The base left trainable but out of the optimizer: its weight gradients are the finding, at the forward."""
    frozen, _, _ = _run(tmp_path, "lora_frozen", LORA.replace("{base_trains}", "False"))
    assert not [finding for finding in frozen.findings if finding.analyzer == "frozen_backward"], [
        finding.title for finding in frozen.findings]
    unstepped, script, line = _run(tmp_path, "lora_unstepped", LORA.replace("{base_trains}", "True"))
    (finding,) = [finding for finding in unstepped.findings if finding.analyzer == "frozen_backward"]
    assert (finding.file, finding.line) == (str(script), line), finding.title
    assert ".fc1.base" in finding.explanation and ".fc2.base" in finding.explanation, finding.explanation

EPOCHS = '''
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    train_loader = DataLoader(TensorDataset(torch.randn(40, 32), torch.randint(0, 5, (40,))), batch_size=16, shuffle=True)
    val_loader = DataLoader(TensorDataset(torch.randn(20, 32), torch.randint(0, 5, (20,))), batch_size=8)
    model = nn.Sequential(nn.Linear(32, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 128), nn.LayerNorm(128),
                          nn.GELU(), nn.Linear(128, 5)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(2):
        model.train()
        for x, y in train_loader:
            x, y = x.to("tpu"), y.to("tpu")
            loss = F.cross_entropy(model(x), y)  {marker}
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        correct, val_loss = 0, 0.0
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to("tpu"), y.to("tpu")
                logits = model(x)
                val_loss += F.cross_entropy(logits, y, reduction="sum").item()
                correct += (logits.argmax(1) == y).sum().item()
        print(epoch, val_loss / 20, correct / 20)
'''


@pytest.fixture(scope="module")
def epochs_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("epochs"), "epochs", EPOCHS)


def test_each_epochs_last_smaller_batch_is_the_late_recompile_of_the_first_epochs_end(epochs_run) -> None:
    """40 examples in batches of 16: each epoch ends with 8 rows. The first epoch's end compiled them, the second's ran
    that program from the cache: one finding at the first step that compiled it, the line where the batch entered."""
    report, script, line = epochs_run
    (late,) = [finding for finding in report.findings if finding.title.startswith("The last batch")]
    assert late.title.startswith("The last batch of an epoch, smaller (8 rows, not 16), compiled again in step 2"), late.title
    assert (late.file, late.line) == (str(script), line), late.title
    assert "ran again, from the program cache, in step 5" in late.explanation, late.explanation
    assert "drop_last=True" in late.suggestion


def test_an_accuracy_read_beside_the_evaluation_loss_ends_the_same_evaluation(epochs_run) -> None:
    """The accuracy's `.item()` waits only for its own ops (the loss's read ran the forward): it still ends the
    evaluation, told to add the batches' counts on the chip, naming the line whose reads ran the forward."""
    report, script, line = epochs_run
    accuracy_line = line + 11
    (accuracy,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == accuracy_line]
    assert accuracy.suggestion.startswith(f"The reads at {script.name}:{accuracy_line} end an evaluation the loop runs "
                                          "every 3 steps"), accuracy.suggestion
    assert f"ran for the reads at {script.name}:{accuracy_line - 1})" in accuracy.suggestion, accuracy.suggestion

STRICT_MLP = '''
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(5):
        x = torch.randn(16, 32, device="tpu")
        loss = F.mse_loss(model(x), torch.zeros(16, 4, device="tpu"))  {marker}
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_a_host_bound_strict_mode_run_is_told_to_run_in_defer_and_fuse_first(tmp_path) -> None:
    """Strict mode launches one program per op, so a small model's step is host-bound: the mode the run chose is the
    cheapest change, named before the general advice."""
    report, _, _ = _run(tmp_path, "strict_mlp", STRICT_MLP, ("--mode", "strict"))
    (host_bound,) = [finding for finding in report.findings if finding.analyzer == "host_bound"]
    assert host_bound.suggestion.startswith("The run was in DEFER_NEVER mode (`--mode strict`), one program launched "
                                            "per op: run it in DEFER_AND_FUSE"), host_bound.suggestion
    assert "Give the chip more work per op" in host_bound.suggestion

FIXED_NODES = '''
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    lin = nn.Linear(16, 32).to("tpu")
    head = nn.Linear(32, 4).to("tpu")
    opt = torch.optim.SGD([*lin.parameters(), *head.parameters()], lr=0.1)
    for step in range(4):
        num_edges = 100 + 37 * step
        edge_index = torch.randint(0, 50, (2, num_edges)).to("tpu")  {marker}
        x = torch.randn(50, 16, device="tpu")
        src, dst = edge_index
        messages = lin(x)[src]
        h = torch.zeros(50, 32, device="tpu").index_add_(0, dst, messages)
        loss = F.cross_entropy(head(F.relu(h)), torch.randint(0, 4, (50,), device="tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_edge_lists_over_a_fixed_node_count_are_not_told_to_pad_the_nodes(tmp_path) -> None:
    """Every graph has the same 50 nodes; only the edge list's length changes, entering at the gather of rows by it:
    pad the edges with a dummy row, and nothing about padding the nodes, which never changed."""
    report, script, line = _run(tmp_path, "fixed_nodes", FIXED_NODES)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert "dummy row" in storm.suggestion, storm.suggestion
    assert "nodes" not in storm.suggestion.split("dummy row", 1)[1], storm.suggestion

BEST_SO_FAR = '''
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 3)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    best = None
    for step in range(5):
        x = torch.randn(32, 16, device="tpu")
        loss = F.cross_entropy(model(x), torch.randint(0, 3, (32,), device="tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if best is None or loss < best:  {marker}
            best = loss.detach()
    print(best.item())
'''


def test_a_comparison_skipped_in_the_first_iteration_reads_every_step_from_the_second(tmp_path) -> None:
    """`best is None` short-cuts the first iteration, so the compare reads in every later one (after the optimizer
    step, so in steps 2 to the end): `every step from step 2`, not a period such as `3 times every 4 steps`."""
    report, script, line = _run(tmp_path, "best_so_far", BEST_SO_FAR)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert sync.title.startswith(f"Host sync every step from step 2 at {script.name}:{line} (bool)"), sync.title
    assert "Each wait forces the 1 op still pending on average to run" in sync.explanation, sync.explanation
