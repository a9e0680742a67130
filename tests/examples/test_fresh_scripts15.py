"""Scripts of kinds the other fresh-script tests leave out that read wrong before. Per-step reads told the loss-logging
fix (`accumulate loss.detach()`) where it does not apply: a patch-embedding ViT counting correct predictions with
`correct += (...).sum().item()`, a VAE appending a dict of two `.item()`s to its history, a graph network taking its
graph count with `int(batch.max()) + 1`. A script that runs one forward with autograd on and no loop, told its memory
grew every iteration of a loop. A detector whose box loss runs under `if pos.any():` per image, whose changing ops were
placed at `loss.backward()` and told to replace a random choice."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

VIT_ACCURACY = '''
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    device = "tpu"


    class ViT(nn.Module):
        def __init__(self, dim=32):
            super().__init__()
            self.patch_embed = nn.Conv2d(3, dim, 4, stride=4)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
            self.pos_embed = nn.Parameter(torch.randn(1, 17, dim) * 0.02)
            self.encoder = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
            self.head = nn.Linear(dim, 10)

        def forward(self, x):
            x = self.patch_embed(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
            return self.head(self.encoder(x)[:, 0])


    model = ViT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    correct = 0
    for step in range(8):
        x = torch.randn(16, 3, 16, 16, device=device)
        y = torch.randint(0, 10, (16,), device=device)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        correct += (logits.argmax(-1) == y).sum().item()  {marker}
    print(correct / 128)
'''

VAE_HISTORY = '''
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    device = "tpu"


    class VAE(nn.Module):
        def __init__(self, z=8):
            super().__init__()
            self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.GroupNorm(4, 8), nn.SiLU())
            self.mu = nn.Linear(8 * 8 * 8, z)
            self.logvar = nn.Linear(8 * 8 * 8, z)
            self.dec_in = nn.Linear(z, 8 * 8 * 8)
            self.up = nn.ConvTranspose2d(8, 1, 4, stride=2, padding=1)

        def forward(self, x):
            h = self.enc(x).flatten(1)
            mu, logvar = self.mu(h), self.logvar(h)
            z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
            return torch.sigmoid(self.up(F.silu(self.dec_in(z)).view(-1, 8, 8, 8))), mu, logvar


    model = VAE().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    history = []
    for step in range(8):
        x = torch.rand(16, 1, 16, 16, device=device)
        recon, mu, logvar = model(x)
        rec = F.binary_cross_entropy(recon, x, reduction="sum") / x.shape[0]
        kl = -0.5 * torch.mean(torch.sum(1 + logvar - mu.pow(2) - logvar.exp(), dim=1))
        loss = rec + min(1.0, step / 4) * kl
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append({{"rec": rec.item(), "kl": kl.item()}})  {marker}
    print(history[-1])
'''

GRAPH_COUNT = '''
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    device = "tpu"


    class GNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 16)
            self.out = nn.Linear(16, 3)

        def forward(self, x, edges, batch, num_graphs):
            h = F.relu(self.lin(x))
            h = h + torch.zeros_like(h).index_add_(0, edges[1], h[edges[0]])
            pooled = torch.zeros(num_graphs, h.shape[1], device=h.device).index_add_(0, batch, h)
            return self.out(pooled)


    model = GNN().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(8):
        x = torch.randn(48, 8)
        edges = torch.randint(0, 48, (2, 96))
        batch = torch.arange(4).repeat_interleave(12)
        y = torch.randint(0, 3, (4,))
        x, edges, batch, y = x.to(device), edges.to(device), batch.to(device), y.to(device)
        num_graphs = int(batch.max()) + 1  {marker}
        loss = F.cross_entropy(model(x, edges, batch, num_graphs), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def _read_at(tmp_path: Path, name: str, source: str):
    report, _, line = _run(tmp_path, name, source)
    (read,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "(item)" in read.title, read.title
    return read


def test_a_count_added_up_with_item_is_told_to_sum_on_the_chip(tmp_path: Path) -> None:
    """`correct += (...).sum().item()` reads no loss: the fix makes `correct` a chip total read once after the loop."""
    read = _read_at(tmp_path, "vit_accuracy", VIT_ACCURACY)
    assert read.suggestion.startswith("Keep the running total on the chip"), read.suggestion
    assert "`correct` becomes a tensor on the chip" in read.suggestion and "loss.detach()" not in read.suggestion


def test_two_reads_appended_each_step_are_kept_detached(tmp_path: Path) -> None:
    """A dict of `rec.item()` and `kl.item()` appended each step: both values are named, kept detached and read after
    the loop, where the general fix named a `loss` the line does not read."""
    read = _read_at(tmp_path, "vae_history", VAE_HISTORY)
    assert read.suggestion.startswith("Keep the values on the chip: keep `rec.detach()`, `kl.detach()` in place of "
                                      "`rec.item()`, `kl.item()`"), read.suggestion


def test_a_graph_count_made_a_python_int_is_told_to_come_from_the_host(tmp_path: Path) -> None:
    """`int(batch.max()) + 1` is a size the host data already tells: taken on the host before the copy, not logged."""
    read = _read_at(tmp_path, "graph_count", GRAPH_COUNT)
    assert read.suggestion.startswith("`int(...)` turns a chip value into a Python number"), read.suggestion
    assert "before the data is copied to the chip" in read.suggestion and "loss.detach()" not in read.suggestion


ONE_FORWARD = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256),
                          nn.GELU(), nn.Linear(256, 10)).to("tpu")
    x = torch.randn(512, 64, device="tpu")
    {body}
'''
FORWARD_ONCE = '''logits = model(x)  {marker}
    print(logits.argmax(-1)[:8].tolist())'''
FORWARD_PER_BATCH = '''outs = []
    for batch in range(6):
        outs.append(model(x + batch))  {marker}
    print(torch.stack(outs).argmax(-1)[:, :8].tolist())'''


def test_one_forward_with_autograd_on_is_no_loop_whose_memory_grows(tmp_path: Path) -> None:
    """A script without a loop runs one forward with autograd on: its layers each make a (512, 256) buffer at the
    call's line, all kept for a backward. That is one call, not six iterations of a loop piling up."""
    report, _, _ = _run(tmp_path, "forward_once", ONE_FORWARD.replace("{body}", FORWARD_ONCE))
    assert not [finding for finding in report.findings if finding.analyzer == "memory"], report.findings


