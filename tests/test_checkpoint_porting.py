"""Checkpoints and host data in a training script ported from CUDA, compared with the same code on the
CPU: `torch.save` of tpu tensors keeps views and tied weights sharing one storage, every kind of
`map_location` (a callable included), legacy-format files, resuming AdamW training, and
`torch.tensor` of a list of 0-dim tpu tensors."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
# Where a checkpoint saved on tpu:0 loads, as one saved on cuda:0 would: the storages keep their device
# tag, a dict maps the tag, a callable that returns the storage keeps the host copy.
LOCATIONS = (
    (None, "tpu"),
    ("tpu", "tpu"),
    ("tpu:0", "tpu"),
    (torch.device("tpu"), "tpu"),
    ("cpu", "cpu"),
    (torch.device("cpu"), "cpu"),
    ({"tpu:0": "cpu"}, "cpu"),
    ({"cpu": "tpu"}, "tpu"),
    (lambda storage, location: storage, "cpu"),
)


def _round_trip(saved: Any, legacy: bool = False, **load_kwargs: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(saved, buffer, _use_new_zipfile_serialization=not legacy)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


def _location_id(location: object) -> str:
    return "callable" if callable(location) else str(location)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize(("location", "device_type"), LOCATIONS, ids=[_location_id(location) for location, _ in LOCATIONS])
def test_saved_view_still_views_its_base_after_load(mode: EagerMode, weights_only: bool, location: object, device_type: str) -> None:
    source = torch.randn(4, 3)
    expected = _round_trip({"a": source, "b": source[1:]}, weights_only=weights_only)
    with torch.no_grad():
        expected["a"][1, 0] = 100.0
    with eager(mode):
        on_chip = source.to("tpu")
        loaded = _round_trip({"a": on_chip, "b": on_chip[1:]}, map_location=location, weights_only=weights_only)
        assert {loaded["a"].device.type, loaded["b"].device.type} == {device_type}
        with torch.no_grad():
            loaded["a"][1, 0] = 100.0
        assert torch.equal(host(loaded["b"]), expected["b"]), "b is no longer a view of a"
        assert loaded["b"].storage_offset() == expected["b"].storage_offset() == 3


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_tied_weights_saved_on_chip_stay_tied_on_host_and_chip(mode: EagerMode) -> None:
    torch.manual_seed(0)
    with eager(mode):
        embedding = torch.nn.Embedding(5, 3).to("tpu")
        head = torch.nn.Linear(3, 5, bias=False).to("tpu")
        head.weight = embedding.weight
        saved = {"embedding": embedding.state_dict(), "head": head.state_dict()}
        on_host = _round_trip(saved, map_location=lambda storage, location: storage)
        assert on_host["embedding"]["weight"].data_ptr() == on_host["head"]["weight"].data_ptr()
        assert torch.equal(on_host["head"]["weight"], host(embedding.weight))
        on_chip = _round_trip(saved)
        on_chip["embedding"]["weight"].add_(1.0)
        assert torch.equal(host(on_chip["head"]["weight"]), host(embedding.weight) + 1.0)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("saved_on", ["cpu", "tpu"])
def test_legacy_format_checkpoint_loads_onto_chip(mode: EagerMode, saved_on: str) -> None:
    """torch reads a legacy file's bytes after it rebuilt the tensors; the chip copies must get them."""
    source = torch.arange(12.0).view(3, 4)
    with eager(mode):
        base = source.to(saved_on)
        loaded = _round_trip({"a": base, "b": base.t()[1:]}, legacy=True, map_location="tpu")
        assert torch.equal(host(loaded["a"]), source) and torch.equal(host(loaded["b"]), source.t()[1:])
        loaded["a"].add_(1.0)
        assert torch.equal(host(loaded["b"]), source.t()[1:] + 1.0)


def test_saving_a_buffer_again_after_a_write_saves_the_new_values() -> None:
    tensor = torch.ones(4, device="tpu")
    first = _round_trip(tensor, map_location="cpu")
    tensor.add_(1.0)
    assert first.tolist() == [1.0] * 4 and _round_trip(tensor, map_location="cpu").tolist() == [2.0] * 4


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(6, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.second = torch.nn.Linear(8, 2)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.second(torch.relu(self.norm(self.first(inputs))))


def _train(model: _Net, optimizer: torch.optim.Optimizer, batches: list, device: str) -> list[float]:
    losses = []
    for inputs, targets in batches:
        loss = torch.nn.functional.mse_loss(model(inputs.to(device)), targets.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("location", [None, "cpu", lambda storage, location: storage], ids=_location_id)
def test_resumed_training_matches_uninterrupted_training_on_cpu(mode: EagerMode, location: object) -> None:
    torch.manual_seed(0)
    initial = _Net().state_dict()
    batches = [(torch.randn(5, 6), torch.randn(5, 2)) for _ in range(6)]

    def fresh(device: str) -> tuple[_Net, torch.optim.Optimizer]:
        model = _Net()
        model.load_state_dict(initial)
        model.to(device)
        return model, torch.optim.AdamW(model.parameters(), lr=0.01)

    expected = _train(*fresh("cpu"), batches, "cpu")
    with eager(mode):
        model, optimizer = fresh("tpu")
        losses = _train(model, optimizer, batches[:3], "tpu")
        checkpoint = _round_trip({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, map_location=location)
        resumed, resumed_optimizer = fresh("tpu")
        resumed.load_state_dict(checkpoint["model"])
        resumed_optimizer.load_state_dict(checkpoint["optimizer"])
        losses += _train(resumed, resumed_optimizer, batches[3:], "tpu")
        assert int(resumed.calls) == 6
    assert losses == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_torch_tensor_of_tpu_scalars_is_a_host_tensor_as_on_cpu(mode: EagerMode) -> None:
    """torch builds it on the host with `item()` from C++, where `__torch_dispatch__` does not run."""
    with eager(mode):
        scalars = [torch.tensor(1.5) * 2, torch.tensor(2)]
        on_chip = [scalar.to("tpu") for scalar in scalars]
        for kwargs in ({}, {"dtype": torch.bfloat16}, {"device": "tpu"}):
            expected = torch.tensor(scalars, dtype=kwargs.get("dtype"))
            result = torch.tensor(on_chip, **kwargs)
            assert result.device.type == ("tpu" if kwargs.get("device") else "cpu")
            assert result.dtype == expected.dtype and torch.equal(host(result), expected)
        assert torch.tensor([on_chip[1] > 1, on_chip[1] > 5]).tolist() == [True, False]
