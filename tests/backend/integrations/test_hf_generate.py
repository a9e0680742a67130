"""Hugging Face `generate` on tpu against the same weights on the CPU: tiny random models built from
configs (no hub access), one copy moved to tpu. Greedy and beam tokens must match the CPU's; sampling
draws from the chip's generator, so it is checked for reproducibility and range only."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import transformers

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

logging.getLogger("transformers").setLevel(logging.ERROR)

VOCAB = 48


def _tiny_qwen2() -> transformers.PreTrainedModel:
    """A GQA decoder (2 query heads per key/value head)."""
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config).eval()


def _tiny_mistral() -> transformers.PreTrainedModel:
    """A sliding-window decoder: its static cache rolls once `generate` runs past the window."""
    config = transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32, sliding_window=4, bos_token_id=1, eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.MistralForCausalLM(config).eval()


def _left_padded_batch(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 6 tokens, the second left-padded by 2, and their attention mask."""
    input_ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, :2] = 0
    attention_mask[1, :2] = 0
    return input_ids.to(device), attention_mask.to(device)


def test_view_of_a_normal_tensor_made_in_inference_mode() -> None:
    """A view made under inference_mode of a tensor made outside it is a normal tensor that shares
    its base's version counter, as on the CPU; tpu raised "Cannot set version_counter for inference
    tensor" (`attention_mask[:, -1]` at the start of every `generate` under inference_mode)."""
    for device in ("cpu", "tpu"):
        base = torch.zeros(2, 3, device=device)
        with torch.inference_mode():
            row = base[0]
            column = base[:, -1]
        assert not row.is_inference() and not column.is_inference()
        base.add_(1)
        assert row._version == base._version
        assert torch.equal(host(column), torch.ones(2))


@pytest.mark.parametrize("mode", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE])
def test_greedy_generate_under_inference_mode_matches_cpu(mode: EagerMode) -> None:
    cpu_model = _tiny_qwen2()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    input_ids, attention_mask = _left_padded_batch("cpu")
    tpu_input_ids, tpu_attention_mask = input_ids.to("tpu"), attention_mask.to("tpu")  # normal tensors
    with torch.inference_mode():
        expected = cpu_model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=5, do_sample=False)
        with eager(mode):
            got = tpu_model.generate(tpu_input_ids, attention_mask=tpu_attention_mask, max_new_tokens=5, do_sample=False)
    assert torch.equal(host(got), expected)


def test_beam_search_and_scores_match_cpu() -> None:
    cpu_model = _tiny_qwen2()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    input_ids, attention_mask = _left_padded_batch("cpu")
    options = dict(max_new_tokens=3, num_beams=2, do_sample=False, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        expected = cpu_model.generate(input_ids, attention_mask=attention_mask, **options)
        got = tpu_model.generate(input_ids.to("tpu"), attention_mask=attention_mask.to("tpu"), **options)
    assert torch.equal(host(got.sequences), expected.sequences)
    for got_scores, expected_scores in zip(got.scores, expected.scores, strict=True):
        finite = torch.isfinite(expected_scores)
        assert torch.equal(torch.isfinite(host(got_scores)), finite)
        torch.testing.assert_close(host(got_scores)[finite], expected_scores[finite], atol=1e-4, rtol=1e-3)


def test_sampling_is_reproducible_under_manual_seed() -> None:
    tpu_model = _tiny_qwen2().to("tpu")
    input_ids, attention_mask = _left_padded_batch("tpu")
    draws = []
    for _ in range(2):
        torch.manual_seed(5)
        with torch.no_grad():
            draws.append(host(tpu_model.generate(
                input_ids, attention_mask=attention_mask, max_new_tokens=4, do_sample=True, top_k=8, top_p=0.9,
            )))
    assert torch.equal(draws[0], draws[1])
    assert draws[0].shape == (2, 10) and bool(((draws[0] >= 0) & (draws[0] < VOCAB)).all())


def test_static_cache_of_a_sliding_window_model_matches_cpu() -> None:
    """`generate` compiles the decoding step with the `tpu` Dynamo backend when the cache is static.
    Once the sliding window is full the cache writes at `torch.tensor([-1], device=...)`: under the
    fake mode that tensor stayed a real tpu tensor and Dynamo refused it, and the host constant it
    becomes in the AOTAutograd graph could not be read while the fake mode was on."""
    cpu_model = _tiny_mistral()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    input_ids, attention_mask = _left_padded_batch("cpu")
    options = dict(max_new_tokens=4, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        expected = cpu_model.generate(input_ids, attention_mask=attention_mask, **options)
        got = tpu_model.generate(input_ids.to("tpu"), attention_mask=attention_mask.to("tpu"), **options)
    assert torch.equal(host(got), expected)


def test_compiled_code_that_makes_tensors_from_data() -> None:
    """`torch.tensor(data, device="tpu")` and a host `torch.tensor(data)` inside `torch.compile(backend="tpu")`."""

    def overwrite_last(keys: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        rolled = keys.roll(-1, dims=-2)
        rolled[torch.tensor([-1], device=keys.device)] = new
        keys.copy_(rolled)
        return keys + torch.tensor([1.0, 2.0, 3.0]).to(keys.device)

    keys = torch.arange(12.0).reshape(4, 3)
    new = torch.full((1, 3), -1.0)
    expected = overwrite_last(keys.clone(), new)
    compiled = torch.compile(overwrite_last, backend="tpu", fullgraph=True)
    tpu_keys = keys.to("tpu")
    with torch.no_grad():
        got = compiled(tpu_keys, new.to("tpu"))
    assert torch.equal(host(got), expected)
    assert torch.equal(host(tpu_keys), expected - torch.tensor([1.0, 2.0, 3.0]))


def test_compiled_code_that_moves_a_one_element_tensor_made_from_data() -> None:
    """A one-element tensor built from data in compiled code and moved to the chip: the fake mode ran the
    move for real to make a constant of it, got a tpu tensor, and asserted ("fake_tensor must be a
    FakeTensor with a constant")."""

    def shifted(x: torch.Tensor) -> torch.Tensor:
        window = torch.tensor(4, dtype=torch.long).to(x.device)
        return x + window - torch.tensor([0.5]).to(x.device)

    compiled = torch.compile(shifted, backend="tpu", fullgraph=True)
    x = torch.arange(3.0)
    assert torch.equal(host(compiled(x.to("tpu"))), shifted(x))


def test_compiled_forward_of_a_sliding_window_model_matches_cpu() -> None:
    """Mistral's dynamic cache moves `torch.tensor(sliding_window)` to the chip in every forward."""
    cpu_model = _tiny_mistral()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    input_ids, attention_mask = _left_padded_batch("cpu")
    compiled = torch.compile(tpu_model, backend="tpu")
    with torch.no_grad():
        expected = cpu_model(input_ids, attention_mask=attention_mask).logits
        got = compiled(input_ids.to("tpu"), attention_mask=attention_mask.to("tpu")).logits
    torch.testing.assert_close(host(got), expected, rtol=1e-4, atol=1e-5)