def test_the_same_forward_kept_in_a_loop_is_still_growth(tmp_path: Path) -> None:
    """The forward called in a loop, each output kept with its graph: each layer's buffers pile up once per
    iteration, growth at the line that keeps them."""
    report, _, line = _run(tmp_path, "forward_per_batch", ONE_FORWARD.replace("{body}", FORWARD_PER_BATCH))
    (growth,) = [finding for finding in report.findings if finding.analyzer == "memory"]
    assert growth.line == line and "every iteration of a loop without steps" in growth.title, growth.title


DETECTOR = '''
    import torch
    from torch import nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    device = "tpu"
    backbone = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(4)).to(device)
    cls_head, box_head = nn.Conv2d(8, 3, 1).to(device), nn.Conv2d(8, 4, 1).to(device)
    params = [*backbone.parameters(), *cls_head.parameters(), *box_head.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    for step in range(10):
        feats = backbone(torch.randn(3, 3, 16, 16, device=device))
        logits, boxes = cls_head(feats).flatten(2), box_head(feats).flatten(2)
        loss = 0.0
        for i in range(3):
            pos = torch.rand(16, device=device) > 0.95
            labels = torch.where(pos, 1, 0)
            loss = loss + F.cross_entropy(logits[i].T, labels)
            if pos.any():  {marker}
                loss = loss + F.smooth_l1_loss(boxes[i].T[pos], torch.zeros_like(boxes[i].T[pos]))
            else:
                loss = loss + boxes[i].sum() * 0
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_ops_picked_per_image_by_a_branch_on_a_mask_are_placed_at_the_branch(tmp_path: Path) -> None:
    """`if pos.any():` runs the box loss or a zero per image, so the step's graph changes from step to step. The
    recompiles' diffs mostly name `loss.backward()`, whose gradient ops follow the forward's: the finding is at the
    branch that picks the ops, told to run both sides and weight by the mask, not to replace a random choice."""
    report, script, line = _run(tmp_path, "detector", DETECTOR)
    (changes,) = [finding for finding in report.findings if finding.title.startswith("The step's ops change")]
    assert changes.line == line and f"picked by the branch at {script.name}:{line}" in changes.title, changes.title
    assert changes.suggestion.startswith(f"Run both sides of the branch at {script.name}:{line}"), changes.suggestion
    assert "random.random()" not in changes.suggestion
