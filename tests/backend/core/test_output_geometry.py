"""An op's output tensor starts with its interned geometry (from its output spec, per chip): it must be
the geometry its own metadata gives, for shapes with empty and size-1 dims too, so that views of it
(which read the geometry, not the metadata) see what torch sees. Values match the CPU."""

from __future__ import annotations

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core.views import geometry

SHAPES = [(), (5,), (3, 4), (2, 1, 3), (1, 1), (0, 3), (3, 0, 2), (2, 3, 1, 4)]


@pytest.mark.parametrize("mode", [EagerMode.DEFER_AND_FUSE, EagerMode.DEFER_NEVER], ids=lambda mode: mode.name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_an_outputs_geometry_is_the_one_its_metadata_gives(mode: EagerMode, shape: tuple[int, ...]) -> None:
    with eager(mode):
        values = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
        output = values.to("tpu") * 2
        assert output._geom is geometry(tuple(output.shape), tuple(output.stride()), output.storage_offset(), output.dtype, output._buf.chip)
        if output.dim() >= 2:
            assert torch.equal(host(output.transpose(0, 1).reshape(-1)), (values * 2).transpose(0, 1).reshape(-1))
        assert torch.equal(host(output.view(-1)), (values * 2).view(-1))


def test_each_output_of_a_multi_output_op_has_its_own_geometry() -> None:
    with eager(EagerMode.DEFER_AND_FUSE):
        values = torch.randn(4, 6)
        maxima, indices = torch.max(values.to("tpu"), dim=1)
        for output in (maxima, indices):
            assert output._geom is geometry(tuple(output.shape), tuple(output.stride()), 0, output.dtype, output._buf.chip)
        expected = torch.max(values, dim=1)
        assert torch.equal(host(maxima), expected.values) and torch.equal(host(indices), expected.indices)
