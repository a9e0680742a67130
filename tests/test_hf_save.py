"""Checkpoint writers that look for shared storage: `save_pretrained` (huggingface_hub unwraps a
TpuTensor with `__tensor_flatten__`) and safetensors (`data_ptr` against the storage's) save a model
on tpu, tied weights included, and load it back."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from safetensors.torch import load_model, save_model

from backend_helpers import host


def test_data_ptr_tells_tensors_apart_and_sees_offsets() -> None:
    values = torch.arange(6.0, device="tpu")
    assert values.data_ptr() != 0
    assert values[2:].data_ptr() - values.data_ptr() == 2 * values.element_size()
    assert values.view(2, 3).data_ptr() == values.data_ptr() == values.untyped_storage().data_ptr()
    assert values.clone().data_ptr() != values.data_ptr()


def test_safetensors_save_and_load_model_on_tpu(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 2)).to("tpu")
    save_model(model, str(tmp_path / "model.safetensors"))
    other = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 2)).to("tpu")
    assert load_model(other, str(tmp_path / "model.safetensors")) == (set(), [])
    for got, want in zip(other.parameters(), model.parameters()):
        assert got.device.type == "tpu" and torch.equal(host(got), host(want))


def test_save_pretrained_with_tied_weights(tmp_path: Path) -> None:
    config = transformers.GPT2Config(vocab_size=60, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to("tpu")
    model.save_pretrained(tmp_path)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).to("tpu")
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    expected = {name: host(value) for name, value in model.state_dict().items()}
    for name, value in loaded.state_dict().items():
        assert torch.equal(host(value), expected[name]), name
