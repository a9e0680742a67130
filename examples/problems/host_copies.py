"""Planted problem: host-to-chip copies in the loop. The causal mask and the position table are
built on the host and copied to the chip again in every step.

    tputrace run examples/problems/host_copies.py            # built on the host each step
    tputrace run examples/problems/host_copies.py --fixed    # built on the chip once, before the loop
"""

from __future__ import annotations

import math

import torch
from torch import nn

from common import parse_args, print_final, train

SEQ, WIDTH, BATCH = 512, 32, 2


def causal_mask_and_positions(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.full((SEQ, SEQ), float("-inf")).triu(1)
    angles = torch.arange(SEQ).unsqueeze(1) / (10_000 ** (torch.arange(0, WIDTH, 2) / WIDTH))
    positions = torch.cat([angles.sin(), angles.cos()], dim=1)
    return mask.to(device), positions.to(device)  # tputrace: problem (two host-built constants copied every step)


class CausalMixer(nn.Module):
    """One causal self-attention layer without heads, then a projection."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x + positions).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / math.sqrt(WIDTH) + mask
        return self.proj(scores.softmax(dim=-1) @ v)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=10, fixed_help="build the mask and positions once, on the chip")
    model = CausalMixer().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    inputs = torch.randn(BATCH, SEQ, WIDTH).to(args.device)
    constants = causal_mask_and_positions(args.device) if args.fixed else None

    def loss_of(_: int) -> torch.Tensor:
        mask, positions = constants if constants is not None else causal_mask_and_positions(args.device)
        out = model(inputs, mask, positions)
        return (out[:, 1:] - inputs[:, :-1]).pow(2).mean()

    print_final(train(loss_of, optimizer, range(args.steps)))


if __name__ == "__main__":
    main()
