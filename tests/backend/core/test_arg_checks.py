"""Bad arguments on `tpu` raise torch's own error, as on the CPU, in both eager modes; good ones still run."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core import arg_checks

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)

# Each call takes a device; on the CPU it raises, and the tpu must raise the same message.
REFUSED: dict[str, Callable[[str], object]] = {
    # shapes, dtypes and constants: refused by torch's meta kernel, confirmed on the host
    "layer_norm shape": lambda d: F.layer_norm(torch.zeros(2, 3, device=d), (4,)),
    "masked_fill float mask": lambda d: torch.zeros(3, device=d).masked_fill(torch.zeros(3, device=d), 1.0),
    "repeat fewer dims": lambda d: torch.zeros(2, 3, device=d).repeat(2),
    "roll shifts and dims": lambda d: torch.zeros(2, 3, device=d).roll((1, 2), (0,)),
    "lerp dtypes": lambda d: torch.lerp(torch.ones(3, device=d), torch.ones(3, dtype=torch.float64, device=d), 0.5),
    "mean of integers": lambda d: torch.arange(4, device=d).mean(),
    "kthvalue k past the end": lambda d: torch.arange(4.0, device=d).kthvalue(9),
    "max_pool output empty": lambda d: F.max_pool2d(torch.zeros(1, 1, 2, 2, device=d), 3),
    "reflect pad too wide": lambda d: F.pad(torch.zeros(1, 1, 3, device=d), (5, 5), mode="reflect"),
    "nll_loss weight size": lambda d: F.nll_loss(torch.zeros(2, 3, device=d), torch.zeros(2, dtype=torch.long, device=d), weight=torch.ones(4, device=d)),
    "histc bins 0": lambda d: torch.histc(torch.zeros(3, device=d), bins=0),
    "arange step sign": lambda d: torch.arange(0, 5, -1, device=d),
    # Python numbers, checked on every call
    "integer to a negative power": lambda d: torch.arange(3, device=d) ** -1,
    "integer pow_ negative": lambda d: torch.arange(3, device=d).pow_(-2),
    "uniform_ from > to": lambda d: torch.zeros(3, device=d).uniform_(2, 1),
    "randint low >= high": lambda d: torch.randint(5, 2, (3,), device=d),
    "randint high 0": lambda d: torch.randint(0, (3,), device=d),
    "random_ low >= high": lambda d: torch.zeros(3, device=d).random_(5, 2),
    "uniform_ of integers": lambda d: torch.zeros(3, dtype=torch.int64, device=d).uniform_(),
    "random_ past bool's range": lambda d: torch.zeros(3, dtype=torch.bool, device=d).random_(0, 5),
    "random_ past uint8's range": lambda d: torch.zeros(3, dtype=torch.uint8, device=d).random_(300),
    "std of integers": lambda d: torch.arange(4, device=d).std(),
    "var_mean of integers": lambda d: torch.var_mean(torch.arange(4, device=d)),
    "median over an empty dim": lambda d: torch.zeros(0, 3, device=d).median(0),
    # arguments that must share a dtype (meta kernels do not check), confirmed on stand-ins
    "int32 @ float32": lambda d: torch.ones(2, 2, device=d).int() @ torch.full((2, 2), 0.6, device=d),
    "linear with a float64 weight": lambda d: F.linear(torch.ones(2, 2, device=d), torch.ones(2, 2, device=d).double()),
    "index_put_ of float64 values": lambda d: torch.zeros(3, device=d).index_put_((torch.tensor([0], device=d),), torch.ones(1, device=d).double()),
    "index_add_ of float64 values": lambda d: torch.zeros(3, device=d).index_add_(0, torch.tensor([0], device=d), torch.ones(1, device=d).double()),
    # dtypes a CPU kernel does not take (meta kernels take them all), confirmed on stand-ins
    "softmax of integers": lambda d: torch.softmax(torch.arange(4, device=d), 0),
    "log_softmax of bools": lambda d: torch.log_softmax(torch.ones(4, dtype=torch.bool, device=d), 0),
    "abs of bools": lambda d: torch.ones(3, dtype=torch.bool, device=d).abs(),
    "relu of bools": lambda d: torch.relu(torch.ones(3, dtype=torch.bool, device=d)),
    "gelu of integers": lambda d: F.gelu(torch.arange(3, device=d)),
    "max of complex numbers": lambda d: torch.ones(3, dtype=torch.complex64, device=d).max(),
    "sort of complex numbers": lambda d: torch.ones(3, dtype=torch.complex64, device=d).sort(),
    "bool @ bool": lambda d: torch.ones(2, 2, dtype=torch.bool, device=d) @ torch.ones(2, 2, dtype=torch.bool, device=d),
    "lerp_ of integers in place": lambda d: torch.arange(3, device=d).lerp_(torch.arange(3, device=d), 0.5),
    "layer_norm of integers": lambda d: F.layer_norm(torch.arange(4, device=d).view(1, 4), (4,)),
    "one_hot of floats": lambda d: F.one_hot(torch.ones(3, device=d)),
    "max_pool1d of integers": lambda d: F.max_pool1d(torch.arange(12, device=d).view(1, 3, 4), 2),
    "dropout of complex numbers": lambda d: F.dropout(torch.ones(3, dtype=torch.complex64, device=d), 0.5),
    "max_pool1d of bools": lambda d: F.max_pool1d(torch.ones(3, 4, dtype=torch.bool, device=d), 2),
    # Python numbers an integer dtype cannot hold
    "uint8 fill_ 300": lambda d: torch.zeros(2, dtype=torch.uint8, device=d).fill_(300),
    "int16 clamp max 40000": lambda d: torch.tensor([0, 5], dtype=torch.int16, device=d).clamp(max=40000),
    "uint8 full 300": lambda d: torch.full((2,), 300, dtype=torch.uint8, device=d),
    "uint8 full_like 300": lambda d: torch.full_like(torch.zeros(2, dtype=torch.uint8, device=d), 300),
    "int8 new_full 200": lambda d: torch.zeros(2, dtype=torch.int8, device=d).new_full((3,), 200),
    "int8 where 200": lambda d: torch.where(torch.tensor([True, False], device=d), torch.zeros(2, dtype=torch.int8, device=d), 200),
    "uint8 masked_fill 300": lambda d: torch.zeros(2, dtype=torch.uint8, device=d).masked_fill(torch.tensor([True, False], device=d), 300),
    # writes into memory several elements share
    "expanded add_": lambda d: torch.zeros(1, 3, device=d).expand(2, 3).add_(1),
    "expanded copy_": lambda d: torch.zeros(1, 3, device=d).expand(2, 3).copy_(torch.ones(2, 3, device=d)),
    "expanded out=": lambda d: torch.add(torch.ones(2, 3, device=d), 1, out=torch.zeros(1, 3, device=d).expand(2, 3)),
    "expanded foreach": lambda d: torch._foreach_add_([torch.zeros(1, 3, device=d).expand(2, 3)], 1),
    "round of integers to decimals": lambda d: torch.tensor([15, 25], dtype=torch.int32, device=d).round(decimals=-1),
}

ACCEPTED: dict[str, Callable[[str], torch.Tensor]] = {
    "float to a negative power": lambda d: torch.arange(1.0, 4.0, device=d) ** -1,
    "expanded fill_": lambda d: torch.zeros(1, 3, device=d).expand(2, 3).fill_(2.0),
    "sliced add_": lambda d: torch.zeros(2, 3, device=d)[:, 1:].add_(1),
    "transposed mul_": lambda d: torch.ones(2, 3, device=d).t().mul_(2),
    "round of integers": lambda d: torch.tensor([15, 25], device=d).round(),
    "median of nothing": lambda d: torch.tensor([], device=d).median(),
    "nanmedian of nothing": lambda d: torch.tensor([], device=d).nanmedian(),
    "median over an empty kept dim": lambda d: torch.zeros(0, 3, device=d).median(1).values,
    "random_ to None": lambda d: torch.zeros(3, device=d).random_(2, None).clamp(max=0),
    "uint8 fill_ -1 wraps, as torch allows": lambda d: torch.zeros(2, dtype=torch.uint8, device=d).fill_(-1),
    "uint8 + 300 wraps": lambda d: torch.zeros(2, dtype=torch.uint8, device=d) + 300,
    "a float scalar into an index": lambda d: (lambda t: (t.__setitem__(torch.tensor([0], device=d), 5.0), t)[1])(torch.zeros(3, device=d)),
    "bfloat16 autocast matmul of mixed inputs": lambda d: _autocast_matmul(d),
    "integer @ integer": lambda d: torch.arange(4, device=d).view(2, 2) @ torch.arange(4, device=d).view(2, 2),
    "embedding by integer indices": lambda d: F.embedding(torch.tensor([1, 0], device=d), torch.ones(2, 3, device=d)),
    "integer // integer": lambda d: torch.arange(4, device=d) // torch.tensor([1, 2, 3, 4], device=d),
    "cumsum of bools": lambda d: torch.ones(3, dtype=torch.bool, device=d).cumsum(0),
    "in-place add of integers": lambda d: torch.arange(3, device=d).add_(torch.arange(3, device=d)),
    "max_pool1d of integers with indices": lambda d: F.max_pool1d(torch.arange(12, device=d).view(1, 3, 4), 2, return_indices=True)[0],
    "dropout of complex numbers outside training": lambda d: F.dropout(torch.ones(3, dtype=torch.complex64, device=d), 0.5, training=False),
    "max_pool1d of floats": lambda d: F.max_pool1d(torch.arange(12.0, device=d).view(1, 3, 4), 3, 2, 1),
    # a meta kernel that refuses (no output size) where the host accepts: the op still runs
    "repeat_interleave by a tensor": lambda d: torch.repeat_interleave(torch.tensor([1.0, 2.0], device=d), torch.tensor([2, 1], device=d)),
}


def _autocast_matmul(device: str) -> torch.Tensor:
    with torch.autocast(device, dtype=torch.bfloat16):
        return torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device).half()


def _cpu_error(call: Callable[[str], object]) -> str:
    with pytest.raises(Exception) as raised:
        call("cpu")
    return str(raised.value).splitlines()[0]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_arguments_raise_torchs_error(mode: EagerMode, case: str) -> None:
    call = REFUSED[case]
    expected = _cpu_error(call)
    with eager(mode), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no CPU fallback on the way to the error
        with pytest.raises(RuntimeError) as raised:
            result = call("tpu")
            host(result[0] if isinstance(result, (tuple, list)) else result)
    assert str(raised.value).splitlines()[0] == expected


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_good_arguments_still_match_the_cpu(mode: EagerMode, case: str) -> None:
    call = ACCEPTED[case]
    expected = call("cpu")
    with eager(mode), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        result = host(call("tpu"))
    torch.testing.assert_close(result, expected, equal_nan=True)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_refused_call_leaves_the_device_usable(mode: EagerMode) -> None:
    with eager(mode):
        weights = torch.ones(2, 3, device="tpu")
        total = weights * 2
        with pytest.raises(RuntimeError, match="normalized_shape"):
            F.layer_norm(weights, (4,))
        with pytest.raises(RuntimeError, match="more than one element"):
            weights[:1].expand(2, 3).add_(1)
        assert host(total + weights).tolist() == [[3.0] * 3] * 2


# Value checks torch's CPU kernels make: only in DEFER_NEVER_AND_LAUNCH_BLOCKING (each is a sync).
VALUE_REFUSED: dict[str, Callable[[str], object]] = {
    "embedding index": lambda d: F.embedding(torch.tensor([1, 5], device=d), torch.zeros(4, 3, device=d)),
    "advanced index": lambda d: torch.zeros(3, device=d)[torch.tensor([0, 3], device=d)],
    "gather index": lambda d: torch.zeros(3, device=d).gather(0, torch.tensor([7], device=d)),
    "index_select index": lambda d: torch.zeros(3, device=d).index_select(0, torch.tensor([4], device=d)),
    "cross_entropy target": lambda d: F.cross_entropy(torch.zeros(2, 3, device=d), torch.tensor([0, 3], device=d)),
    "one_hot class": lambda d: F.one_hot(torch.tensor([1, 2], device=d), 2),
    "multinomial negative": lambda d: torch.multinomial(torch.tensor([1.0, -1.0], device=d), 1),
    "bernoulli p > 1": lambda d: torch.bernoulli(torch.full((3,), 2.0, device=d)),
    "index_put_ index": lambda d: torch.zeros(3, device=d).index_put_((torch.tensor([5], device=d),), torch.ones(1, device=d)),
}


@pytest.mark.parametrize("case", sorted(VALUE_REFUSED))
def test_launch_blocking_checks_values_as_the_cpu_does(case: str) -> None:
    call = VALUE_REFUSED[case]
    expected = _cpu_error(call)
    with eager(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING), pytest.raises(Exception) as raised:
        host(call("tpu"))
    assert expected in str(raised.value).splitlines()[0]  # a device assert's message names its op first, as on CUDA


def test_values_are_not_checked_outside_launch_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the index checks off (TPUTRACE_INDEX_CHECKS=0, see test_index_checks), the default modes
    keep XLA's behaviour (no sync, no host fallback per indexing op or device assert); the values in
    range are right."""
    from tputrace.backend.indexing import index_checks

    monkeypatch.setattr(index_checks, "enabled", False)
    for mode in MODES:
        with eager(mode), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            table = torch.arange(12.0, device="tpu").reshape(4, 3)
            assert host(F.embedding(torch.tensor([1, 5], device="tpu"), table))[0].tolist() == [3.0, 4.0, 5.0]
            assert host(F.one_hot(torch.tensor([1, 2], device="tpu"), 2)).tolist() == [[0, 1], [0, 0]]


