"""Scripts of kinds that read wrong before: models whose shapes cycle through a small fixed set, each shape compiled
once and then reused from the program cache (multi-task heads of three widths, a U-Net over three image sizes, a
sampler bucketing sequences into three lengths: each was called a recompile storm, costed per step), beside a
length that keeps being new (a storm still); a flattened 28x28 image's 784 features told to become 768 (a size the
data fixes); one line copying tensors of fixed, different sizes called a copy of varying sizes."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_scripts import _run

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
