"""Hugging Face Mixture-of-Experts layers on tpu against the same weights on the CPU: tiny random
models built from configs (no hub access). On an accelerator transformers counts each expert's
tokens with an integer `histc`, which torch's CPU kernel refuses; the logits and the gradients must
match the CPU's in both eager modes."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import pytest
import torch
import transformers

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

logging.getLogger("transformers").setLevel(logging.ERROR)

VOCAB = 48
MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)


def _tiny_qwen2_moe() -> transformers.PreTrainedModel:
    config = transformers.Qwen2MoeConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, moe_intermediate_size=8, shared_expert_intermediate_size=16,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    return transformers.Qwen2MoeForCausalLM(config)


def _tiny_mixtral() -> transformers.PreTrainedModel:
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=32,
    )
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(config)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("build", [_tiny_qwen2_moe, _tiny_mixtral], ids=["qwen2_moe", "mixtral"])
def test_moe_logits_and_gradients_match_the_cpu(mode: EagerMode, build: Callable[[], transformers.PreTrainedModel]) -> None:
    cpu_model = build()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    input_ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    cpu_out = cpu_model(input_ids=input_ids, labels=input_ids)
    cpu_out.loss.backward()
    with eager(mode):
        tpu_out = tpu_model(input_ids=input_ids.to("tpu"), labels=input_ids.to("tpu"))
        tpu_out.loss.backward()
        torch.testing.assert_close(host(tpu_out.logits), cpu_out.logits, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(host(tpu_out.loss), cpu_out.loss, atol=1e-5, rtol=1e-4)
        for (name, cpu_parameter), tpu_parameter in zip(cpu_model.named_parameters(), tpu_model.parameters()):
            if cpu_parameter.grad is None:
                assert tpu_parameter.grad is None, name
                continue
            torch.testing.assert_close(host(tpu_parameter.grad), cpu_parameter.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("build", [_tiny_qwen2_moe, _tiny_mixtral], ids=["qwen2_moe", "mixtral"])
def test_compiled_moe_logits_and_gradients_match_the_cpu(build: Callable[[], transformers.PreTrainedModel]) -> None:
    """Under `torch.compile(backend="tpu")` transformers still sends float32 experts to `torch._grouped_mm`,
    whose meta kernel takes only bfloat16: the tpu's fake rule follows the CPU kernel instead."""
    cpu_model = build()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    compiled = torch.compile(tpu_model, backend="tpu")
    input_ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    cpu_out = cpu_model(input_ids=input_ids, labels=input_ids)
    cpu_out.loss.backward()
    tpu_out = compiled(input_ids=input_ids.to("tpu"), labels=input_ids.to("tpu"))
    tpu_out.loss.backward()
    torch.testing.assert_close(host(tpu_out.logits), cpu_out.logits, atol=1e-5, rtol=1e-4)
    for (name, cpu_parameter), tpu_parameter in zip(cpu_model.named_parameters(), tpu_model.parameters()):
        if cpu_parameter.grad is not None:
            torch.testing.assert_close(host(tpu_parameter.grad), cpu_parameter.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize(("shape_a", "shape_b", "ends"), [
    ((12, 8), (3, 8, 16), (4, 8, 12)), ((4, 8), (8, 12), (2, 5, 8)), ((3, 4, 8), (8, 12), (2, 5, 12)), ((3, 4, 8), (3, 8, 12), None),
], ids=["2d-3d", "2d-2d", "3d-2d", "3d-3d"])
def test_compiled_float32_grouped_mm_matches_the_cpu(shape_a: tuple[int, ...], shape_b: tuple[int, ...], ends: tuple[int, ...] | None) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(shape_a), torch.randn(shape_b)
    offs = None if ends is None else torch.tensor(ends, dtype=torch.int32)
    compiled = torch.compile(lambda a, b, offs: torch._grouped_mm(a, b, offs=offs) * 2, backend="tpu", fullgraph=True)
    got = compiled(a.to("tpu"), b.to("tpu"), None if offs is None else offs.to("tpu"))
    assert got.shape == torch._grouped_mm(a, b, offs=offs).shape
    torch.testing.assert_close(host(got), torch._grouped_mm(a, b, offs=offs) * 2, atol=1e-4, rtol=1e-4)
