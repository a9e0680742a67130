"""Scripts of kinds that read wrong before: models whose shapes cycle through a small fixed set, each shape compiled
once and then reused from the program cache (multi-task heads of three widths, a U-Net over three image sizes, a
sampler bucketing sequences into three lengths: each was called a recompile storm, costed per step), beside a
length that keeps being new (a storm still); a flattened 28x28 image's 784 features told to become 768 (a size the
data fixes); one line copying tensors of fixed, different sizes called a copy of varying sizes."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

from tputrace.analysis import Report

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

MULTI_TASK = '''
    import random

    import torch
    from torch import nn

    torch.manual_seed(0)
    random.seed(0)
    WIDTHS = {{"binary": 1, "stars": 5, "topic": 10}}


    class MultiTask(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(64, 128), nn.ReLU())
            self.heads = nn.ModuleDict({{task: nn.Linear(128, width) for task, width in WIDTHS.items()}})

        def forward(self, x, task):
            return self.heads[task](self.body(x))


    model = MultiTask().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(16):
        task = random.choice(list(WIDTHS))
        x = torch.randn(32, 64, device="tpu")
        target = torch.randn(32, WIDTHS[task], device="tpu")
        loss = nn.functional.mse_loss(model(x, task), target)  {marker}
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

UNET = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    SIZES = (32, 48, 64)


    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())


    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.down1, self.down2 = block(3, 8), block(8, 16)
            self.pool = nn.MaxPool2d(2)
            self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
            self.dec = block(16, 8)
            self.out = nn.Conv2d(8, 1, 1)

        def forward(self, x):
            d1 = self.down1(x)
            d2 = self.down2(self.pool(d1))
            return self.out(self.dec(torch.cat([self.up(d2), d1], 1)))


    model = UNet().to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(15):
        size = SIZES[step % len(SIZES)]
        x = torch.randn(4, 3, size, size).to("tpu")  {marker}
        mask = (torch.rand(4, 1, size, size) > 0.5).float().to("tpu")
        loss = nn.functional.binary_cross_entropy_with_logits(model(x), mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

BUCKETED = '''
    import random

    import torch
    from torch import nn

    torch.manual_seed(0)
    random.seed(0)
    BUCKETS = (16, 32, 64)
    emb = nn.Embedding(100, 32).to("tpu")
    rnn = nn.GRU(32, 32, batch_first=True).to("tpu")
    head = nn.Linear(32, 2).to("tpu")
    params = [*emb.parameters(), *rnn.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    for step in range(15):
        length = random.choice(BUCKETS)
        tokens = torch.randint(0, 100, (8, length)).to("tpu")  {marker}
        labels = torch.randint(0, 2, (8,)).to("tpu")
        out, _ = rnn(emb(tokens))
        loss = nn.functional.cross_entropy(head(out[:, -1]), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

NEW_LENGTHS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    emb = nn.Embedding(100, 32).to("tpu")
    head = nn.Linear(32, 2).to("tpu")
    opt = torch.optim.Adam([*emb.parameters(), *head.parameters()], lr=1e-3)
    for step in range(15):
        length = 10 + 3 * step
        tokens = torch.randint(0, 100, (8, length)).to("tpu")  {marker}
        labels = torch.randint(0, 2, (8,)).to("tpu")
        loss = nn.functional.cross_entropy(head(emb(tokens).mean(1)), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

EIGHT_LENGTHS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    LENGTHS = (8, 12, 16, 20, 24, 28, 32, 36)
    emb = nn.Embedding(100, 32).to("tpu")
    head = nn.Linear(32, 2).to("tpu")
    opt = torch.optim.Adam([*emb.parameters(), *head.parameters()], lr=1e-3)
    for step in range(24):
        length = LENGTHS[step % len(LENGTHS)]
        tokens = torch.randint(0, 100, (8, length)).to("tpu")  {marker}
        labels = torch.randint(0, 2, (8,)).to("tpu")
        loss = nn.functional.cross_entropy(head(emb(tokens).mean(1)), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

MNIST_MLP = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 300), nn.ReLU(), nn.Linear(300, 10)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(8):
        x = torch.randn(128, 1, 28, 28).to("tpu")
        y = torch.randint(0, 10, (128,)).to("tpu")
        loss = nn.functional.cross_entropy(model(x), y)  {marker}
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

FOUR_COPIES = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(64, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 64), torch.randn(256, 4)
    w, m = torch.rand(256), torch.ones(256, 1)
    for step in range(8):
        xd, yd, wd, md = x.to("tpu"), y.to("tpu"), w.to("tpu"), m.to("tpu")  {marker}
        loss = ((model(xd) - yd) ** 2 * wd[:, None] * md).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def _settled_sizes(report: Report, sizes: str) -> None:
    """No storm: one info finding that the sizes were compiled once each, a one-time cost with none per step."""
    recompiles = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert not [finding for finding in recompiles if finding.title.startswith("Recompilation storm")], recompiles
    (settled,) = recompiles
    assert settled.severity == "info" and settled.cost_per_step_ns is None, settled.title
    assert settled.title.startswith("3 sizes compiled once each") and f"took sizes {sizes}" in settled.title, settled.title
    assert "one-time compile cost" in settled.explanation and "Pad" not in settled.suggestion, settled.suggestion


@pytest.mark.parametrize(("name", "source", "sizes"), [
    ("multi_task", MULTI_TASK, "1, 5, 10"),
    ("unet", UNET, "32, 48, 64"),
    ("bucketed", BUCKETED, "16, 32, 64"),
], ids=["multi_task", "unet", "bucketed"])
def test_shapes_cycling_through_a_fixed_set_compiled_once_each_are_no_storm(tmp_path: Path, name: str, source: str,
                                                                             sizes: str) -> None:
    """Heads of widths 1/5/10 picked at random, a U-Net over images of 3 sizes in turn, batches of 3 bucketed
    lengths: each size compiles once in the first steps and the later steps run its program from the program cache.
    That is bucketing working: a one-time cost, not a storm told to pad (it was critical for the U-Net)."""
    report, _, _ = _run(tmp_path, name, source)
    _settled_sizes(report, sizes)


def test_a_length_that_keeps_being_new_stays_a_storm(tmp_path: Path) -> None:
    """Each step's batch is a new length and compiles to the end of the run: still a storm, told to bucket."""
    report, _, line = _run(tmp_path, "new_lengths", NEW_LENGTHS)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert storm.title.startswith("Recompilation storm") and storm.line == line, storm.title
    assert storm.severity != "info" and "Pad" in storm.suggestion, storm.suggestion


