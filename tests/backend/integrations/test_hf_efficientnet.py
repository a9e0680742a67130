"""A tiny random Hugging Face EfficientNet (built from a config, no hub access) on tpu against the same
weights on the CPU. Its head pool is `nn.AvgPool2d(hidden_dim, ceil_mode=True)`, a window far wider
than the final feature map: gathering every window made DEFER_AND_FUSE's fused program ask for a
125 GiB temporary at the default width. Logits, loss and every gradient must match the CPU in both
eager modes."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import transformers

from backend_helpers import assert_matches_cpu, eager
from tputrace.backend.compat.device_module import EagerMode

logging.getLogger("transformers").setLevel(logging.ERROR)

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
LABELS = 5


def _tiny_efficientnet() -> transformers.EfficientNetForImageClassification:
    """hidden_dim is the top convolution's width (1280 x width_coefficient) and the head pool's kernel."""
    config = transformers.EfficientNetConfig(
        image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, num_labels=LABELS,
        kernel_sizes=[3, 3, 5], in_channels=[32, 16, 24], out_channels=[16, 24, 40], strides=[1, 2, 2],
        num_block_repeats=[1, 1, 1], expand_ratios=[1, 6, 6], dropout_rate=0.0, drop_connect_rate=0.0,
    )
    torch.manual_seed(0)
    return transformers.EfficientNetForImageClassification(config)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_efficientnet_forward_and_backward_match_the_cpu(mode: EagerMode) -> None:
    cpu_model = _tiny_efficientnet()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randn(2, 3, 32, 32, generator=generator)
    labels = torch.randint(0, LABELS, (2,), generator=generator)
    cpu_out = cpu_model(pixel_values=pixels, labels=labels)
    cpu_out.loss.backward()
    with eager(mode):
        tpu_out = tpu_model(pixel_values=pixels.to("tpu"), labels=labels.to("tpu"))
        tpu_out.loss.backward()
        assert_matches_cpu((tpu_out.logits, tpu_out.loss), (cpu_out.logits, cpu_out.loss), atol=1e-4, rtol=1e-4)
        for (name, cpu_parameter), tpu_parameter in zip(cpu_model.named_parameters(), tpu_model.parameters()):
            assert_matches_cpu(tpu_parameter.grad, cpu_parameter.grad, atol=1e-4, rtol=1e-3, what=f"{name}.grad")
