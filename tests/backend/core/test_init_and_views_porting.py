"""Parameter initialization, in-place writes through views and type promotion as ported CUDA code
uses them, on `tpu` against the CPU in both eager modes."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn as nn

from backend_helpers import eager, host, recorded_fallbacks
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
mode_ids = pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)


@pytest.fixture
def host_fallbacks() -> Iterator[list[str]]:
    """The names of the ops that ran on the host CPU during the test."""
    with recorded_fallbacks() as names:
        yield names


FACTORIES_INTO_OUT: dict[str, Callable[[str], torch.Tensor]] = {
    "nn.init.eye_": lambda d: nn.init.eye_(torch.empty(3, 5, device=d)),
    "nn.init.eye_ float64": lambda d: nn.init.eye_(torch.empty(4, 2, dtype=torch.float64, device=d)),
    "nn.init.eye_ on a column slice": lambda d: (lambda w: (nn.init.eye_(w[:, 1:]), w)[1])(torch.full((3, 5), 9.0, device=d)),
    "eye into an empty int64 out": lambda d: torch.eye(2, 4, out=torch.empty(0, dtype=torch.int64, device=d)),
    "arange into an empty out": lambda d: torch.arange(5, out=torch.empty(0, device=d)),
    "arange with a float step into int64": lambda d: torch.arange(0, 5, 1.5, out=torch.empty(0, dtype=torch.int64, device=d)),
    "arange into a strided column": lambda d: (lambda w: (torch.arange(3, out=w[:, 1]), w)[1])(torch.full((3, 5), 9.0, device=d)),
    "linspace into float64": lambda d: torch.linspace(0, 1, 7, out=torch.empty(7, dtype=torch.float64, device=d)),
    "full of a float into int64": lambda d: torch.full((3,), 2.7, out=torch.empty(3, dtype=torch.int64, device=d)),
    "zeros into bool": lambda d: torch.zeros(2, 2, out=torch.empty(4, dtype=torch.bool, device=d)),
    "ones into bfloat16": lambda d: torch.ones(2, 3, out=torch.empty(6, dtype=torch.bfloat16, device=d)),
    "tril_indices": lambda d: torch.ops.aten.tril_indices.out(3, 3, 0, out=torch.empty(0, dtype=torch.int64, device=d)),
}


@mode_ids
@pytest.mark.parametrize("case", sorted(FACTORIES_INTO_OUT))
def test_factories_into_an_out_tensor_run_on_the_chip(mode: EagerMode, case: str, host_fallbacks: list[str]) -> None:
    """`nn.init.eye_` is `torch.eye(*shape, out=weight)`: a factory's `out=` overload ran on the host
    CPU (no functional overload matched, as the factory's also takes dtype and device). It makes the
    value in the out tensor's dtype on its chip now, resized without a warning as torch does."""
    call = FACTORIES_INTO_OUT[case]
    expected = call("cpu")
    with eager(mode), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = host(call("tpu"))
    assert [str(warning.message) for warning in caught] == []
    assert host_fallbacks == []
    assert result.dtype == expected.dtype
    torch.testing.assert_close(result, expected, rtol=1e-6, atol=1e-6)


@mode_ids
def test_random_factories_into_an_out_tensor_draw_on_the_chip(mode: EagerMode, host_fallbacks: list[str]) -> None:
    """`torch.rand(n, out=t)` draws from the chip's stream (seeded by `torch.tpu.manual_seed`), not the host's."""
    with eager(mode):
        torch.tpu.manual_seed(7)
        first = host(torch.rand(1000, out=torch.empty(0, device="tpu")))
        torch.tpu.manual_seed(7)
        again = host(torch.rand(1000, out=torch.empty(0, device="tpu")))
        ints = host(torch.randint(2, 9, (1000,), out=torch.empty(1000, dtype=torch.int64, device="tpu")))
    assert host_fallbacks == []
    assert torch.equal(first, again)
    assert 0 <= first.min() and first.max() < 1 and abs(first.mean().item() - 0.5) < 0.05
    assert ints.dtype == torch.int64 and ints.min() >= 2 and ints.max() < 9


DEVICE_FACTORIES: dict[str, Callable[[str], torch.Tensor]] = {
    "arange int64 with a float step": lambda d: torch.arange(0, 5, 1.5, dtype=torch.int64, device=d),
    "arange int32 with a float step": lambda d: torch.arange(0, 5, 1.5, dtype=torch.int32, device=d),
    "arange int32 counting down from a float": lambda d: torch.arange(2.5, -3.2, -1, dtype=torch.int32, device=d),
    "arange uint8 counting down from a float": lambda d: torch.arange(5, 0, -1.5, dtype=torch.uint8, device=d),
    "arange int32 with a step under one": lambda d: torch.arange(0, 1, 0.1, dtype=torch.int32, device=d),
    "arange float64": lambda d: torch.arange(0, 1, 0.1, dtype=torch.float64, device=d),
    "linspace float64": lambda d: torch.linspace(0, 1, 7, dtype=torch.float64, device=d),
    "linspace float64 counting down": lambda d: torch.linspace(1, 0, 6, dtype=torch.float64, device=d),
    "linspace int64": lambda d: torch.linspace(-1, 10, 4, dtype=torch.int64, device=d),
    "eye bool": lambda d: torch.eye(2, 3, dtype=torch.bool, device=d),
    "kaiser_window float64": lambda d: torch.kaiser_window(6, dtype=torch.float64, device=d),
    "kaiser_window into an out tensor": lambda d: torch.ops.aten.kaiser_window.beta_out(5, False, 3.0, out=torch.empty(0, dtype=torch.float64, device=d)),
}
# jnp.kaiser's Bessel function is not torch's: equal to within a few ulps, not exactly.
FACTORY_TOLERANCES = {"kaiser_window float64": 1e-14, "kaiser_window into an out tensor": 1e-14}


@mode_ids
@pytest.mark.parametrize("case", sorted(DEVICE_FACTORIES))
def test_factories_on_the_chip_match_the_cpu_exactly(mode: EagerMode, case: str, host_fallbacks: list[str]) -> None:
    """`torch.arange(..., device="tpu")` ran a second, plain `jnp.arange` kernel rather than the
    registered lowering: an int32 arange with float bounds came back float64 with other values, an
    int64 one fell back to the host, and float64 linspace missed torch's values by an ulp."""
    call = DEVICE_FACTORIES[case]
    expected = call("cpu")
    with eager(mode):
        result = host(call("tpu"))
    assert host_fallbacks == []
    assert result.dtype == expected.dtype
    tolerance = FACTORY_TOLERANCES.get(case, 0.0)
    torch.testing.assert_close(result, expected, rtol=tolerance, atol=tolerance)


PARTLY_OVERLAPPING_WRITES: dict[str, Callable[[torch.Tensor], object]] = {
    "shift by copy_ (x[1:] = x[:-1])": lambda x: x.__setitem__(slice(1, None), x[:-1]),
    "add_ of the transpose": lambda x: x[:9].view(3, 3).add_(x[:9].view(3, 3).t()),
    "copy_ of the transpose": lambda x: x[:9].view(3, 3).copy_(x[:9].view(3, 3).t()),
    "addcmul_ of a shifted slice": lambda x: x[:5].addcmul_(x[1:6], x[5:]),
    "sub_ of an element": lambda x: x.sub_(x[0]),
    "index_add_ of a slice": lambda x: x[:5].index_add_(0, torch.tensor([0, 1], device=x.device), x[1:3]),
    "add into an out that overlaps an input": lambda x: torch.add(x[1:6], x[5:], out=x[:5]),
    "cat into an out that overlaps an input": lambda x: torch.cat([x[1:3], x[3:5]], out=x[:4]),
}
ALLOWED_ALIASED_WRITES: dict[str, Callable[[torch.Tensor], object]] = {
    "add_ of itself": lambda x: x.add_(x),
    "add_ of the same slice": lambda x: x[1:].add_(x[1:]),
    "add_ of a disjoint slice": lambda x: x[:5].add_(x[5:]),
    "add_ of interleaved strided slices": lambda x: x[::2].add_(x[1::2]),
    "mul_ by an element outside the slice": lambda x: x[1:4].mul_(x[0]),
    "fill_ with an element": lambda x: x[:5].fill_(x[1]),
    "masked_fill_ with an element": lambda x: x[:5].masked_fill_(x[:5] > 2, x[1]),
    "masked_scatter_ of a shifted slice": lambda x: x[:5].masked_scatter_(torch.ones(5, dtype=torch.bool, device=x.device), x[1:6]),
    "add_ of its .data": lambda x: x.add_(x.data),
}


@mode_ids
@pytest.mark.parametrize("case", sorted(PARTLY_OVERLAPPING_WRITES))
def test_a_write_an_input_partly_overlaps_raises_torchs_error(mode: EagerMode, case: str) -> None:
    """XLA computes these as if the input were cloned first; the CPU and CUDA refuse them, and code
    that ran on tpu would fail there. tpu refuses them with torch's error and leaves x unchanged."""
    write = PARTLY_OVERLAPPING_WRITES[case]
    with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
        write(torch.arange(10.0))
    with eager(mode):
        x = torch.arange(10.0, device="tpu")
        with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
            write(x)
        assert torch.equal(host(x), torch.arange(10.0))


@mode_ids
@pytest.mark.parametrize("case", sorted(ALLOWED_ALIASED_WRITES))
def test_writes_torch_allows_between_aliases_match_the_cpu(mode: EagerMode, case: str) -> None:
    write = ALLOWED_ALIASED_WRITES[case]
    expected = torch.arange(10.0)
    write(expected)
    with eager(mode):
        x = torch.arange(10.0, device="tpu")
        write(x)
        result = host(x)
    torch.testing.assert_close(result, expected)


@mode_ids
def test_mm_into_an_out_that_overlaps_an_input_is_allowed(mode: EagerMode) -> None:
    """torch allows it; what the CPU then writes depends on its BLAS (one zeroes the output before
    reading the inputs, another does not), so tpu is held to the product of the inputs as they were."""
    on_host = torch.arange(10.0)
    torch.mm(on_host[:4].view(2, 2), on_host[1:5].view(2, 2), out=on_host[:4].view(2, 2))  # allowed on the CPU
    expected = torch.arange(10.0)
    expected[:4] = (torch.arange(4.0).view(2, 2) @ torch.arange(1.0, 5.0).view(2, 2)).reshape(4)
    with eager(mode):
        x = torch.arange(10.0, device="tpu")
        torch.mm(x[:4].view(2, 2), x[1:5].view(2, 2), out=x[:4].view(2, 2))
        result = host(x)
    torch.testing.assert_close(result, expected)
