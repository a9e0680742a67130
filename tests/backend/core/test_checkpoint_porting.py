"""Checkpoints and host data in a training script ported from CUDA, compared with the same code on the
CPU: `torch.save` of tpu tensors keeps views and tied weights sharing one storage, every kind of
`map_location` (a callable included), legacy-format files, `tensor.storage()` saved on its own,
`mmap=True` loads, loading onto a second chip, parameters that load as parameters, resuming AdamW training, and `torch.tensor` of a list
of 0-dim tpu tensors."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

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
@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize(("location", "device_type"), [(None, "tpu"), ("cpu", "cpu")], ids=["tpu", "cpu"])
def test_saved_parameters_load_as_parameters_as_on_cpu(mode: EagerMode, weights_only: bool, location: object, device_type: str) -> None:
    torch.manual_seed(0)
    with eager(mode):
        linear = torch.nn.Linear(3, 2).to("tpu")
        linear.bias.requires_grad_(False)
        loaded = _round_trip([linear.weight, linear.bias], map_location=location, weights_only=weights_only)
        for saved, restored in zip((linear.weight, linear.bias), loaded, strict=True):
            assert isinstance(restored, torch.nn.Parameter) and restored.requires_grad == saved.requires_grad
            assert restored.device.type == device_type and torch.equal(host(restored), host(saved))


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


def _saved_locations(saved: Any) -> list[str]:
    """The location tag of each storage in the file, as torch.load hands them to a callable."""
    locations: list[str] = []

    def keep(storage: Any, location: str) -> Any:
        locations.append(location)
        return storage

    _round_trip(saved, map_location=keep)
    return locations


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_each_buffer_is_one_tagged_storage_in_the_file(mode: EagerMode) -> None:
    with eager(mode):
        first = torch.randn(4, 3, device="tpu") * 2
        second = torch.ones(5, device="tpu")
        saved = {"first": first, "first_rows": first[1:], "first_t": first.t(), "second": second, "again": second}
        assert _saved_locations(saved) == ["tpu:0", "tpu:0"]


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize(("location", "device_type"), [("cpu", "cpu"), ("tpu", "tpu"), (None, "tpu")], ids=str)
def test_typed_storage_saves_with_its_tensor_as_on_cuda(mode: EagerMode, legacy: bool, weights_only: bool, location: object, device_type: str) -> None:
    """`tensor.storage()` is the storage of the tensor's buffer: one storage in the file with the
    tensor's, loaded as a TypedStorage on the host or on the chip that the tensor still shares."""
    source = torch.arange(6.0)
    with eager(mode):
        on_chip = source.to("tpu") * 1
        saved = {"storage": on_chip.storage(), "tail": on_chip[1:]}
        assert _saved_locations(saved) == ["tpu:0"]
        loaded = _round_trip(saved, legacy=legacy, map_location=location, weights_only=weights_only)
        storage, tail = loaded["storage"], loaded["tail"]
        assert isinstance(storage, torch.storage.TypedStorage) and storage.dtype == torch.float32
        assert storage.device.type == tail.device.type == device_type
        assert storage.tolist() == source.tolist() and torch.equal(host(tail), source[1:])
        whole = torch.empty(0, device=device_type).set_(storage)
        with torch.no_grad():
            whole.add_(1.0)
        assert torch.equal(host(tail), source[1:] + 1.0), "the tensor no longer shares the storage"


def test_a_bare_untyped_storage_is_refused_naming_what_to_save() -> None:
    """torch saves a storage itself only when its class is exactly one of torch's; a tpu storage (a
    subclass) would reach `UntypedStorage.__reduce__`, which calls torch.save again without end."""
    tensor = torch.arange(6.0, device="tpu")
    for saved in (tensor.untyped_storage(), {"storage": tensor.untyped_storage(), "tensor": tensor}):
        for legacy in (False, True):
            with pytest.raises(RuntimeError, match=r"untyped_storage\(\) cannot be saved.*save the tensor instead"):
                torch.save(saved, io.BytesIO(), _use_new_zipfile_serialization=not legacy)
    with pytest.raises(RuntimeError, match="save the tensor instead"):
        pickle.dumps(tensor.untyped_storage())


@pytest.mark.parametrize("saved_on", ["cpu", "tpu"])
@pytest.mark.parametrize(("location", "device_type"), [("tpu", "tpu"), ("tpu:0", "tpu"), (None, None), ("cpu", "cpu")], ids=str)
def test_mmap_load_onto_chip_or_host(tmp_path: Path, saved_on: str, location: object, device_type: str | None) -> None:
    source = torch.arange(12.0).view(3, 4)
    base = source.to(saved_on)
    path = tmp_path / "checkpoint.pt"
    torch.save({"a": base, "rows": base[1:], "half": base.to(torch.bfloat16)}, path)
    loaded = torch.load(path, mmap=True, map_location=location)
    assert {tensor.device.type for tensor in loaded.values()} == {device_type or saved_on}
    assert torch.equal(host(loaded["rows"]), source[1:]) and torch.equal(host(loaded["half"]), source.to(torch.bfloat16))
    loaded["a"].add_(1.0)
    assert torch.equal(host(loaded["rows"]), source[1:] + 1.0)
    assert torch.equal(torch.load(path, map_location="cpu")["a"], source), "writing the mmap load changed the file"


_SECOND_CHIP = """
import torch, tputrace.backend
source = torch.arange(12.0).view(3, 4)
first = source.to("tpu:0")
torch.save({"a": first, "rows": first[1:], "second": source.to("tpu:1") * 2}, "checkpoint.pt")
for location in ("tpu:1", torch.device("tpu", 1), {"tpu:0": "tpu:1"}, None, "cpu"):
    for mmap in (False, True):
        loaded = torch.load("checkpoint.pt", map_location=location, mmap=mmap)
        loaded["a"].add_(1.0)
        print(location, mmap, [str(tensor.device) for tensor in loaded.values()],
              torch.equal(loaded["rows"].cpu(), source[1:] + 1.0), torch.equal(loaded["second"].cpu(), source * 2))
"""


def test_load_onto_the_second_chip(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _SECOND_CHIP], capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "TPUTRACE_CHIPS": "2"}, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    on_second = "['tpu:1', 'tpu:1', 'tpu:1'] True True"
    expected = [
        f"{location} {mmap} {devices}"
        for location, devices in (
            ("tpu:1", on_second),
            ("tpu:1", on_second),
            ("{'tpu:0': 'tpu:1'}", on_second),
            ("None", "['tpu:0', 'tpu:0', 'tpu:1'] True True"),
            ("cpu", "['cpu', 'cpu', 'cpu'] True True"),
        )
        for mmap in (False, True)
    ]
    assert result.stdout.splitlines() == expected


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