def test_many_lengths_each_compiled_once_stay_a_storm(tmp_path: Path) -> None:
    """Eight lengths in turn, each compiled once and reused after: more sizes than a bucketing's few, so still a
    storm whose advice (pad to a few buckets) saves compiles."""
    report, _, line = _run(tmp_path, "eight_lengths", EIGHT_LENGTHS)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert storm.title.startswith("Recompilation storm") and storm.line == line, storm.title
    assert "Pad" in storm.suggestion, storm.suggestion


def test_a_flattened_images_features_are_the_inputs_size_not_a_size_to_change(tmp_path: Path) -> None:
    """784 is 28x28 flattened: the data fixes it, so it is told as the input's size and its cost, with no size to use
    instead; the hidden size 300, the model's choice, is still told to become a multiple of the MXU."""
    report, _, _ = _run(tmp_path, "mnist_mlp", MNIST_MLP)
    padding = {finding.title.split(" is off")[0]: finding for finding in report.findings if finding.analyzer == "padding"}
    features = padding["Tile padding: input features 784"]
    assert "768" not in features.suggestion and "f32[128,1,28,28]" in features.suggestion, features.suggestion
    assert "padded to 1024" in features.explanation, features.explanation
    assert padding["Tile padding: dim 300"].suggestion.startswith("Use 256 (or 512) instead of 300"), padding


def test_one_line_copying_tensors_of_fixed_sizes_is_not_called_varying(tmp_path: Path) -> None:
    """Four tensors, each the same size every step, copied on one line: fixed sizes, listed, not 'varying sizes'."""
    report, _, line = _run(tmp_path, "four_copies", FOUR_COPIES)
    (copies,) = [finding for finding in report.findings if finding.analyzer == "transfers" and finding.line == line]
    assert "4 tensors of fixed sizes" in copies.explanation and "varying" not in copies.explanation, copies.explanation
    assert "fixed sizes 1.00 KiB, 1.00 KiB, 4.00 KiB, 64.0 KiB" in copies.evidence[0].text, copies.evidence[0].text
