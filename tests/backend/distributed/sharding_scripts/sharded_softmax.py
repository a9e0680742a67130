"""Test data (not an example): attention-like scores from a column-parallel projection kept as a DTensor
sharded on its last dim, then a softmax over that dim, so DTensor all-gathers the scores every call
before the softmax. Marked line: SOFTMAX (the op that gathers)."""

import sys

import torch
import torch.distributed as dist
import tputrace.backend  # noqa: F401
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

if "--fuse" in sys.argv:
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)


class Scorer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(96, 384)
        self.value = nn.Linear(384, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.score(x), dim=-1)  # SOFTMAX
        return self.value(weights.full_tensor())


dist.init_process_group("tpu")
mesh = init_device_mesh("tpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = Scorer().to("tpu")
parallelize_module(model, mesh, {"score": ColwiseParallel(use_local_output=False)})  # PLAN
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
for _ in range(5):
    loss = model(torch.randn(32, 96, device="tpu")).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(loss.item())
dist.destroy_process_group()
