"""Test data (not an example): a row-parallel product whose partial sums two pointwise ops each
reduce (two all-reduces of the same value). Marked line: TWICE (the second op's line)."""

import sys

import torch
import torch.distributed as dist
import tputrace.backend  # noqa: F401
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

if "--fuse" in sys.argv:
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
dist.init_process_group("tpu")
world = dist.get_world_size()
mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("model",))
torch.manual_seed(0)
inner = nn.Parameter(distribute_tensor(torch.randn(64, 32 * world, device="tpu") / 8, mesh, [Shard(1)]))
outer = nn.Parameter(distribute_tensor(torch.randn(32 * world, 64, device="tpu") / 8, mesh, [Shard(0)]))
optimizer = torch.optim.SGD([inner, outer], lr=0.01)
for _ in range(5):
    features = DTensor.from_local(torch.randn(24, 64, device="tpu"), mesh, [Replicate()], run_check=False)
    summed = torch.relu(features @ inner) @ outer  # Partial: each rank holds a partial sum
    gate = torch.sigmoid(summed)
    value = torch.tanh(summed)  # TWICE
    loss = (gate * value).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(loss.full_tensor().item())
dist.destroy_process_group()
