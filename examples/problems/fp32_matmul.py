"""Planted problem: large float32 matmuls. The TPU's MXU multiplies bfloat16; float32 products at
PyTorch's default precision take several passes.

    tputrace run examples/problems/fp32_matmul.py            # float32
    tputrace run examples/problems/fp32_matmul.py --fixed    # forward under bfloat16 autocast
    --scale K multiplies every size by K (e.g. 8 on a GPU)
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from common import parse_args, print_final, train

WIDTH, BATCH, CLASSES = 768, 768, 256


class Net(nn.Module):
    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))  # tputrace: problem (768 x 768 x 768 products in float32)
        h = torch.relu(self.fc2(h))
        return self.out(h)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=8, fixed_help="run the forward pass under bfloat16 autocast",
                      scalable=True)
    width, batch, classes = WIDTH * args.scale, BATCH * args.scale, CLASSES * args.scale
    model = Net(width, classes).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    inputs = torch.randn(batch, width).to(args.device)
    labels = torch.randint(0, classes, (batch,)).to(args.device)

    def loss_of(_: int) -> torch.Tensor:
        autocast = torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16) if args.fixed else contextlib.nullcontext()
        with autocast:
            logits = model(inputs)
        return nn.functional.cross_entropy(logits.float(), labels)

    print_final(train(loss_of, optimizer, range(args.steps)))


if __name__ == "__main__":
    main()
