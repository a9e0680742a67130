"""An optimizer's first step over a channels-last model in DeferAndFuse: the state it makes (`zeros_like` of a
channels-last weight) is stored in the weight's storage order by an op that reads the new value before any buffer
holds it, so running the state made for that op keeps the value. The loop ran to an error in the first step before;
its losses and weights now match the same loop on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from backend_helpers import assert_matches_cpu, eager, host
from tputrace.backend.compat.device_module import EagerMode

OPTIMIZERS = {
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2),
    "adamw_foreach_off": lambda params: torch.optim.AdamW(params, lr=1e-2, foreach=False),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
    "rmsprop": lambda params: torch.optim.RMSprop(params, lr=1e-3),
}


def _train(device: str, make_optimizer) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10))
    model = model.to(device, memory_format=torch.channels_last)
    optimizer = make_optimizer(model.parameters())
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):
        x = torch.randn(4, 1, 8, 8, generator=generator).to(device).to(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (4,), generator=generator).to(device)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {name: host(value) for name, value in model.state_dict().items()}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_channels_last_models_first_optimizer_step_matches_the_cpu(name: str) -> None:
    with eager(EagerMode.DEFER_AND_FUSE):
        losses, weights = _train("tpu", OPTIMIZERS[name])
    expected_losses, expected_weights = _train("cpu", OPTIMIZERS[name])
    assert_matches_cpu(losses, expected_losses, atol=1e-4, rtol=1e-4, what="losses")
    assert_matches_cpu(weights, expected_weights, atol=1e-4, rtol=1e-4, what="weights")
