"""FlexAttention on tpu: outputs match CPU FlexAttention, and gradients (which CPU FlexAttention
refuses) match the same attention written with plain torch ops on the CPU, in both eager modes and
under torch.compile(backend="tpu"), with no op of the attention on the host."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch.nn.attention import flex_attention as flex_api
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

from backend_helpers import assert_matches_cpu, eager, host, recorded_fallbacks
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
HEADS, KV_HEADS, LENGTH, HEAD_DIM = 4, 2, 16, 8

pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")


def _causal(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    return q_idx >= kv_idx


def _inputs(kv_heads: int = HEADS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, HEADS, LENGTH, HEAD_DIM, generator=generator)
    key, value = (torch.randn(2, kv_heads, LENGTH, HEAD_DIM, generator=generator) for _ in range(2))
    slopes = torch.randn(HEADS, generator=generator)
    return query, key, value, slopes


def _reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slopes: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with an ALiBi-style bias (`slopes[h] * (q - kv)`) in plain torch ops: output and LSE."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    positions = torch.arange(LENGTH)
    distance = positions[:, None] - positions[None, :]
    scores = query @ key.transpose(-2, -1) / HEAD_DIM**0.5 + slopes[None, :, None, None] * distance
    if causal:
        scores = scores.masked_fill(distance < 0, float("-inf"))
    return scores.softmax(-1) @ value, scores.logsumexp(-1)


def _flex(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slopes: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    def alibi(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return score + slopes[h] * (q_idx - kv_idx)

    block_mask = create_block_mask(_causal, None, None, LENGTH, LENGTH, device=query.device.type) if causal else None
    out, aux = flex_attention(
        query, key, value, score_mod=alibi, block_mask=block_mask, enable_gqa=key.shape[1] != query.shape[1], return_aux=AuxRequest(lse=True)
    )
    return out, aux.lse


def _gradients(run: Callable[..., tuple[torch.Tensor, torch.Tensor]], tensors: tuple[torch.Tensor, ...], device: str, causal: bool) -> list[torch.Tensor]:
    leaves = [tensor.detach().to(device).requires_grad_() for tensor in tensors]
    out, lse = run(*leaves, causal)
    weights = torch.linspace(-1, 1, HEAD_DIM, device=device)
    ((out * weights).sum() + lse.sum()).backward()
    return [host(out), host(lse)] + [host(leaf.grad) for leaf in leaves]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_plain_attention_matches_cpu_flex_attention(mode: EagerMode) -> None:
    query, key, value, _ = _inputs()
    expected = flex_attention(query, key, value)
    with eager(mode), recorded_fallbacks() as fallbacks:
        out = flex_attention(query.to("tpu"), key.to("tpu"), value.to("tpu"))
    assert_matches_cpu(out, expected, device="tpu")
    assert fallbacks == []


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_causal_mask_and_captured_bias_match_cpu_flex_attention(mode: EagerMode) -> None:
    query, key, value, slopes = _inputs(KV_HEADS)
    expected_out, _ = _flex(query, key, value, slopes, causal=True)
    tpu_slopes = slopes.to("tpu")
    with eager(mode), torch.no_grad():
        out, _ = _flex(query.to("tpu"), key.to("tpu"), value.to("tpu"), tpu_slopes, causal=True)
    assert_matches_cpu(out, expected_out, device="tpu")


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("kv_heads", [HEADS, KV_HEADS], ids=["mha", "gqa"])
def test_gradients_match_the_same_attention_in_torch_ops(mode: EagerMode, kv_heads: int) -> None:
    tensors = _inputs(kv_heads)
    expected = _gradients(_reference, tensors, "cpu", causal=True)
    with eager(mode), recorded_fallbacks() as fallbacks:
        actual = _gradients(_flex, tensors, "tpu", causal=True)
    assert_matches_cpu(actual, expected)
    assert fallbacks == []


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_compiled_attention_and_gradients_match_the_same_attention_in_torch_ops(causal: bool) -> None:
    tensors = _inputs(KV_HEADS)
    expected = _gradients(_reference, tensors, "cpu", causal)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a graph op on the host warns
        actual = _gradients(torch.compile(_flex, backend="tpu"), tensors, "tpu", causal)
    assert_matches_cpu(actual, expected)


def test_backward_on_the_cpu_is_still_refused_by_torch() -> None:
    query = torch.randn(1, 1, LENGTH, HEAD_DIM, requires_grad=True)
    with pytest.raises(NotImplementedError, match="FlexAttention does not support backward on CPU"):
        flex_api.flex_attention(query, query, query)


def test_mask_mod_reading_a_captured_tensor_and_max_scores_match_torch_ops() -> None:
    query = torch.randn(1, 2, LENGTH, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    documents = torch.tensor([0] * 6 + [1] * (LENGTH - 6))
    scores = query @ query.transpose(-2, -1) / HEAD_DIM**0.5
    scores = scores.masked_fill(documents[:, None] != documents[None, :], float("-inf"))
    expected_out, expected_max = scores.softmax(-1) @ query, scores.amax(-1)
    tpu_documents = documents.to("tpu")

    def same_document(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return tpu_documents[q_idx] == tpu_documents[kv_idx]

    block_mask = create_block_mask(same_document, None, None, LENGTH, LENGTH, device="tpu")
    tpu_query = query.to("tpu")
    with recorded_fallbacks() as fallbacks:
        out, aux = flex_attention(tpu_query, tpu_query, tpu_query, block_mask=block_mask, return_aux=AuxRequest(max_scores=True))
    assert_matches_cpu(out, expected_out, device="tpu")
    assert_matches_cpu(aux.max_scores, expected_max, device="tpu")
    assert fallbacks == []
