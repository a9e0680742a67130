"""Ops as real models use them, beyond the OpInfo samples: integer images, half precision near its
limits, boundaries, dtype views, errors, and nn.Transformer inference, on `tpu` against the CPU."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
mode_ids = pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)


def _image(device: str) -> torch.Tensor:
    return torch.tensor([[[[0, 100, 200, 250, 17], [3, 7, 255, 1, 90], [64, 128, 32, 16, 8]]]], dtype=torch.uint8, device=device)


@mode_ids
@pytest.mark.parametrize("resize", ["bilinear", "bicubic"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_uint8_images_interpolate_as_on_the_cpu(mode: EagerMode, resize: str, align_corners: bool) -> None:
    """Interpolated in float and rounded back per axis, saturating; within one level of torch's
    fixed-point CPU kernel."""
    for size in [(1, 7), (5, 9), (2, 2)]:
        expected = F.interpolate(_image("cpu"), size=size, mode=resize, align_corners=align_corners)
        with eager(mode):
            result = host(F.interpolate(_image("tpu"), size=size, mode=resize, align_corners=align_corners))
        assert result.dtype == torch.uint8
        assert (result.int() - expected.int()).abs().max() <= 1


HALF_AND_EDGE_CASES: dict[str, Callable[[str], torch.Tensor]] = {
    "float16 softplus past exp's range": lambda d: F.softplus(torch.tensor([5.0, 11.5, 15.0, 19.0], dtype=torch.float16, device=d)),
    "float16 softplus gradient": lambda d: torch.autograd.grad(
        F.softplus(x := torch.tensor([5.0, 12.0, 19.0], dtype=torch.float16, device=d, requires_grad=True)).sum(), x
    )[0],
    "hardswish gradient at -3 and 3": lambda d: torch.autograd.grad(
        F.hardswish(x := torch.tensor([-3.0, 3.0, 0.0], device=d, requires_grad=True)).sum(), x
    )[0],
    "uint8 shifted right past its width": lambda d: torch.tensor([255, 128, 1], dtype=torch.uint8, device=d) >> 8,
    "int8 shifted right past its width": lambda d: torch.tensor([-128, 64, 1], dtype=torch.int8, device=d) >> 9,
    "float32 read as complex64": lambda d: torch.arange(4.0, device=d).view(torch.complex64) + 0,
    "complex64 read as float32": lambda d: torch.tensor([1 + 2j, 3 - 4j], device=d).view(torch.float32) + 0,
    "complex64 read as int32": lambda d: torch.tensor([[1 + 2j, 3 - 4j]], device=d).view(torch.int32) + 0,
    "write through a complex view of floats": lambda d: (lambda x: (x.view(torch.complex64).mul_(1j), x)[1])(torch.arange(4.0, device=d)),
    "write through a float view of complexes": lambda d: (lambda y: (y.view(torch.float32).add_(1), y)[1])(torch.tensor([1 + 2j, 3 - 4j], device=d)),
}


@mode_ids
@pytest.mark.parametrize("case", sorted(HALF_AND_EDGE_CASES))
def test_edge_cases_match_the_cpu(mode: EagerMode, case: str) -> None:
    call = HALF_AND_EDGE_CASES[case]
    expected = call("cpu")
    with eager(mode):
        result = host(call("tpu"))
    assert result.dtype == expected.dtype
    torch.testing.assert_close(result, expected)


@mode_ids
def test_a_reshape_to_a_wrong_size_raises_torchs_error(mode: EagerMode) -> None:
    with eager(mode):
        for reshape in (lambda t: t.reshape(5, 5), lambda t: t.view(5, 5)):
            with pytest.raises(RuntimeError, match=r"shape '\[5, 5\]' is invalid for input of size 24"):
                reshape(torch.zeros(4, 6, device="tpu"))


@mode_ids
def test_transformer_inference_with_a_padding_mask_matches_the_cpu(mode: EagerMode) -> None:
    """Eval + no_grad with a key padding mask, where torch's fast path would make nested tensors."""
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 2).eval()
    attention = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    inputs = torch.randn(2, 5, 16)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[0, 3:] = True
    with torch.no_grad():
        expected_encoded = encoder(inputs, src_key_padding_mask=padding)
        expected_attended = attention(inputs, inputs, inputs, key_padding_mask=padding)[0]
    with eager(mode), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no CPU fallback
        x, mask = inputs.to("tpu"), padding.to("tpu")
        encoded = host(encoder.to("tpu")(x, src_key_padding_mask=mask))
        attended = host(attention.to("tpu")(x, x, x, key_padding_mask=mask)[0])
    torch.testing.assert_close(encoded[~padding], expected_encoded[~padding], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(attended, expected_attended, rtol=1e-4, atol=1e-5)


def _lowered_backwards(device: str) -> dict[str, object]:
    """Backwards and ops that ran on the host before: grid sampling's (spatial transformers),
    cdist/pdist's (with two points at distance 0), nonzero_static, Embedding(max_norm)."""
    torch.manual_seed(0)
    results: dict[str, object] = {}
    image = torch.randn(2, 3, 5, 6).to(device).requires_grad_()
    theta = torch.tensor([[[0.9, 0.1, 0.05], [-0.1, 1.1, 0.0]]] * 2, device=device, requires_grad=True)
    for sampling in ("bilinear", "nearest"):
        for padding in ("zeros", "border", "reflection"):
            grid = F.affine_grid(theta, [2, 3, 4, 4], align_corners=False)
            sampled = F.grid_sample(image, grid, mode=sampling, padding_mode=padding, align_corners=False)
            results[f"grid_sample {sampling} {padding}"] = torch.autograd.grad(sampled.pow(2).sum(), (image, theta))
    points = torch.randn(4, 3).to(device)
    points[1] = points[0]
    points.requires_grad_()
    others = torch.randn(5, 3).to(device).requires_grad_()
    for p in (1.0, 2.0, 3.0):
        results[f"cdist p={p}"] = torch.autograd.grad(torch.cdist(points, others, p=p).sum(), (points, others))
        results[f"pdist p={p}"] = torch.autograd.grad(F.pdist(points, p=p).sum(), points)
    sparse_rows = torch.zeros(3, 4, device=device)
    sparse_rows[0, 1], sparse_rows[2, 0], sparse_rows[2, 3] = 1.0, 5.0, 2.0
    results["nonzero_static"] = torch.nonzero_static(sparse_rows, size=5)
    torch.manual_seed(1)
    table = torch.nn.Embedding(6, 3, max_norm=1.0).to(device)
    with torch.no_grad():
        table.weight.mul_(3)
    results["Embedding(max_norm)"] = (table(torch.tensor([0, 2, 2], device=device)), table.weight)
    return results


@mode_ids
def test_backwards_and_static_ops_run_on_the_chip(mode: EagerMode) -> None:
    expected = _lowered_backwards("cpu")
    with eager(mode), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no CPU fallback
        results = _lowered_backwards("tpu")
    for name, want in expected.items():
        got = results[name]
        pairs = zip(got, want) if isinstance(want, tuple) else [(got, want)]
        for got_tensor, want_tensor in pairs:
            torch.testing.assert_close(host(got_tensor), want_tensor.detach(), rtol=1e-4, atol=1e-4, msg=name)
