"""multilabel_margin_loss on tpu: values, shapes and input gradients match torch's CPU kernel in both
eager modes, for every reduction, 1-D and 2-D inputs, targets ended by -1 (later entries do not
count) and repeated target labels; both ops run on the chip."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from backend_helpers import eager, host, recorded_fallbacks
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
REDUCTIONS = ("none", "mean", "sum")


def _cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 6, generator=generator)
    targets = torch.tensor([[1, -1, 0, 0, 2, 3], [3, 3, -1, 2, 0, 0], [0, 1, 2, 3, 4, 5], [-1, 2, 3, 0, 0, 0], [5, 4, 5, -1, 1, 1]])
    return {
        "reported": (torch.tensor([[0.1, 0.2, 0.4, 0.8]]), torch.tensor([[1, -1, 0, 0]])),
        "matrix": (scores, targets),
        "matrix_float64": (scores.double(), targets),
        "no_terminator": (scores[:2], torch.tensor([[0, 4, 4, 1, 2, 5], [3, 3, 3, 3, 3, 3]])),
        "vector": (scores[1], targets[1]),
        "vector_no_terminator": (scores[2], torch.tensor([2, 0, 2, 5, 1, 1])),
        "one_class": (scores[0, :1], torch.tensor([0])),
        "scalar": (torch.tensor(0.3), torch.tensor(0)),
        "scalar_terminator": (torch.tensor(0.3), torch.tensor(-1)),
    }


def _loss_and_grad(device: str, scores: torch.Tensor, target: torch.Tensor, reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = scores.detach().to(device).requires_grad_()
    loss = F.multilabel_margin_loss(leaf, target.to(device), reduction=reduction)
    weights = torch.linspace(0.5, 2.0, loss.numel(), dtype=loss.dtype).reshape(loss.shape).to(device)
    (loss * weights).sum().backward()
    return host(loss), host(leaf.grad)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", list(_cases()))
def test_loss_and_gradient_match_the_cpu(mode: EagerMode, reduction: str, case: str) -> None:
    scores, target = _cases()[case]
    expected_loss, expected_grad = _loss_and_grad("cpu", scores, target, reduction)
    with eager(mode), recorded_fallbacks() as fallbacks:
        loss, grad = _loss_and_grad("tpu", scores, target, reduction)
    assert fallbacks == []
    assert loss.shape == expected_loss.shape
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("reduction", [0, 1, 2], ids=REDUCTIONS)
def test_the_ops_outputs_match_the_cpu(mode: EagerMode, reduction: int) -> None:
    """The forward op's is_target and the backward op on its own, with a per-sample grad for 'none'."""
    scores, target = _cases()["matrix"]
    grad_output = torch.tensor([0.5, -1.0, 2.0, 1.5, 0.25]) if reduction == 0 else torch.tensor(1.5)
    aten = torch.ops.aten

    def run(device: str) -> tuple[torch.Tensor, ...]:
        moved = [tensor.to(device) for tensor in (scores, target, grad_output)]
        loss, is_target = aten.multilabel_margin_loss_forward(moved[0], moved[1], reduction)
        grad = aten.multilabel_margin_loss_backward(moved[2], moved[0], moved[1], reduction, is_target)
        return host(loss), host(is_target), host(grad)

    expected = run("cpu")
    with eager(mode):
        got = run("tpu")
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(
    "shapes, message",
    [(((2, 3), (3,)), "inconsistent target size"), (((2, 0), (2, 0)), "Expected non-empty vector or matrix"), (((2, 3, 4), (2, 3, 4)), "Expected non-empty vector or matrix")],
    ids=["target_size", "no_classes", "three_d"],
)
def test_bad_shapes_raise_torchs_error(shapes: tuple, message: str) -> None:
    scores_shape, target_shape = shapes
    with pytest.raises(RuntimeError, match=message):
        F.multilabel_margin_loss(torch.zeros(scores_shape, device="tpu"), torch.zeros(target_shape, dtype=torch.long, device="tpu"))
