"""torch.func transforms on tpu tensors give what they give on CPU, in both eager modes."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch.func import hessian, jacfwd, jvp, linearize, vmap

from backend_helpers import assert_matches_cpu, eager
from tputrace.backend.compat.device_module import EagerMode

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]


def _on(device: str, values: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(value.to(device) for value in values)


def _sin_times_two(t: torch.Tensor) -> torch.Tensor:
    return torch.sin(t) * 2


def _mixed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * 0.5 + torch.exp(b) * 3.0 - 1.25


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def _jvp_scalar_operand(device: str) -> object:
    """`* 2` inside jvp multiplies by torch's zero tangent of a number, whose kernel moves tensors to meta."""
    torch.manual_seed(0)
    primal, tangent = _on(device, (torch.randn(5), torch.ones(5)))
    return jvp(_sin_times_two, (primal,), (tangent,))


def _jvp_two_inputs(device: str) -> object:
    torch.manual_seed(0)
    primals = _on(device, (torch.randn(4), torch.randn(4)))
    tangents = _on(device, (torch.randn(4), torch.randn(4)))
    return jvp(_mixed, primals, tangents)


def _jacfwd_scalar_operand(device: str) -> object:
    torch.manual_seed(0)
    return jacfwd(_mixed, argnums=(0, 1))(*_on(device, (torch.randn(3), torch.randn(3))))


def _hessian_scalar_operand(device: str) -> object:
    torch.manual_seed(0)
    return hessian(lambda t: (_sin_times_two(t) * t).sum())(torch.randn(4).to(device))


def _vmap_of_jvp(device: str) -> object:
    torch.manual_seed(0)
    primals, tangents = _on(device, (torch.randn(3, 5), torch.randn(3, 5)))
    return vmap(lambda p, t: jvp(_sin_times_two, (p,), (t,)))(primals, tangents)


def _linearize_function(device: str) -> object:
    """linearize traces a jvp with make_fx: the primal it closes over is a constant of the graph."""
    torch.manual_seed(0)
    primal, first, second = _on(device, (torch.randn(5), torch.randn(5), torch.randn(5)))
    output, jvp_fn = linearize(_sin_times_two, primal)
    return output, jvp_fn(first), jvp_fn(second)


def _linearize_mlp(device: str) -> object:
    net = _mlp().to(device)
    torch.manual_seed(1)
    inputs, tangent = _on(device, (torch.randn(6, 3), torch.randn(6, 3)))
    output, jvp_fn = linearize(net, inputs)
    return output, jvp_fn(tangent)


CASES: dict[str, Callable[[str], object]] = {
    "jvp_scalar_operand": _jvp_scalar_operand,
    "jvp_two_inputs": _jvp_two_inputs,
    "jacfwd_scalar_operand": _jacfwd_scalar_operand,
    "hessian_scalar_operand": _hessian_scalar_operand,
    "vmap_of_jvp": _vmap_of_jvp,
    "linearize_function": _linearize_function,
    "linearize_mlp": _linearize_mlp,
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("name", list(CASES))
def test_transform_matches_cpu(name: str, mode: EagerMode) -> None:
    want = CASES[name]("cpu")
    with eager(mode), warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*CPU fallback", category=RuntimeWarning)
        got = CASES[name]("tpu")
    assert_matches_cpu(got, want, device="tpu")


def test_to_meta_is_a_meta_tensor() -> None:
    """`.to("meta")` of a tpu tensor keeps sizes, strides and the asked dtype, and holds no data."""
    source = torch.randn(3, 4).to("tpu").t()
    moved = source.to("meta", torch.float16)
    assert moved.device.type == "meta" and type(moved) is torch.Tensor
    assert moved.shape == source.shape and moved.stride() == source.stride() and moved.dtype == torch.float16
