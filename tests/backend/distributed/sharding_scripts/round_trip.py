"""Test data (not an example): a data-sharded activation gathered to Replicate for a pointwise op and
split back to the same Shard, every step. Marked lines: GATHER (the line to change), SPLIT."""

import sys

import torch
import torch.distributed as dist
import tputrace.backend  # noqa: F401
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

if "--fuse" in sys.argv:
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
dist.init_process_group("tpu")
world = dist.get_world_size()
mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("data",))
torch.manual_seed(0)
weight = torch.nn.Parameter(distribute_tensor(torch.randn(96, 96, device="tpu") / 10, mesh, [Replicate()]))
optimizer = torch.optim.SGD([weight], lr=0.01)
for _ in range(5):
    tokens = DTensor.from_local(torch.randn(16, 96, device="tpu"), mesh, [Shard(0)], run_check=False)
    hidden = tokens @ weight
    whole = hidden.redistribute(mesh, [Replicate()])  # GATHER
    whole = torch.nn.functional.gelu(whole)
    hidden = whole.redistribute(mesh, [Shard(0)])  # SPLIT
    loss = (hidden @ weight).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(loss.full_tensor().item())
dist.destroy_process_group()