def test_launch_blocking_passes_values_in_range() -> None:
    with eager(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        table = torch.arange(12.0, device="tpu", requires_grad=True)
        rows = F.embedding(torch.tensor([[0, 3]], device="tpu"), table.reshape(4, 3))
        loss = F.cross_entropy(rows.reshape(2, 3), torch.tensor([2, 0], device="tpu"))
        loss.backward()
    expected = torch.arange(12.0, requires_grad=True)
    F.cross_entropy(F.embedding(torch.tensor([[0, 3]]), expected.reshape(4, 3)).reshape(2, 3), torch.tensor([2, 0])).backward()
    torch.testing.assert_close(host(table.grad), expected.grad)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_as_strided_past_the_end_of_storage_raises_torchs_error(mode: EagerMode) -> None:
    with eager(mode):
        for call in (lambda d: torch.arange(4.0, device=d).as_strided((3,), (2,)), lambda d: torch.arange(4.0, device=d)[1:].as_strided((2,), (1,), 3)):
            expected = _cpu_error(call)
            with pytest.raises(RuntimeError) as raised:
                call("tpu")
            assert str(raised.value) == expected
        inside = torch.arange(6.0, device="tpu").view(2, 3).as_strided((2, 2), (3, 1), 1)
        assert host(inside).tolist() == [[1.0, 2.0], [4.0, 5.0]]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_checking_a_random_op_leaves_the_cpu_draws_as_they_were(mode: EagerMode, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arg_checks, "_kernel_dtypes_taken", set())  # the check runs, as on a signature's first call
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    with eager(mode):
        draws = torch.zeros(4, dtype=torch.int16, device="tpu").random_(0, 10)
        host(draws)
    assert torch.equal(torch.rand(3), expected)
