"""Planted problem: a 2-D mesh (FSDP2 over "dp", tensor parallelism over "tp") whose plan makes both
linear layers of the block column-parallel with replicated outputs, so each all-gathers its activation
over "tp" every forward; FSDP2 shards the parameters over "dp" on top. The fixed plan is
column-parallel then row-parallel.

    tputrace run --nproc 4 examples/problems/sharding_2d_mesh.py            # the problem (a 2x2 mesh)
    tputrace run --nproc 4 examples/problems/sharding_2d_mesh.py --fixed    # ColwiseParallel() then RowwiseParallel()
    tputrace run --nproc 2 examples/problems/sharding_2d_mesh.py            # a 1x2 mesh (no data parallelism)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from common import parse_args, print_final, start_ranks, train

WIDTH, HIDDEN, BATCH = 128, 512, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=6, fixed_help="ColwiseParallel() for fc1, RowwiseParallel() for fc2")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    rank, world = start_ranks()
    tp = 2 if world % 2 == 0 else 1
    mesh = init_device_mesh(args.device.split(":")[0], (world // tp, tp), mesh_dim_names=("dp", "tp"))
    model = nn.Sequential(Block(), Block()).to(args.device)
    for block in model:
        if args.fixed:
            plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
        else:
            plan = {
                "fc1": ColwiseParallel(output_layouts=Replicate()),  # tputrace: problem (gathers the activation over "tp")
                "fc2": ColwiseParallel(output_layouts=Replicate()),
            }
        parallelize_module(block, mesh["tp"], plan)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank // tp)  # the ranks of one "tp" group see the same batch
    batches = [torch.randn(BATCH, WIDTH, generator=generator).to(args.device) for _ in range(args.steps)]
    print_final(train(lambda x: model(x).square().mean(), optimizer, batches))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
