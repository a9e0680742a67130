"""Planted problem: large float32 matmuls. The TPU's MXU multiplies bfloat16; float32 products at
PyTorch's default precision take several passes.

    tputrace run examples/problems/fp32_matmul.py            # float32
    tputrace run examples/problems/fp32_matmul.py --fixed    # forward under bfloat16 autocast
"""

from __future__ import annotations

import argparse
import contextlib

import torch
from torch import nn

WIDTH, BATCH, CLASSES = 768, 768, 256


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, WIDTH)
        self.fc2 = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))  # tputrace: problem (768 x 768 x 768 products in float32)
        h = torch.relu(self.fc2(h))
        return self.out(h)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--fixed", action="store_true", help="run the forward pass under bfloat16 autocast")
    args = parser.parse_args()
    if args.device.startswith("tpu"):
        import tputrace.backend  # noqa: F401 - registers the tpu device
    torch.manual_seed(0)
    device_type = args.device.split(":")[0]
    model = Net().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    inputs = torch.randn(BATCH, WIDTH).to(args.device)
    labels = torch.randint(0, CLASSES, (BATCH,)).to(args.device)
    losses = []
    for _ in range(args.steps):
        autocast = torch.autocast(device_type, dtype=torch.bfloat16) if args.fixed else contextlib.nullcontext()
        with autocast:
            logits = model(inputs)
        loss = nn.functional.cross_entropy(logits.float(), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    print(f"{args.steps} steps, final loss {losses[-1].item():.4f}")


if __name__ == "__main__":
    main()
