"""Lowerings written for XLA:CPU's compile time: random draws from Philox (XLA's RngBitGenerator) instead of
threefry, slice and select backward (and scatters through them) as pads, `nll_loss_backward` as a compare with an
iota instead of a scatter, `_foreach_norm`'s square roots over the stacked sums. Each must still match torch on the CPU, gradients included, in both eager modes; and
the programs they lower to must hold none of the slow forms."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

jax = pytest.importorskip("jax")
jnp = jax.numpy

from backend_helpers import assert_matches_cpu, eager, host  # noqa: E402
from tputrace.backend.compat.device_module import EagerMode  # noqa: E402
from tputrace.backend.core import rng  # noqa: E402
from tputrace.backend.ops import foreach as foreach_ops  # noqa: E402
from tputrace.backend.ops import nn as nn_ops  # noqa: E402
from tputrace.backend.ops import random as random_ops  # noqa: E402
from tputrace.backend.ops import shape as shape_ops  # noqa: E402

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]


def _value_and_grad(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.detach().to(device).requires_grad_(True)
    out = fn(leaf)
    weights = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape).to(device) / out.numel() - 0.3
    (out * weights).sum().backward()
    return host(out), host(leaf.grad)


VIEW_CASES = {
    "slice_step": lambda x: x[:, 1:7:2],
    "slice_tail": lambda x: x[1:, -3:],
    "slice_empty": lambda x: x[:, 5:5],
    "slice_past_end": lambda x: x[:, 6:100:4],
    "select_negative": lambda x: x[..., -1],
    "select_first_dim": lambda x: x[2],
    "narrow": lambda x: x.narrow(1, 2, 3) * 2,
    "unbind": lambda x: torch.stack(x.unbind(0)[1:3], 1),
    "qkv_split": lambda x: torch.cat([part * (i + 1) for i, part in enumerate(x.split(3, dim=1))], 0),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
@pytest.mark.parametrize("case", list(VIEW_CASES))
def test_slice_and_select_gradients_match_cpu(case: str, mode: EagerMode) -> None:
    x = torch.randn(5, 9, generator=torch.Generator().manual_seed(1))
    expected = _value_and_grad(VIEW_CASES[case], x, "cpu")
    with eager(mode):
        actual = _value_and_grad(VIEW_CASES[case], x, "tpu")
    assert_matches_cpu(actual, expected)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
def test_slice_and_select_scatter_match_cpu(mode: EagerMode) -> None:
    generator = torch.Generator().manual_seed(2)
    base, strided, row = torch.randn(4, 10, generator=generator), torch.randn(4, 3, generator=generator), torch.randn(10, generator=generator)
    cases = [
        lambda b, s, r: torch.slice_scatter(b, s, 1, 1, 8, 3),
        lambda b, s, r: torch.slice_scatter(b, s, 1, -3),
        lambda b, s, r: torch.select_scatter(b, r, 0, -1),
        lambda b, s, r: torch.select_scatter(b.t(), r, 1, 2),
        lambda b, s, r: torch.slice_scatter(b.int(), s.int(), 1, 0, 3),
    ]
    expected = [case(base, strided, row) for case in cases]
    with eager(mode):
        actual = [host(case(base.to("tpu"), strided.to("tpu"), row.to("tpu"))) for case in cases]
    assert_matches_cpu(actual, expected)


LOSS_CASES = {
    "mean": lambda scores, target, weight: F.cross_entropy(scores, target),
    "sum_weighted": lambda scores, target, weight: F.cross_entropy(scores, target, weight=weight, reduction="sum"),
    "mean_ignore_index": lambda scores, target, weight: F.cross_entropy(scores, target, weight=weight, ignore_index=2),
    "none": lambda scores, target, weight: F.nll_loss(scores.log_softmax(1), target, reduction="none"),
    "per_position": lambda scores, target, weight: F.cross_entropy(scores.reshape(2, 3, 5).permute(0, 2, 1), target.reshape(2, 3), weight=weight),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
@pytest.mark.parametrize("case", list(LOSS_CASES))
def test_nll_loss_gradients_match_cpu(case: str, mode: EagerMode) -> None:
    generator = torch.Generator().manual_seed(3)
    scores = torch.randn(6, 5, generator=generator)
    target = torch.tensor([0, 2, 4, 2, 1, 3])
    weight = torch.rand(5, generator=generator) + 0.5

    def loss(device: str) -> tuple[torch.Tensor, torch.Tensor]:
        return _value_and_grad(lambda s: LOSS_CASES[case](s, target.to(device), weight.to(device)), scores, device)

    expected = loss("cpu")
    with eager(mode):
        actual = loss("tpu")
    assert_matches_cpu(actual, expected)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
def test_dropout_keeps_torch_semantics(mode: EagerMode) -> None:
    """Dropout keeps about 1 - p of its input, scales what it keeps by 1 / (1 - p), passes the gradient through
    the same mask, repeats its draws after `manual_seed`, and draws a new mask at each call."""
    x = torch.ones(256, 256)
    with eager(mode):
        torch.tpu.manual_seed(11)
        leaf = x.to("tpu").requires_grad_(True)
        out = F.dropout(leaf, 0.3, training=True)
        out.sum().backward()
        first, grad = host(out), host(leaf.grad)
        second = host(F.dropout(x.to("tpu"), 0.3, training=True))
        torch.tpu.manual_seed(11)
        again = host(F.dropout(x.to("tpu"), 0.3, training=True))
    kept = first != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.01
    assert torch.allclose(first[kept], torch.full_like(first[kept], 1 / 0.7))
    assert torch.equal(grad, first)
    assert torch.equal(again, first)
    assert not torch.equal(second, first)
    assert abs((second != 0).float().mean().item() - 0.7) < 0.01


def test_random_draws_follow_their_distributions() -> None:
    torch.tpu.manual_seed(5)
    uniform = host(torch.rand(200_000, device="tpu"))
    normal = host(torch.randn(200_000, device="tpu"))
    coin = host(torch.bernoulli(torch.full((200_000,), 0.25, device="tpu")))
    integers = host(torch.randint(3, 9, (200_000,), device="tpu"))
    assert 0.0 <= uniform.min().item() and uniform.max().item() < 1.0
    assert abs(uniform.mean().item() - 0.5) < 0.005 and abs(uniform.var().item() - 1 / 12) < 0.002
    assert abs(normal.mean().item()) < 0.01 and abs(normal.std().item() - 1.0) < 0.01
    assert abs(coin.mean().item() - 0.25) < 0.005
    assert set(integers.unique().tolist()) == set(range(3, 9))
    lag_correlation = torch.corrcoef(torch.stack([normal[:-1], normal[1:]]))[0, 1].item()
    assert abs(lag_correlation) < 0.01


def test_consecutive_counters_draw_unrelated_streams() -> None:
    """Each op's counter selects its own run of Philox blocks: neighbouring counters share no values, shifted or not."""
    seed = jnp.asarray(7, jnp.int64)

    def bits(counter: int) -> set[int]:
        return set(jax.random.bits(rng.key_from(seed, jnp.asarray(counter, jnp.int64)), (4096,), jnp.uint32).tolist())

    assert not bits(3) & bits(4)
    assert not bits(3) & bits(3 + 2**32)


