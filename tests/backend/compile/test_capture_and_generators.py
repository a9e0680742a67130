"""Generators and graph capture on tpu tensors: `randint(..., out=)` drawing on the chip, tpu
generators under torch.compile, make_fx's fake and symbolic tracing, and torch.export, each
against torch on the CPU or against the same draws in eager."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
import torch._dynamo
from torch.fx.experimental.proxy_tensor import make_fx

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]


@pytest.fixture
def restores_validate_args() -> Iterator[None]:
    """torch.compile's first use turns `Distribution`'s process-wide argument validation off."""
    default = torch.distributions.Distribution._validate_args
    yield
    torch.distributions.Distribution.set_default_validate_args(default)


# -- randint(..., generator=, out=) ---------------------------------------------------------------


RANDINT_OUT: dict[str, Callable[[torch.Generator, torch.Tensor], torch.Tensor]] = {
    "low_generator_out": lambda g, out: torch.randint(3, 50, (6,), generator=g, out=out),
    "generator_out": lambda g, out: torch.randint(50, (6,), generator=g, out=out),
}
RANDINT_ON_CHIP: dict[str, Callable[[torch.Generator, torch.dtype], torch.Tensor]] = {
    "low_generator_out": lambda g, dtype: torch.randint(3, 50, (6,), generator=g, device="tpu", dtype=dtype),
    "generator_out": lambda g, dtype: torch.randint(50, (6,), generator=g, device="tpu", dtype=dtype),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32], ids=str)
@pytest.mark.parametrize("overload", list(RANDINT_OUT))
def test_randint_out_draws_on_the_chip_from_the_generator(overload: str, dtype: torch.dtype, mode: EagerMode) -> None:
    with eager(mode), warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*runs on the host CPU", category=RuntimeWarning)
        generator = torch.Generator(device="tpu").manual_seed(4)
        out = torch.empty(2, dtype=dtype, device="tpu")  # resized to (6,), as torch's factories do
        result = RANDINT_OUT[overload](generator, out)
        drawn = host(out)
        assert generator.get_offset() == 1
        second = host(RANDINT_OUT[overload](generator, out))
        expected = host(RANDINT_ON_CHIP[overload](torch.Generator(device="tpu").manual_seed(4), dtype))
    assert result is out and drawn.dtype == dtype and drawn.shape == (6,)
    assert torch.equal(drawn, expected)  # the same draw as the factory with device="tpu"
    assert not torch.equal(drawn, second)
    low = 3 if overload == "low_generator_out" else 0
    assert low <= drawn.min() and drawn.max() < 50


# -- torch.compile with a tpu generator -------------------------------------------------------------


def _draws(x: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    scaled = x * 2
    normal = torch.randn(4, generator=generator, device="tpu") + scaled
    uniform_like = torch.rand_like(x, generator=generator)
    uniform = x.clone().uniform_(-1.0, 1.0, generator=generator)
    coins = torch.bernoulli(torch.full_like(x, 0.5), generator=generator)
    return normal.sin(), uniform_like, uniform, coins, scaled + 1


@pytest.mark.usefixtures("restores_validate_args")
@pytest.mark.parametrize("backend", ["tpu", "eager", "aot_eager"])
def test_compiled_draws_with_a_tpu_generator_match_eager(backend: str) -> None:
    torch._dynamo.reset()
    x = torch.arange(4.0, device="tpu")
    compiled = torch.compile(_draws, backend=backend)
    generator = torch.Generator(device="tpu").manual_seed(0)
    got = [[host(value) for value in compiled(x, generator)] for _ in range(2)]
    reference = torch.Generator(device="tpu").manual_seed(0)
    want = [[host(value) for value in _draws(x, reference)] for _ in range(2)]
    for got_call, want_call in zip(got, want, strict=True):
        for got_value, want_value in zip(got_call, want_call, strict=True):
            assert torch.equal(got_value, want_value)
    assert generator.get_offset() == reference.get_offset() == 8
    assert not torch.equal(got[0][0], got[1][0])


# -- make_fx(tracing_mode="fake" | "symbolic") --------------------------------------------------------


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def _pure(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    scores = torch.nn.functional.linear(x, weight) * 2
    return scores.softmax(-1).cumsum(0) + scores.t().sum(0).view(-1, 1)


def _closing_over(model: torch.nn.Module) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """Parameters, factories, a constant, an in-place op and a view: the real tpu tensors the trace
    reads are constants of the graph."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = model(x) + torch.ones(x.shape[0], 2, device=x.device) + torch.arange(2, device=x.device)
        y.add_(1)
        scale = torch.tensor([1.5, 2.5], device=x.device)
        return y.view(-1)[: x.shape[0]].sum() + y.t() * 0.5, (y * scale).cumsum(0)

    return fn


@pytest.mark.parametrize("tracing_mode", ["real", "fake", "symbolic"])
def test_make_fx_graph_of_a_function_gives_the_cpu_values_on_tpu_and_cpu_inputs(tracing_mode: str) -> None:
    torch.manual_seed(0)
    x, weight = torch.randn(5, 3), torch.randn(4, 3)
    graph = make_fx(_pure, tracing_mode=tracing_mode)(x.to("tpu"), weight.to("tpu"))
    assert torch.allclose(host(graph(x.to("tpu"), weight.to("tpu"))), _pure(x, weight), atol=1e-6)
    assert torch.allclose(graph(x, weight), _pure(x, weight), atol=1e-6)


@pytest.mark.parametrize("tracing_mode", ["real", "fake", "symbolic"])
def test_make_fx_graph_closing_over_tpu_parameters_gives_the_cpu_values(tracing_mode: str) -> None:
    reference = _mlp()
    model = copy.deepcopy(reference).to("tpu")
    x = torch.randn(5, 3)
    graph = make_fx(_closing_over(model), tracing_mode=tracing_mode)(x.to("tpu"))
    inputs = [x, torch.randn(7, 3)] if tracing_mode == "symbolic" else [x]
    for value in inputs:
        for got, want in zip(graph(value.to("tpu")), _closing_over(reference)(value), strict=True):
            assert got.device.type == "tpu" and torch.allclose(host(got), want, atol=1e-5)


# -- torch.export -------------------------------------------------------------------------------------


class _Block(torch.nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, width: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = self.norm1(x)
        x = x + self.attention(normed, normed, normed, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def _export_case(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)), torch.randn(5, 6)
    return _Block().eval(), torch.randn(2, 7, 16)


@pytest.mark.parametrize("name", ["mlp", "transformer_block"])
def test_exported_program_runs_on_tpu_and_matches_the_cpu(name: str) -> None:
    reference, x = _export_case(name)
    program = torch.export.export(copy.deepcopy(reference).to("tpu"), (x.to("tpu"),))
    got = program.module()(x.to("tpu"))
    assert got.device.type == "tpu"
    assert torch.allclose(host(got), reference(x), atol=1e-5)
