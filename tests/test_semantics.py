"""Tensor semantics on `tpu`: dtypes, views, in-place ops, printing, saving, autograd, autocast, fallback."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch

from backend_helpers import host

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes_round_trip(dtype: torch.dtype) -> None:
    values = torch.arange(6).reshape(2, 3)
    cpu = values % 2 == 0 if dtype == torch.bool else values.to(dtype)
    back = host(cpu.to("tpu"))
    assert back.dtype == dtype and torch.equal(back, cpu)


def test_int64_stays_64_bit() -> None:
    big = torch.tensor([2**40, -(2**41)])
    assert host(big.to("tpu") + 1).tolist() == [2**40 + 1, -(2**41) + 1]
    assert (big.to("tpu") * 2).dtype == torch.int64


def test_writes_through_views_reach_the_base_and_back() -> None:
    base = torch.zeros(3, 4, device="tpu")
    row = base[1]
    row.fill_(5)
    assert host(base)[1].tolist() == [5.0] * 4
    base.add_(1)
    assert host(row).tolist() == [6.0] * 4
    base.t()[0, 2] = 9
    assert base[2, 0].item() == 9
    base.view(-1)[0] = -1
    assert base[0, 0].item() == -1
    alias = base.detach()
    alias.zero_()
    assert base.abs().sum().item() == 0
    chunk = base[:, 1:3]
    chunk.copy_(torch.ones(3, 2))
    assert host(base).sum().item() == 6


def test_in_place_and_out_variants() -> None:
    x = torch.arange(4.0, device="tpu")
    x.mul_(2).add_(1)
    assert host(x).tolist() == [1.0, 3.0, 5.0, 7.0]
    out = torch.empty(4, device="tpu")
    torch.add(x, 1, out=out)
    assert host(out).tolist() == [2.0, 4.0, 6.0, 8.0]
    integers = torch.arange(4, device="tpu")
    integers += 1
    assert integers.dtype == torch.int64 and host(integers).tolist() == [1, 2, 3, 4]


def test_print_repr_tolist_numpy_item() -> None:
    x = torch.tensor([[1.5, 2.0]], device="tpu")
    assert repr(x) == "tensor([[1.5000, 2.0000]], device='tpu:0')"
    assert repr(torch.tensor([1, 2], device="tpu", dtype=torch.int32)) == "tensor([1, 2], device='tpu:0', dtype=torch.int32)"
    assert "grad_fn=<MulBackward0>" in repr(torch.ones(1, device="tpu", requires_grad=True) * 2)
    assert x.tolist() == [[1.5, 2.0]] and x.numpy().shape == (1, 2)
    assert x.sum().item() == 3.5 and f"{x.sum():.1f}" == "3.5"
    assert bool(x.sum() > 3)


def test_factories() -> None:
    assert host(torch.zeros(2, 2, device="tpu")).sum().item() == 0
    assert host(torch.ones(3, device="tpu", dtype=torch.int32)).tolist() == [1, 1, 1]
    assert host(torch.full((2,), 7.0, device="tpu")).tolist() == [7.0, 7.0]
    assert host(torch.arange(1, 7, 2, device="tpu")).tolist() == [1, 3, 5]
    assert host(torch.linspace(0, 1, 3, device="tpu")).tolist() == [0.0, 0.5, 1.0]
    uniform = host(torch.rand(1000, device="tpu"))
    assert 0 <= uniform.min() and uniform.max() < 1 and abs(uniform.mean().item() - 0.5) < 0.05
    normal = host(torch.randn(2000, device="tpu"))
    assert abs(normal.mean().item()) < 0.1 and abs(normal.std().item() - 1) < 0.1
    integers = host(torch.randint(0, 5, (100,), device="tpu"))
    assert integers.min() >= 0 and integers.max() < 5
    filled = torch.empty(1000, device="tpu").normal_(3.0, 0.5)
    assert abs(host(filled).mean().item() - 3.0) < 0.1
    kept = host(torch.nn.functional.dropout(torch.ones(1000, device="tpu"), 0.5))
    assert set(kept.unique().tolist()) <= {0.0, 2.0} and 300 < (kept == 0).sum() < 700


def test_save_load_deepcopy_state_dict() -> None:
    model = torch.nn.Linear(3, 2).to("tpu")
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded["weight"].device.type == "tpu" and torch.equal(host(loaded["weight"]), host(model.weight))
    clone = copy.deepcopy(model)
    assert clone.weight.device.type == "tpu" and torch.equal(host(clone.weight), host(model.weight))
    other = torch.nn.Linear(3, 2).to("tpu")
    other.load_state_dict(model.state_dict())
    assert torch.equal(host(other.bias), host(model.bias))


def test_autograd_matches_cpu() -> None:
    torch.manual_seed(0)
    weights = torch.randn(5, 3, requires_grad=True)
    inputs = torch.randn(4, 5)
    (torch.tanh(inputs @ weights).pow(2).mean()).backward()
    expected = weights.grad.clone()
    tpu_weights = weights.detach().to("tpu").requires_grad_()
    (torch.tanh(inputs.to("tpu") @ tpu_weights).pow(2).mean()).backward()
    assert torch.allclose(host(tpu_weights.grad), expected, atol=1e-6)


def test_autocast_to_bfloat16() -> None:
    a, b = torch.randn(4, 4, device="tpu"), torch.randn(4, 4, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        product = a @ b
        probabilities = torch.softmax(product, dim=-1)
    assert product.dtype == torch.bfloat16 and probabilities.dtype == torch.float32


def test_op_without_lowering_falls_back_correctly_and_warns_once() -> None:
    values = torch.tensor([3, 1, 3, 0, 1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unique = torch.unique(values.to("tpu"))
        torch.unique(values.to("tpu"))
    assert host(unique).tolist() == [0, 1, 3]
    fallback_warnings = [warning for warning in caught if "runs on the host CPU" in str(warning.message)]
    assert len(fallback_warnings) <= 1
