"""Average pooling on the device in both eager modes, against torch on the CPU.

EfficientNet's head pool (`nn.AvgPool2d(2560, ceil_mode=True)` on a 1x1 map) failed only in
DEFER_AND_FUSE: the fused program asked for a 125 GiB temporary. These run it, with a backward, in
strict eager and fused, next to the convolution and activation it follows in the model.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("jax")

from backend_helpers import eager, host  # noqa: E402
from tputrace.backend.compat.device_module import EagerMode  # noqa: E402

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]


def _head(channels: int, kernel: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(8, channels, 1), torch.nn.SiLU(), torch.nn.AvgPool2d(kernel, ceil_mode=True), torch.nn.Flatten())


def _forward_backward(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    out = model(x)
    (out * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum().backward()
    return host(out), host(x.grad), host(model[0].weight.grad)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("size, kernel", [(1, 2560), (7, 7), (5, 3)])
def test_head_pool_matches_cpu(mode: EagerMode, size: int, kernel: int) -> None:
    x = torch.randn(2, 8, size, size)
    expected = _forward_backward(_head(2560, kernel), x)
    with eager(mode):
        actual = _forward_backward(_head(2560, kernel).to("tpu"), x.to("tpu"))
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
