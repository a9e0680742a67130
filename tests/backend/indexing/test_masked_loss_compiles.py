"""A masked loss in a training loop (`F.cross_entropy(logits[mask], tokens[mask])`, `x[mask].mean()`,
`mse_loss` of two cuts, a reshape of a cut, in-place ops on one, a matmul or einsum with the cut on
either side, `torch.mv` or a layer norm of one, `binary_cross_entropy_with_logits`, `smooth_l1_loss`
or `huber_loss` of cuts, a norm, `F.normalize` or `logsumexp` of one, a cut along dim 1) compiles programs per padded length,
not per count: the loss, its backward and the gradient's scatter through the mask run on the padded
buffers (`cuts`), and the results equal the CPU's in both eager modes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tputrace
from backend_helpers import eager
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.indexing.length_buckets import padded_length
from tputrace.cli.main import main

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_backend_compiles: list[str] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **_: _backend_compiles.append(event) if event == _COMPILE_EVENT else None
)

_POSITIONS = 64  # the masks' elements: (4, 16)
# Counts of the first pass: below and at the padded lengths 20, 24 and 32; then counts of those padded
# lengths not seen before: the second pass compiles nothing.
_FIRST_COUNTS = (17, 22, 30, 20, 24, 32, 18)
_SECOND_COUNTS = (19, 21, 23, 29, 31, 24)

Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]  # (model, tokens, mask) -> loss


def _cross_entropy(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)
    return F.cross_entropy(logits[mask], tokens[mask])


def _softmax_over_rows(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A listwise loss: softmax and log-softmax along the selected rows (the cut dim), against a detached
    softmax of other logits over the same rows; with the token loss, so that the bias (which a softmax
    along the rows cannot see) gets a gradient."""
    logits = model(tokens)[mask]
    teacher = model(tokens.flip(0)).detach()[mask].softmax(0)
    listwise = (logits.softmax(0) * teacher).sum() - (F.log_softmax(logits, dim=0) * teacher).sum()
    return F.cross_entropy(logits, tokens[mask]) + listwise


