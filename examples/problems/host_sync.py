"""Planted problem: a host sync every step. `.item()` on the loss makes the host wait for the chip
before it can queue the next step.

    tputrace run examples/problems/host_sync.py            # the problem
    tputrace run examples/problems/host_sync.py --fixed    # the loss stays on the chip until the end
"""

from __future__ import annotations

import torch
from torch import nn

from common import parse_args

WIDTH, BATCH, CLASSES = 512, 256, 16


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=10, fixed_help="accumulate the loss on the chip, read it once")
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                          nn.Linear(WIDTH, CLASSES)).to(args.device)
    # The fix's running sum, made before the optimizer, whose constructor runs the set-up still pending.
    total = torch.zeros((), device=args.device) if args.fixed else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    inputs = torch.randn(BATCH, WIDTH).to(args.device)
    labels = torch.randint(0, CLASSES, (BATCH,)).to(args.device)
    running = 0.0
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        if args.fixed:
            total = total + loss.detach()  # before the step: the sum runs in the step's program
        optimizer.step()
        if not args.fixed:
            running += loss.item()  # tputrace: problem (waits for the chip every step)
    mean = total.item() / args.steps if args.fixed else running / args.steps
    print(f"{args.steps} steps, mean loss {mean:.4f}")


if __name__ == "__main__":
    main()
