"""Test data (not an example): a block whose plan shards the feed-forward pair but leaves the large
output head out (replicated on every rank), and whose forward all-reduces the row-parallel output by
hand although the plan already reduced it. Marked lines: PLAN (the plan), AGAIN (the all-reduce)."""

import sys

import torch
import torch.distributed as dist
import tputrace.backend  # noqa: F401
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

if "--fuse" in sys.argv:
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 256)
        self.down = nn.Linear(256, 64)
        self.head = nn.Linear(64, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.down(torch.relu(self.up(x)))
        dist.all_reduce(hidden)  # AGAIN
        return self.head(hidden / dist.get_world_size())


dist.init_process_group("tpu")
mesh = init_device_mesh("tpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
torch.manual_seed(0)
model = Block().to("tpu")
parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})  # PLAN
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
for _ in range(5):
    loss = model(torch.randn(8, 64, device="tpu")).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(loss.item())
dist.destroy_process_group()
