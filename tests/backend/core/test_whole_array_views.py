"""A dense view that is its buffer's whole array (`w.t().t()`, a linear weight's gradient) reads and
writes the array with no op in the pending graph; views whose values differ (a conjugate) or that
mark a data-dependent cut keep their chains. Values match the CPU either way."""

from __future__ import annotations

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core.dispatch import dispatcher


def _pending_ops() -> int:
    return sum(len(graph.nodes) for graph in dispatcher.executor.graphs.values())


@pytest.mark.parametrize("mode", [EagerMode.DEFER_AND_FUSE, EagerMode.DEFER_NEVER], ids=lambda mode: mode.name)
def test_a_transpose_of_a_transpose_is_the_array_and_writes_through(mode: EagerMode) -> None:
    with eager(mode):
        weight = torch.arange(12.0).reshape(4, 3).to("tpu")
        same = weight.t().t()
        assert same._view is None and same._buf is weight._buf
        same.mul_(2)
        assert torch.equal(host(weight), torch.arange(12.0).reshape(4, 3) * 2)
        assert weight.t()._view is not None  # a transposed view is no whole array


def test_a_linear_weights_gradient_is_read_and_written_with_no_op() -> None:
    with eager(EagerMode.DEFER_AND_FUSE):
        torch.manual_seed(0)
        layer = torch.nn.Linear(3, 4)
        inputs = torch.randn(5, 3)
        layer(inputs).sum().backward()
        expected = layer.weight.grad * 0.5
        chip_layer = torch.nn.Linear(3, 4).to("tpu")
        chip_layer.load_state_dict(layer.state_dict())
        chip_layer(inputs.to("tpu")).sum().backward()
        grad = chip_layer.weight.grad
        assert grad._view is None
        torch.tpu.synchronize()
        grad.mul_(0.5)
        assert _pending_ops() == 1  # the multiply, and no view read or write around it
        assert torch.allclose(host(grad), expected)


def test_value_changing_and_cut_views_keep_their_chains() -> None:
    with eager(EagerMode.DEFER_AND_FUSE):
        values = torch.randn(3, 3, dtype=torch.complex64)
        conjugate = values.to("tpu").conj()
        assert conjugate._view is not None
        assert torch.equal(host(conjugate.resolve_conj()), values.conj().resolve_conj())
        narrowed = torch.arange(6.0).to("tpu").narrow(0, 0, 6)
        assert narrowed._view is not None
