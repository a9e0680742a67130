"""Host-side code a ported training script runs unchanged: `torch.load(..., map_location="tpu")`
(also for checkpoints saved on the host), and `DataLoader(pin_memory=True)` / `Tensor.pin_memory()`."""

from __future__ import annotations

import io

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)


def _host_checkpoint() -> tuple[io.BytesIO, dict]:
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(5, 4)
    head = torch.nn.Linear(4, 5, bias=False)
    head.weight = embedding.weight  # tied: one storage
    base = torch.arange(12.0)
    saved = {
        "linear": torch.nn.Linear(4, 3).state_dict(),
        "embedding": embedding.weight,
        "head": head.weight,
        "base": base,
        "view": base[2:8].view(2, 3).t(),
        "int": torch.arange(4),
        "bf16": torch.randn(3).bfloat16(),
    }
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    return buffer, saved


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("location", ["tpu", "tpu:0", torch.device("tpu"), {"cpu": "tpu:0"}], ids=str)
def test_load_host_checkpoint_onto_chip(mode: EagerMode, location: object) -> None:
    buffer, saved = _host_checkpoint()
    buffer.seek(0)
    with eager(mode):
        loaded = torch.load(buffer, map_location=location)
        assert {tensor.device for tensor in loaded["linear"].values()} == {torch.device("tpu", 0)}
        assert torch.equal(host(loaded["linear"]["weight"]), saved["linear"]["weight"])
        assert torch.equal(host(loaded["int"]), saved["int"]) and torch.equal(host(loaded["bf16"]), saved["bf16"])
        assert torch.equal(host(loaded["view"]), saved["view"]) and loaded["view"].stride() == saved["view"].stride()
        loaded["embedding"].data.add_(1.0)
        assert torch.equal(host(loaded["head"]), host(loaded["embedding"])), "tied tensors no longer share storage"
        loaded["base"].add_(100.0)
        assert host(loaded["view"])[0].tolist() == [102.0, 105.0], "a view no longer sees its base"


def test_load_onto_missing_chip_is_one_line_error() -> None:
    buffer, _ = _host_checkpoint()
    buffer.seek(0)
    with pytest.raises(RuntimeError, match=r"maps a storage to tpu:7, but there are \d+ tpu chip"):
        torch.load(buffer, map_location="tpu:7")


def test_load_state_dict_from_chip_checkpoint_with_map_location() -> None:
    model = torch.nn.Linear(3, 2).to("tpu")
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    other = torch.nn.Linear(3, 2).to("tpu")
    other.load_state_dict(torch.load(buffer, map_location="tpu"))
    assert torch.equal(host(other.weight), host(model.weight))


def test_pin_memory_is_a_contiguous_host_copy() -> None:
    source = torch.randn(3, 4).t()
    pinned = source.pin_memory()
    assert pinned.device.type == "cpu" and pinned.is_contiguous() and torch.equal(pinned, source)
    assert pinned.data_ptr() != source.data_ptr()


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_dataloader_with_pin_memory_trains(mode: EagerMode) -> None:
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(32, 6), torch.randn(32, 1))
    with eager(mode):
        model = torch.nn.Linear(6, 1).to("tpu")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = 0
        for inputs, targets in DataLoader(dataset, batch_size=8, pin_memory=True):
            loss = torch.nn.functional.mse_loss(model(inputs.to("tpu", non_blocking=True)), targets.to("tpu", non_blocking=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            batches += 1
        assert batches == 4 and torch.isfinite(host(model.weight)).all()


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_host_tensor_copied_to_the_chip_can_still_be_resized(mode: EagerMode, dtype: torch.dtype) -> None:
    source = torch.arange(6, dtype=dtype)
    with eager(mode):
        on_chip = source.to("tpu")
        torch.mul(torch.ones(2, 3, dtype=dtype), 2, out=source)  # out= resizes the host tensor, as on the CPU
        source.add_(1)
        assert host(on_chip).tolist() == list(range(6))
    assert source.tolist() == [[3.0] * 3] * 2


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_a_chip_tensor_copied_to_the_host_can_be_resized(mode: EagerMode, dtype: torch.dtype) -> None:
    """`.cpu()` gives a tensor with storage of torch's own: `resize_` and `out=` grow it as on the CPU."""
    with eager(mode):
        copied = torch.arange(6, dtype=dtype, device="tpu").cpu()
        grown = torch.arange(4, dtype=dtype, device="tpu").cpu()
    copied.resize_(2, 4)
    assert copied.flatten()[:6].tolist() == list(range(6))
    torch.mul(torch.ones(3, 3, dtype=dtype), 2, out=grown.resize_(0))
    assert grown.tolist() == [[2] * 3] * 3


def _host_layouts() -> dict[str, torch.Tensor]:
    values = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 7
    return {
        "transposed": values[0].t(),
        "permuted": values.permute(2, 0, 1),
        "strided": torch.arange(20.0)[::3],
        "expanded": torch.arange(4.0).reshape(1, 4).expand(3, 4),
        "0-d": torch.tensor(2.5),
        "empty": torch.ones(0, 3),
        "conjugate": (torch.arange(4.0) + 1j).conj(),
        "negative view": torch.arange(4.0)._neg_view(),
        "bool": torch.tensor([True, False, True]),
        "int8": torch.tensor([-3, 0, 5], dtype=torch.int8),
        "bfloat16 transposed": values[1].t().bfloat16(),
        "float8": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn),
    }


@pytest.mark.parametrize("name", list(_host_layouts()))
def test_host_tensors_of_every_layout_reach_the_chip_whole_and_private(name: str) -> None:
    """A host copy is private and holds the values as the host tensor reads them (strides, conjugate and negative
    bits, the types NumPy lacks), and the host tensor changed later does not change it."""
    source = _host_layouts()[name]
    expected = source.resolve_conj().resolve_neg().clone()
    on_chip = source.to("tpu")
    if source.numel() and not source.is_conj() and not source.is_neg() and source.dtype != torch.float8_e4m3fn:
        source.zero_()
    copied = host(on_chip)
    assert copied.dtype == expected.dtype and copied.shape == expected.shape and copied.is_contiguous()
    assert torch.equal(copied.view(torch.uint8) if copied.dtype == torch.float8_e4m3fn else copied,
                       expected.contiguous().view(torch.uint8) if expected.dtype == torch.float8_e4m3fn else expected)