def _kept_images(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`nll_loss2d`: per-pixel cross-entropy of the samples a mask keeps from a batch of 64 2x2 images
    (each token and its next three in the row), scores (N, C, H, W) cut along N."""
    pixels = torch.stack([tokens.roll(-shift, 1) for shift in range(4)], -1).reshape(64, 2, 2)
    kept = mask.reshape(64)
    return F.cross_entropy(model(pixels).permute(0, 3, 1, 2)[kept], pixels[kept])


def _attention_pooling(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention over the selected positions: a score per selected row, a softmax over them (along the
    cut dim), the rows' weighted sum, then its logits' cross-entropy."""
    hidden = model[0](tokens)[mask]
    weights = (hidden * model[1].weight[0]).sum(-1).softmax(0)
    pooled = (weights.unsqueeze(-1) * hidden).sum(0)
    return F.cross_entropy(model[1](pooled).unsqueeze(0), tokens[0, :1])


def _linear_on_a_3d_cut(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A linear layer on `hidden[mask]` of shape (count, 3, 8) (from (4, 16, 3, 8) and a (4, 16) mask),
    and the cross-entropy of its logits reshaped to (count * 3, 51): views that merge the cut dim with
    the dim after it (a padded length of three times the mask's) or split it again."""
    triples = torch.stack([tokens, tokens.roll(1, 1), tokens.roll(2, 1)], -1)
    logits = model[1](model[0](triples)[mask])
    return F.cross_entropy(logits.reshape(-1, 51), triples[mask].reshape(-1))


def _bias_free_linear_on_a_3d_cut(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`_linear_on_a_3d_cut` without a bias: torch's matmul then gives its (count * 3, 51) product back as
    (count, 3, 51) by `_unsafe_view`, not a view."""
    triples = torch.stack([tokens, tokens.roll(1, 1), tokens.roll(2, 1)], -1)
    logits = F.linear(model[0](triples)[mask], model[1].weight)
    return F.cross_entropy(logits.reshape(-1, 51), triples[mask].reshape(-1))


def _in_place_on_a_cut(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """In-place pointwise ops on the selected rows (and, in the backward of `clamp_`, `logical_and_`)."""
    selected = model(tokens)[mask]
    selected.mul_(2)
    selected.clamp_(-1.0, 1.0)
    return F.cross_entropy(selected, tokens[mask])


def _with_a_score(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor, score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The token loss plus the mean square of a score per selected row, `score(hidden[mask], v)` for a
    1-D `v` (`torch.mv`, `@`, `F.linear` with a 1-D weight)."""
    scores = score(model[0](tokens)[mask], model[1].weight[0])
    return scores.pow(2).mean() + F.cross_entropy(model(tokens)[mask], tokens[mask])


def _columns(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`x[:, mask]`: a cut along dim 1 of (2, 64, 51) logits (the positions of two token sequences that
    the mask keeps), their `mse_loss` against a detached cut alike and their mean logsumexp."""
    pairs = torch.stack([tokens.reshape(64), tokens.flip(0).reshape(64)])
    kept = mask.reshape(64)
    selected = model(pairs)[:, kept]
    return F.mse_loss(selected, model(pairs.flip(0)).detach()[:, kept]) + selected.logsumexp(-1).mean()


LOSSES: dict[str, Loss] = {
    "cross_entropy": _cross_entropy,
    "cross_entropy sum": lambda model, tokens, mask: F.cross_entropy(model(tokens)[mask], tokens[mask], reduction="sum"),
    "x[mask].mean()": lambda model, tokens, mask: model(tokens)[mask].mean(),
    "(a[mask] - b[mask]).pow(2).mean()": lambda model, tokens, mask: (model(tokens)[mask] - model(tokens + 1)[mask]).pow(2).mean(),
    "mse_loss": lambda model, tokens, mask: F.mse_loss(model(tokens)[mask], model(tokens.flip(0)).detach()[mask]),
    "mse_loss sum": lambda model, tokens, mask: F.mse_loss(model(tokens)[mask], model(tokens.flip(0)).detach()[mask], reduction="sum"),
    "cross_entropy label_smoothing": lambda model, tokens, mask: F.cross_entropy(model(tokens)[mask], tokens[mask], label_smoothing=0.1),
    "linear(x[mask])": lambda model, tokens, mask: F.cross_entropy(model[1](model[0](tokens)[mask]), tokens[mask]),
    "x[mask] @ W": lambda model, tokens, mask: F.cross_entropy(model[0](tokens)[mask] @ model[1].weight.t(), tokens[mask]),
    "softmax over the selected rows": _softmax_over_rows,
    "attention over the selected rows": _attention_pooling,
    "cross_entropy of kept images": _kept_images,
    "x[mask].pow(2).sum(), 20 wide as a count": lambda model, tokens, mask: model(tokens)[..., :20][mask].pow(2).sum(),
    "x[mask].cumsum(0)": lambda model, tokens, mask: model(tokens)[mask].cumsum(0).pow(2).mean(),
    "linear on a 3-D cut, cross_entropy of its reshape": _linear_on_a_3d_cut,
    "bias-free linear on a 3-D cut": _bias_free_linear_on_a_3d_cut,
    "x[mask].reshape(-1).pow(2).mean()": lambda model, tokens, mask: model(tokens)[mask].reshape(-1).pow(2).mean(),
    "x[mask].mul_(2).clamp_(-1, 1)": _in_place_on_a_cut,
    "(W @ x[mask].T).T": lambda model, tokens, mask: F.cross_entropy((model[1].weight @ model[0](tokens)[mask].T).T, tokens[mask]),
    "einsum('oh,nh->on', W, x[mask])": lambda model, tokens, mask: F.cross_entropy(
        torch.einsum("oh,nh->on", model[1].weight, model[0](tokens)[mask]).T, tokens[mask]
    ),
    "einsum('nh,oh->no', x[mask], W)": lambda model, tokens, mask: F.cross_entropy(
        torch.einsum("nh,oh->no", model[0](tokens)[mask], model[1].weight), tokens[mask]
    ),
    "torch.mv(x[mask], v)": lambda model, tokens, mask: _with_a_score(model, tokens, mask, torch.mv),
    "x[mask] @ v": lambda model, tokens, mask: _with_a_score(model, tokens, mask, torch.matmul),
    "F.linear(x[mask], w) with a 1-D w": lambda model, tokens, mask: _with_a_score(model, tokens, mask, F.linear),
    "F.layer_norm(x[mask]) with a weight and bias": lambda model, tokens, mask: F.cross_entropy(
        model[1](F.layer_norm(model[0](tokens)[mask], (8,), model[1].weight[0], model[1].weight[1])), tokens[mask]
    ),
    "binary_cross_entropy_with_logits": lambda model, tokens, mask: F.binary_cross_entropy_with_logits(
        model(tokens)[mask], model(tokens.flip(0)).detach().sigmoid()[mask]
    ),
    "binary_cross_entropy_with_logits sum, pos_weight": lambda model, tokens, mask: F.binary_cross_entropy_with_logits(
        model(tokens)[mask], model(tokens.flip(0)).detach().sigmoid()[mask], reduction="sum", pos_weight=model[1].bias.detach().sigmoid() + 0.5
    ),
    "smooth_l1_loss": lambda model, tokens, mask: F.smooth_l1_loss(model(tokens)[mask], model(tokens.flip(0)).detach()[mask], beta=0.5),
    "smooth_l1_loss sum": lambda model, tokens, mask: F.smooth_l1_loss(
        model(tokens)[mask], model(tokens.flip(0)).detach()[mask], reduction="sum"
    ),
    "huber_loss": lambda model, tokens, mask: F.huber_loss(model(tokens)[mask], model(tokens.flip(0)).detach()[mask], delta=0.5),
    "F.normalize(x[mask], dim=-1)": lambda model, tokens, mask: F.cross_entropy(
        model[1](F.normalize(model[0](tokens)[mask], dim=-1)), tokens[mask]
    ),
    "F.normalize(x[mask], dim=0)": lambda model, tokens, mask: F.cross_entropy(
        model[1](F.normalize(model[0](tokens)[mask], dim=0)), tokens[mask]
    ),
    "x[mask].norm()": lambda model, tokens, mask: model(tokens)[mask].norm() + F.cross_entropy(model(tokens)[mask], tokens[mask]),
    "linalg.vector_norm(x[mask], dim=0)": lambda model, tokens, mask: torch.linalg.vector_norm(model(tokens)[mask], dim=0).mean(),
    "logsumexp(x[mask], dim=0)": lambda model, tokens, mask: torch.logsumexp(model(tokens)[mask], dim=0).mean(),
    "logsumexp(x[mask], dim=-1)": lambda model, tokens, mask: torch.logsumexp(model(tokens)[mask], dim=-1).mean(),
    "x[:, mask]": _columns,
}


def _batches(counts: tuple[int, ...], seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tokens, mask) per step, made on the host: the mask has `count` set elements at random places."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, 50, (4, 16), generator=generator), (torch.randperm(_POSITIONS, generator=generator) < count).reshape(4, 16))
        for count in counts
    ]


def _model(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(51, 8), nn.Linear(8, 51)).to(device)


def _train(device: str, loss_of: Loss, batches: list[tuple[torch.Tensor, torch.Tensor]], compiled_from: int) -> tuple[list[torch.Tensor], nn.Module, int]:
    """Losses of an AdamW loop over `batches`, the model after it, and the XLA compiles from step `compiled_from` on."""
    model = _model(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    before = len(_backend_compiles)
    for step, (tokens, mask) in enumerate(batches):
        if step == compiled_from:
            before = len(_backend_compiles)
        loss = loss_of(model, tokens.to(device), mask.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return [loss.cpu() for loss in losses], model, len(_backend_compiles) - before


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(LOSSES))
def test_a_masked_loss_loop_compiles_per_padded_length_and_equals_the_cpu(mode: EagerMode, case: str) -> None:
    """Steps whose counts fall in padded lengths already compiled compile no program; every step's
    loss and the parameters after the loop (so every gradient) equal the CPU's."""
    batches = _batches(_FIRST_COUNTS + _SECOND_COUNTS, seed=1)
    assert {padded_length(count, _POSITIONS) for count in _SECOND_COUNTS} <= {padded_length(count, _POSITIONS) for count in _FIRST_COUNTS}
    expected_losses, expected_model, _ = _train("cpu", LOSSES[case], batches, 0)
    with eager(mode):
        losses, model, compiled = _train("tpu", LOSSES[case], batches, len(_FIRST_COUNTS))
    assert compiled == 0
    torch.testing.assert_close(torch.stack(losses), torch.stack(expected_losses), rtol=1e-5, atol=1e-5)
    for parameter, expected in zip(model.parameters(), expected_model.parameters()):
        torch.testing.assert_close(parameter.detach().cpu(), expected, rtol=1e-5, atol=1e-5)


# Reductions of a cut whose padding, left in, would change them: a norm's terms there must be zero (for
# a negative order, |x|^ord must vanish: the padding counts as +inf), logsumexp's -inf.
CUT_REDUCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "norm()": lambda selected: selected.norm(),
    "vector_norm(ord=1, dim=0)": lambda selected: torch.linalg.vector_norm(selected, 1, dim=0),
    "vector_norm(ord=inf, dim=0)": lambda selected: torch.linalg.vector_norm(selected, float("inf"), dim=0),
    "vector_norm(ord=-1, dim=0)": lambda selected: torch.linalg.vector_norm(selected, -1, dim=0),
    "vector_norm(ord=-inf, dim=0)": lambda selected: torch.linalg.vector_norm(selected, float("-inf"), dim=0),
    "norm(dim=-1, keepdim=True)": lambda selected: selected.norm(dim=-1, keepdim=True),
    "F.normalize(dim=-1)": lambda selected: F.normalize(selected, dim=-1),
    "F.normalize(dim=0)": lambda selected: F.normalize(selected, dim=0),
    "logsumexp(dim=0)": lambda selected: torch.logsumexp(selected, dim=0),
    "logsumexp(dim=-1)": lambda selected: torch.logsumexp(selected, dim=-1),
    "logsumexp(dim=(0, 1), keepdim=True)": lambda selected: torch.logsumexp(selected, dim=(0, 1), keepdim=True),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(CUT_REDUCTIONS))
def test_a_reduction_of_a_cut_leaves_its_padding_out_and_compiles_per_padded_length(mode: EagerMode, case: str) -> None:
    """A norm or logsumexp of `x[mask]` (and its gradient) equals the CPU's for two counts of one padded
    length, and the second count compiles nothing."""
    values = torch.randn(64, 5, generator=torch.Generator().manual_seed(3)) + 0.1
    masks = [torch.randperm(64, generator=torch.Generator().manual_seed(count)) < count for count in (17, 19)]
    assert padded_length(17, 64) == padded_length(19, 64)

    def reduced(device: str, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = values.to(device).requires_grad_()
        result = CUT_REDUCTIONS[case](x[mask.to(device)])
        (gradient,) = torch.autograd.grad((result + result.sin()).sum(), x)
        return result.detach().cpu(), gradient.cpu()

    with eager(mode):
        first = reduced("tpu", masks[0])
        before = len(_backend_compiles)
        second = reduced("tpu", masks[1])
        compiled = len(_backend_compiles) - before
    for got, mask in ((first, masks[0]), (second, masks[1])):
        for value, expected in zip(got, reduced("cpu", mask)):
            torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-5)
    assert compiled == 0


ENTRY_BY_ENTRY_LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "smooth_l1_loss": lambda scores, target: F.smooth_l1_loss(scores, target, beta=0.5),
    "huber_loss": F.huber_loss,
    "binary_cross_entropy_with_logits sum": lambda scores, target: F.binary_cross_entropy_with_logits(scores, target.sigmoid(), reduction="sum"),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(ENTRY_BY_ENTRY_LOSSES))
def test_a_bfloat16_loss_of_cuts_sums_its_entries_in_float32_as_the_cpu_does(mode: EagerMode, case: str) -> None:
    """A bfloat16 loss of two cuts, reduced over their real entries on the padded buffers, is summed in
    float32 and rounded once, as the CPU's is (a bfloat16 sum is a few units in the last place off)."""
    generator = torch.Generator().manual_seed(0)
    scores, target = torch.randn(64, 51, generator=generator), torch.randn(64, 51, generator=generator)
    mask = torch.randperm(64, generator=generator) < 19
    expected = ENTRY_BY_ENTRY_LOSSES[case](scores.bfloat16()[mask], target.bfloat16()[mask])
    with eager(mode):
        chip_mask = mask.to("tpu")
        got = ENTRY_BY_ENTRY_LOSSES[case](scores.bfloat16().to("tpu")[chip_mask], target.bfloat16().to("tpu")[chip_mask]).cpu()
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=0)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_count_equal_to_its_padded_length_reuses_that_lengths_programs(mode: EagerMode) -> None:
    """A mask whose count is exactly a padded length (20, 24, 32) selects a whole-length cut: after other
    counts of those lengths, its steps compile nothing, and its losses equal the CPU's."""
    first, exact = (17, 22, 30), (20, 24, 32)
    assert [padded_length(count, _POSITIONS) for count in first] == list(exact)
    batches = _batches(first + exact, seed=2)
    expected_losses, _, _ = _train("cpu", _cross_entropy, batches, 0)
    with eager(mode):
        losses, _, compiled = _train("tpu", _cross_entropy, batches, len(first))
    assert compiled == 0
    torch.testing.assert_close(torch.stack(losses), torch.stack(expected_losses), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_an_expand_written_by_a_custom_backward_after_a_cut_is_still_refused(mode: EagerMode) -> None:
    """Only autograd's own formulas get the padded `expand` of a mean's gradient: an expand that a custom
    Function's backward writes into, to the length of a recent cut, stays an expanded view, and torch
    refuses the write as on the CPU."""

    class Doubling(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
            return grad[:1].expand(3).add_(1.0)

    with eager(mode):
        values = torch.arange(10.0, device="tpu")
        assert values[values < 3].sum().item() == 3.0  # a cut of length 3
        x = torch.ones(3, device="tpu", requires_grad=True)
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            torch.autograd.grad(Doubling.apply(x).sum(), x)


_SCRIPT = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.tpu.set_eager_mode(torch.tpu.EagerMode.{mode})
torch.manual_seed(0)
generator = torch.Generator().manual_seed(0)
model = nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 100)).to("tpu")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for count in {counts}:
    tokens = torch.randint(0, 100, (4, 16), generator=generator).to("tpu")
    mask = (torch.randperm(64, generator=generator) < count).reshape(4, 16).to("tpu")
{loss}
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(float(loss))
"""
# Twelve steps through the padded lengths 20, 24 and 32 in turn (three counts, then the lengths
# themselves), then six steps of counts not seen before, of the same padded lengths.
_SEEN_COUNTS = (17, 21, 29) * 3 + (20, 24, 32)
_NEW_COUNTS = (18, 22, 30, 19, 23, 31)
_SCRIPT_LOSSES = {  # the loop's loss lines
    "cross_entropy": """
    logits = model(tokens)
    loss = F.cross_entropy(logits[mask], tokens[mask])""",
    "a 3-D cut, scaled in place, its linear layer and reshaped loss": """
    pairs = torch.stack([tokens, tokens.roll(1, 1)], -1)
    hidden = model[0](pairs)[mask]
    hidden.mul_(2)
    loss = F.cross_entropy(model[1](hidden).reshape(-1, 100), pairs[mask].reshape(-1))""",
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(_SCRIPT_LOSSES))
def test_a_traced_masked_loss_loop_compiles_per_padded_length(tmp_path: Path, mode: EagerMode, case: str) -> None:
    """The user's loop compiles no program in the steps whose counts are new but whose padded
    lengths are not; every compile is in the trace (JAX's own count), and a new padded length's
    recompile names the size that changed."""
    script = tmp_path / "masked.py"
    script.write_text(_SCRIPT.format(mode=mode.name, counts=_SEEN_COUNTS + _NEW_COUNTS, loss=_SCRIPT_LOSSES[case]))
    trace_path = tmp_path / "masked.tptrace"
    before = len(_backend_compiles)
    assert main(["run", "-o", str(trace_path), str(script)]) == 0
    with tputrace.open(trace_path) as trace:
        assert trace.count("compiles") == len(_backend_compiles) - before
        assert trace.count("steps", where="source = 'optimizer'") == len(_SEEN_COUNTS) + len(_NEW_COUNTS)
        assert trace.sql("SELECT COUNT(*) FROM compiles WHERE step >= ?", (len(_SEEN_COUNTS),)) == [(0,)]
        diffs = [trace.string(diff_sid) or "" for (diff_sid,) in trace.sql("SELECT diff_sid FROM compiles WHERE reason = 'recompile'")]
    assert any("20 -> 24" in diff for diff in diffs)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_masked_fill_of_a_slice_laid_out_as_a_cut_writes_only_the_slice(mode: EagerMode) -> None:
    """`y[:25]` of a 28-long tensor has the layout of a cut of length 25 from a padded length of 28, so
    its `masked_fill_` takes the cut's route: the entries of `y` past the slice keep their values, and
    the cut itself and what it was cut from equal the CPU's."""

    def fill(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        values = torch.arange(40.0, device=device)
        selected = values[values < 25]
        assert padded_length(len(selected), 40) == 28
        mask = selected > 3
        whole = torch.full((28,), 7.0, device=device)
        whole[:25].masked_fill_(torch.ones_like(mask), 1.0)  # set in the padding too: a write there would show
        selected.masked_fill_(mask, -1.0)
        return whole.cpu(), selected.cpu(), values.cpu()

    expected = fill("cpu")
    with eager(mode):
        for result, wanted in zip(fill("tpu"), expected):
            torch.testing.assert_close(result, wanted)
