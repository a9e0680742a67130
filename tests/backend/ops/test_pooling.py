"""Average pooling on the device in both eager modes, against torch on the CPU.

EfficientNet's head pool (`nn.AvgPool2d(2560, ceil_mode=True)` on a 1x1 map) failed only in
DEFER_AND_FUSE: the fused program asked for a 125 GiB temporary. These run it, with a backward, in
strict eager and fused, next to the convolution and activation it follows in the model. Final pools
over a whole feature map and the 1d pools (which torch routes through the 2d ops) run the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytest.importorskip("jax")

from backend_helpers import assert_matches_cpu, eager, host  # noqa: E402
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


FINAL_POOLS: dict[str, tuple[tuple[int, ...], Callable[[torch.Tensor], torch.Tensor]]] = {
    "adaptive_avg_pool2d-8x1280x7x7": ((8, 1280, 7, 7), lambda x: torch.nn.functional.adaptive_avg_pool2d(x, 1)),
    "avg_pool2d-k112-8x32x112x112": ((8, 32, 112, 112), lambda x: torch.nn.functional.avg_pool2d(x, 112)),
    "avg_pool1d-k3s2p1-ceil": ((4, 6, 11), lambda x: torch.nn.functional.avg_pool1d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
    "adaptive_avg_pool1d-uneven": ((4, 6, 11), lambda x: torch.nn.functional.adaptive_avg_pool1d(x, 4)),
    "adaptive_avg_pool3d-uneven": ((2, 3, 5, 6, 7), lambda x: torch.nn.functional.adaptive_avg_pool3d(x, (2, 4, 3))),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("name", FINAL_POOLS)
def test_pool_forward_and_backward_match_cpu(mode: EagerMode, name: str) -> None:
    shape, pool = FINAL_POOLS[name]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=generator)
    x_cpu = x.clone().requires_grad_(True)
    out_cpu = pool(x_cpu)
    weights = torch.randn(out_cpu.shape, generator=generator)
    (out_cpu * weights).sum().backward()
    with eager(mode):
        x_tpu = x.to("tpu").requires_grad_(True)
        out_tpu = pool(x_tpu)
        (out_tpu * weights.to("tpu")).sum().backward()
        assert_matches_cpu((out_tpu, x_tpu.grad), (out_cpu, x_cpu.grad), device="tpu")
