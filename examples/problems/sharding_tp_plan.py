"""Planted problem: a tensor-parallel plan that gathers activations. Both linear layers of each
feed-forward block are `ColwiseParallel(output_layouts=Replicate())`, so every layer all-gathers its
output in the forward and all-reduces its input's gradient in the backward. Column-parallel then
row-parallel needs one all-reduce each way.

    tputrace run --nproc 2 examples/problems/sharding_tp_plan.py            # the problem
    tputrace run --nproc 2 examples/problems/sharding_tp_plan.py --fixed    # ColwiseParallel() then RowwiseParallel()
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from common import parse_args, print_final, start_ranks, train

WIDTH, HIDDEN, BLOCKS, BATCH = 128, 512, 2, 32


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=6, fixed_help="ColwiseParallel() for up, RowwiseParallel() for down")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    _, world = start_ranks()
    mesh = init_device_mesh(args.device.split(":")[0], (world,), mesh_dim_names=("tp",))
    model = nn.Sequential(*[FeedForward() for _ in range(BLOCKS)]).to(args.device)
    for block in model:
        if args.fixed:
            plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
        else:
            plan = {
                "up": ColwiseParallel(output_layouts=Replicate()),  # tputrace: problem (gathers the activation)
                "down": ColwiseParallel(output_layouts=Replicate()),
            }
        parallelize_module(block, mesh, plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [torch.randn(BATCH, WIDTH, device=args.device) for _ in range(args.steps)]
    print_final(train(lambda x: model(x).square().mean(), optimizer, batches))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