def _lowered_text(fn: Callable[..., jax.Array], *args: object) -> str:
    return jax.jit(fn).lower(*args).as_text()


def test_dropout_program_holds_no_threefry() -> None:
    seed, counter, x = jnp.asarray(1, jnp.int64), jnp.asarray(2, jnp.int64), jnp.ones((8, 32, 128), jnp.float32)
    text = _lowered_text(lambda s, c, v: random_ops.native_dropout(v, 0.1, True, key=rng.key_from(s, c)), seed, counter, x)
    assert "rng_bit_generator" in text
    assert "threefry" not in text


def test_slice_select_and_nll_backward_programs_hold_no_scatter() -> None:
    grad = jnp.ones((4, 3), jnp.float32)
    texts = [
        _lowered_text(lambda g: shape_ops.slice_backward(g, (4, 10), 1, 1, 8, 3), grad),
        _lowered_text(lambda g: shape_ops.select_backward(g[:, 0], (4, 6), 1, -2), grad),
        _lowered_text(lambda b, s: shape_ops.slice_scatter(b, s, 1, 1, 8, 3), jnp.zeros((4, 10), jnp.float32), grad),
        _lowered_text(
            lambda scores, target: nn_ops.nll_loss_backward(jnp.ones((), jnp.float32), scores, target, None, 1, -100, jnp.asarray(4.0, jnp.float32)),
            grad, jnp.asarray([0, 2, 1, 2], jnp.int64),
        ),
    ]
    for text in texts:
        assert "scatter" not in text


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.value)
def test_foreach_norm_matches_cpu_per_tensor(mode: EagerMode) -> None:
    """Each tensor's norm, whatever its dtype, order or size (an empty one included), equals the norm taken alone:
    the shared square root changes no bits."""
    generator = torch.Generator().manual_seed(4)
    tensors = [torch.randn(5, 3, generator=generator), torch.randn(7, generator=generator).double(), torch.zeros(0),
               torch.randn(4, 4, generator=generator).bfloat16(), torch.randn((), generator=generator), torch.randn(64, 32, generator=generator)]
    with eager(mode):
        on_chip = [tensor.to("tpu") for tensor in tensors]
        for order in (2, 1, 3.0):
            together = [host(norm) for norm in torch._foreach_norm(on_chip, order)]
            alone = [host(torch._foreach_norm([tensor], order)[0]) for tensor in on_chip]
            assert [norm.dtype for norm in together] == [tensor.dtype for tensor in tensors]
            assert all(torch.equal(a, b) for a, b in zip(together, alone))
            assert_matches_cpu(together, list(torch._foreach_norm(tensors, order)))


def test_foreach_two_norm_takes_one_square_root_per_dtype() -> None:
    """A square root per tensor is a kernel per tensor on XLA:CPU; the lowering takes one per dtype."""
    arrays = [jnp.ones((16, 8), jnp.float32), jnp.ones((8,), jnp.float32), jnp.ones((4, 4), jnp.float64), jnp.ones((3,), jnp.float32)]
    text = _lowered_text(lambda *xs: foreach_ops.foreach_norm(list(xs), 2), *arrays)
    assert text.count("stablehlo.sqrt") == 2
