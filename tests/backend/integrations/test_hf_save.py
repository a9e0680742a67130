"""Checkpoint writers that look for shared storage: `save_pretrained` (huggingface_hub unwraps a
TpuTensor with `__tensor_flatten__`) and safetensors (`data_ptr` against the storage's) save a model
on tpu, tied weights included, and load it back. `device=0` reaches torch as a bare index, which
names the current accelerator, `tpu:0`; tests/backend/integrations/test_weight_loading.py covers `device="tpu:N"`."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, load_model, save_file, save_model

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


def test_safetensors_save_file_and_load_file_onto_tpu(tmp_path: Path) -> None:
    source = torch.randn(3, 4)
    on_host = {"weight": source, "rows": source[1:].clone(), "half": source.to(torch.bfloat16), "steps": torch.arange(5)}
    on_chip = {"weight": source.to("tpu"), "rows": source.to("tpu")[1:], "half": source.to(torch.bfloat16).to("tpu"), "steps": torch.arange(5).to("tpu")}
    save_file(on_chip, str(tmp_path / "chip.safetensors"))
    save_file(on_host, str(tmp_path / "host.safetensors"))
    assert (tmp_path / "chip.safetensors").read_bytes() == (tmp_path / "host.safetensors").read_bytes()
    loaded = load_file(str(tmp_path / "chip.safetensors"), device=0)
    assert loaded.keys() == on_host.keys()
    for name, value in loaded.items():
        assert value.device == torch.device("tpu", 0) and value.dtype == on_host[name].dtype, name
        assert torch.equal(host(value), on_host[name]), name


def test_save_pretrained_from_tpu_loads_back_with_the_same_outputs(tmp_path: Path) -> None:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    on_host = transformers.LlamaForCausalLM(config).eval()
    model = transformers.LlamaForCausalLM(config).eval()
    model.load_state_dict(on_host.state_dict())
    model.to("tpu")
    model.save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path).to("tpu")
    assert {parameter.device.type for parameter in loaded.parameters()} == {"tpu"}
    tokens = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        expected = on_host(tokens).logits
        assert torch.equal(host(loaded(tokens.to("tpu")).logits), host(model(tokens.to("tpu")).logits))
        torch.testing.assert_close(host(loaded(tokens.to("tpu")).logits), expected, atol=1e-5, rtol=1e-5)
