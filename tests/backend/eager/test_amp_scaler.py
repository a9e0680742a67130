"""`torch.amp.GradScaler` on tpu: unscaling with the overflow check and the scale update match the
CPU's, an overflowing step is skipped, and the scale grows after `growth_interval` good steps."""

from __future__ import annotations

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)


def _train(device: str) -> tuple[list[float], list[torch.Tensor], list[float]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
    generator = torch.Generator().manual_seed(1)
    scales, losses = [], []
    for step in range(6):
        inputs, labels = torch.randn(4, 8, generator=generator), torch.randint(0, 3, (4,), generator=generator)
        if step == 3:
            inputs[0, 0] = float("inf")  # this step's gradients overflow: skipped, the scale backs off
        loss = torch.nn.functional.cross_entropy(model(inputs.to(device)), labels.to(device))
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=False)
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
        losses.append(loss.item())
    return scales, [host(parameter) for parameter in model.parameters()], losses


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_grad_scaler_matches_cpu(mode: EagerMode) -> None:
    want_scales, want_parameters, want_losses = _train("cpu")
    with eager(mode):
        scales, parameters, losses = _train("tpu")
    assert scales == want_scales == [1024.0, 2048.0, 2048.0, 1024.0, 1024.0, 2048.0]
    assert losses[:3] == pytest.approx(want_losses[:3], abs=1e-5)
    for got, want in zip(parameters, want_parameters):
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_unscale_writes_gradients_and_found_inf(mode: EagerMode) -> None:
    grads_cpu = [torch.tensor([2.0, 4.0]), torch.tensor([[8.0, float("nan")]])]
    with eager(mode):
        grads = [grad.to("tpu") for grad in grads_cpu]
        found_inf = torch.zeros(1, device="tpu")
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, torch.full((1,), 0.5, device="tpu"))
        assert host(found_inf).tolist() == [1.0]
        assert host(grads[0]).tolist() == [1.0, 2.0]
        assert host(grads[1])[0, 0].item() == 4.0
        growth_tracker = torch.zeros(1, dtype=torch.int32, device="tpu")
        scale = torch.full((1,), 8.0, device="tpu")
        returned = torch._amp_update_scale_(scale, growth_tracker, torch.zeros(1, device="tpu"), 2.0, 0.5, 1)
        assert returned is scale
        assert host(scale).tolist() == [16.0] and host(growth_tracker).tolist() == [0]
