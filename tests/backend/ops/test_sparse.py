"""Sparse layouts on tpu are held dense: `nn.Embedding(sparse=True)` and `nn.EmbeddingBag(sparse=True)`
train as on the CPU with a dense gradient (torch's sparse gradient crashed the process), and a sparse
tensor moved to the chip arrives dense, each said once in a warning."""

from __future__ import annotations

import warnings

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)


def _train(device: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 4, sparse=True, padding_idx=0).to(device)
    bag = torch.nn.EmbeddingBag(10, 4, mode="mean", sparse=True).to(device)
    optimizer = torch.optim.SGD([*embedding.parameters(), *bag.parameters()], lr=0.5)
    indices = torch.tensor([[1, 2, 2], [0, 3, 9]], device=device)
    for _ in range(2):
        optimizer.zero_grad()
        (embedding(indices).pow(2).sum() + bag(indices).pow(2).sum()).backward()
        optimizer.step()
    return [host(embedding.weight), host(bag.weight), host(embedding.weight.grad)]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_sparse_embedding_gradients_are_dense_and_match_cpu(mode: EagerMode) -> None:
    expected = _train("cpu")
    with eager(mode), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        result = _train("tpu")
    assert not result[2].is_sparse
    for got, want in zip(result, expected):
        assert torch.allclose(got, want.to_dense(), atol=1e-6), (got - want.to_dense()).abs().max()


def test_sparse_tensor_moved_to_chip_is_dense() -> None:
    sparse = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        on_chip = sparse.to("tpu")
    assert on_chip.layout == torch.strided and host(on_chip).tolist() == [1.0, 0.0, 2.0, 0.0]


def test_sparse_layout_factory_is_one_line_error() -> None:
    with pytest.raises(RuntimeError, match="not supported on tpu .*to_dense"):
        torch.empty((3,), layout=torch.sparse_coo, device="tpu")


def _sparse_adam(device: str, maximize: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(30, 4, sparse=True, padding_idx=0).to(device)
    bag = torch.nn.EmbeddingBag(30, 3, mode="sum", sparse=True).to(device)
    optimizer = torch.optim.SparseAdam([*embedding.parameters(), *bag.parameters()], lr=0.1, maximize=maximize)
    draws = torch.Generator().manual_seed(1)
    for _ in range(4):
        indices = torch.randint(0, 30, (3, 4), generator=draws).to(device)
        optimizer.zero_grad()
        (embedding(indices).sum(-1).pow(2).mean() + bag(indices).pow(3).sum()).backward()
        optimizer.step()
    return [host(embedding.weight), host(bag.weight)] + [host(value) for value in optimizer.state[embedding.weight].values()
                                                          if isinstance(value, torch.Tensor)]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("maximize", [False, True])
def test_sparse_adam_steps_on_the_dense_gradient_as_on_the_sparse_one(mode: EagerMode, maximize: bool) -> None:
    """`SparseAdam` refuses a dense gradient; on tpu it updates the rows looked up (those whose gradient is
    nonzero), which is what the CPU's sparse gradient updates: values and moments match, rows never looked up
    stay as they were."""
    expected = _sparse_adam("cpu", maximize)
    with eager(mode), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        result = _sparse_adam("tpu", maximize)
    assert len(result) == len(expected) == 4
    for got, want in zip(result, expected):
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
