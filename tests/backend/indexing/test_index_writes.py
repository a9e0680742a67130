"""Indexing writes on `tpu` compute what the CPU computes, or raise the CPU's error, in both eager modes."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

pytestmark = pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8 is now deprecated")

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
MASK = [True, False, True, False]


def _arange(device: str, *shape: int) -> torch.Tensor:
    return torch.arange(float(torch.Size(shape).numel()), device=device).reshape(shape)


def _mask(device: str, values: list[bool] = MASK, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    return torch.tensor(values, device=device).to(dtype)


def _set(target: torch.Tensor, index: object, values: torch.Tensor) -> torch.Tensor:
    target[index] = values
    return target


# Writes through a mask whose values do not match its count of set elements.
MASK_REFUSED: dict[str, Callable[[str], object]] = {
    "setitem 3 values, 2 set": lambda d: _set(torch.zeros(4, device=d), _mask(d), torch.tensor([1.0, 2.0, 3.0], device=d)),
    "index_put_ 2 values, 3 set": lambda d: _arange(d, 4).index_put_((_mask(d, [True, False, True, True]),), torch.tensor([1.0, 2.0], device=d)),
    "index_put_ accumulate 3 values, 2 set": lambda d: _arange(d, 4).index_put_((_mask(d),), torch.tensor([1.0, 2.0, 3.0], device=d), accumulate=True),
    "index_put 2 values, none set": lambda d: torch.index_put(_arange(d, 4), (_mask(d, [False] * 4),), torch.tensor([1.0, 2.0], device=d)),
    "uint8 mask": lambda d: _arange(d, 4).index_put_((_mask(d, dtype=torch.uint8),), torch.tensor([1.0, 2.0, 3.0], device=d)),
    "index_put_ leading 1s": lambda d: _arange(d, 4, 3).index_put_((_mask(d),), _arange(d, 1, 2, 3)),
    "rows: 3 rows, 2 set": lambda d: _arange(d, 4, 3).index_put_((_mask(d),), _arange(d, 3, 3)),
    "2-d mask, 2 values, 3 set": lambda d: _arange(d, 2, 3).index_put_((_arange(d, 2, 3) > 2,), torch.tensor([1.0, 2.0], device=d)),
    "2-d mask over 3-d, 4 rows, 3 set": lambda d: _arange(d, 2, 3, 2).index_put_((_arange(d, 2, 3) > 2,), _arange(d, 4, 2)),
    "mask and a slice": lambda d: _set(_arange(d, 4, 3), (_mask(d), slice(1, None)), _arange(d, 3, 2)),
    "masked_scatter_ too few": lambda d: _arange(d, 4).masked_scatter_(_mask(d), torch.tensor([9.0], device=d)),
    "masked_scatter too few": lambda d: _arange(d, 4).masked_scatter(_mask(d), torch.tensor([9.0], device=d)),
    "masked_scatter_ broadcast mask, too few": lambda d: _arange(d, 2, 4).masked_scatter_(_mask(d), torch.tensor([9.0, 8.0, 7.0], device=d)),
}

# Writes the CPU takes: the tpu must write the same values.
ACCEPTED: dict[str, Callable[[str], torch.Tensor]] = {
    "mask, 2 values, 2 set": lambda d: _arange(d, 4).index_put_((_mask(d),), torch.tensor([7.0, 8.0], device=d)),
    "mask, accumulate": lambda d: _arange(d, 4).index_put_((_mask(d),), torch.tensor([7.0, 8.0], device=d), accumulate=True),
    "mask, one value broadcast": lambda d: _set(_arange(d, 4), _mask(d), torch.tensor([5.0], device=d)),
    "mask, a 0-d value": lambda d: _set(_arange(d, 4), _mask(d), torch.tensor(5.0, device=d)),
    "mask, no values, none set": lambda d: _arange(d, 4).index_put_((_mask(d, [False] * 4),), torch.tensor([], device=d)),
    "mask, rows": lambda d: _arange(d, 4, 3).index_put_((_mask(d),), -_arange(d, 2, 3)),
    "mask, one row broadcast": lambda d: _arange(d, 4, 3).index_put_((_mask(d),), -_arange(d, 3)),
    "mask, a column per set row": lambda d: _arange(d, 4, 3).index_put_((_mask(d),), -_arange(d, 2, 1)),
    "mask, leading 1s": lambda d: _set(_arange(d, 4, 3), _mask(d), -_arange(d, 1, 1, 2, 3)),
    "2-d mask": lambda d: _arange(d, 2, 3).index_put_((_arange(d, 2, 3) > 2,), torch.tensor([7.0, 8.0, 9.0], device=d)),
    "2-d mask over 3-d": lambda d: _arange(d, 2, 3, 2).index_put_((_arange(d, 2, 3) > 2,), -_arange(d, 3, 2)),
    "uint8 mask": lambda d: _arange(d, 4).index_put_((_mask(d, dtype=torch.uint8),), torch.tensor([7.0, 8.0], device=d)),
    "mask and a slice": lambda d: _set(_arange(d, 4, 3), (_mask(d), slice(1, None)), -_arange(d, 2, 2)),
    "slice and a mask": lambda d: _set(_arange(d, 4, 3), (slice(None), _mask(d, [True, False, True])), -_arange(d, 4, 2)),
    "indices, accumulate duplicates": lambda d: _arange(d, 4).index_put_((torch.tensor([0, 0, 2], device=d),), torch.tensor([1.0, 2.0, 3.0], device=d), accumulate=True),
    "negative indices": lambda d: _arange(d, 4).index_put_((torch.tensor([-1, -4], device=d),), torch.tensor([7.0, 8.0], device=d)),
    "all rows and indices": lambda d: _set(_arange(d, 4, 3), (slice(None), torch.tensor([0, 2], device=d)), -_arange(d, 4, 2)),
    "broadcast index tensors": lambda d: _arange(d, 4, 3).index_put_((torch.tensor([[0], [1]], device=d), torch.tensor([0, 2], device=d)), -_arange(d, 2, 2)),
    "index pairs, accumulate duplicates": lambda d: _arange(d, 4, 3).index_put_((torch.tensor([0, 0], device=d), torch.tensor([1, 1], device=d)), torch.tensor([1.0, 2.0], device=d), accumulate=True),
    "slice and indices": lambda d: _set(_arange(d, 4, 3), (slice(1, 3), torch.tensor([0, 2], device=d)), -_arange(d, 2, 2)),
    "None and indices setitem": lambda d: _set(_arange(d, 4, 3), (None, torch.tensor([0, 2], device=d)), -_arange(d, 1, 2, 3)),
    "index_copy_": lambda d: _arange(d, 4, 3).index_copy_(0, torch.tensor([2, 0], device=d), -_arange(d, 2, 3)),
    "index_fill_ negative": lambda d: _arange(d, 4, 3).index_fill_(0, torch.tensor([-1], device=d), 1.0),
    "index_add_ duplicates": lambda d: _arange(d, 4, 3).index_add_(0, torch.tensor([1, 1], device=d), _arange(d, 2, 3), alpha=2),
    "put_ accumulate duplicates": lambda d: _arange(d, 4).put_(torch.tensor([1, 1], device=d), torch.tensor([1.0, 2.0], device=d), accumulate=True),
    "put_ negative": lambda d: _arange(d, 4).put_(torch.tensor([-1], device=d), torch.tensor([7.0], device=d)),
    "take negative": lambda d: _arange(d, 4).take(torch.tensor([-1], device=d)),
    "masked_scatter_ exact": lambda d: _arange(d, 4).masked_scatter_(_mask(d), torch.tensor([9.0, 8.0], device=d)),
    "masked_scatter_ more than needed": lambda d: _arange(d, 4).masked_scatter_(_mask(d), torch.tensor([9.0], device=d).expand(3)),
    "masked_scatter_ broadcast mask": lambda d: _arange(d, 2, 4).masked_scatter_(_mask(d), -_arange(d, 4)),
}

# Indices out of range, which the CPU refuses and XLA clamps or drops: refused in
# DEFER_NEVER_AND_LAUNCH_BLOCKING, where each op waits for the chip anyway (see `arg_checks`).
OUT_OF_RANGE: dict[str, Callable[[str], object]] = {
    "index_put_ past the end": lambda d: _arange(d, 4).index_put_((torch.tensor([5], device=d),), torch.tensor([1.0], device=d)),
    "index_put_ negative past the start": lambda d: _arange(d, 4).index_put_((torch.tensor([-5], device=d),), torch.tensor([1.0], device=d)),
    "index_copy_": lambda d: _arange(d, 4, 3).index_copy_(0, torch.tensor([5, 0], device=d), _arange(d, 2, 3)),
    "index_fill_": lambda d: _arange(d, 4, 3).index_fill_(0, torch.tensor([5], device=d), 1.0),
    "index_add_": lambda d: _arange(d, 4, 3).index_add_(0, torch.tensor([4], device=d), _arange(d, 1, 3)),
    "index_add_ negative": lambda d: _arange(d, 4, 3).index_add_(0, torch.tensor([-1], device=d), _arange(d, 1, 3)),
    "scatter_": lambda d: _arange(d, 4).scatter_(0, torch.tensor([4], device=d), _arange(d, 1)),
    "scatter_ negative": lambda d: _arange(d, 4).scatter_(0, torch.tensor([-1], device=d), _arange(d, 1)),
    "scatter_add_": lambda d: _arange(d, 4).scatter_add_(0, torch.tensor([7], device=d), _arange(d, 1)),
    "scatter_reduce_": lambda d: _arange(d, 4).scatter_reduce_(0, torch.tensor([7], device=d), _arange(d, 1), "amax"),
    "put_": lambda d: _arange(d, 4).put_(torch.tensor([4], device=d), torch.tensor([1.0], device=d)),
    "take": lambda d: _arange(d, 4).take(torch.tensor([4], device=d)),
    "gather negative": lambda d: _arange(d, 4).gather(0, torch.tensor([-1], device=d)),
}


def _cpu_error(call: Callable[[str], object]) -> str:
    with pytest.raises(Exception) as raised:
        call("cpu")
    return str(raised.value).splitlines()[0]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(MASK_REFUSED))
def test_a_mask_write_of_the_wrong_count_raises_torchs_error(mode: EagerMode, case: str) -> None:
    call = MASK_REFUSED[case]
    expected = _cpu_error(call)
    with eager(mode), pytest.raises(RuntimeError) as raised:
        host(call("tpu"))
    assert str(raised.value).splitlines()[0] == expected


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_an_accepted_write_matches_the_cpu(mode: EagerMode, case: str) -> None:
    call = ACCEPTED[case]
    expected = call("cpu")
    with eager(mode), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        result = host(call("tpu"))
    torch.testing.assert_close(result, expected)


@pytest.fixture
def host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The sync kinds of the dispatcher's host reads inside the test."""
    from tputrace.backend.core.dispatch import dispatcher

    kinds: list[str] = []
    to_host = dispatcher.to_host

    def counted(tensor: torch.Tensor, sync_kind: str) -> torch.Tensor:
        kinds.append(sync_kind)
        return to_host(tensor, sync_kind)

    monkeypatch.setattr(dispatcher, "to_host", counted)
    yield kinds


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_only_a_count_the_shapes_cannot_settle_is_read(mode: EagerMode, host_reads: list[str]) -> None:
    """A broadcast value needs no count; values one per set element read the count once, as the
    `nonzero` of CUDA's `index_put_` does."""
    with eager(mode):
        target = _arange("tpu", 4, 3)
        mask = _mask("tpu")
        target[mask] = torch.tensor(5.0, device="tpu")
        target[mask] = -_arange("tpu", 3)
        target.masked_scatter_(mask[:, None], torch.ones(4, 3, device="tpu"))
        assert host_reads == []
        target[mask] = -_arange("tpu", 2, 3)
        assert host_reads == ["data_dependent"]


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_launch_blocking_refuses_indices_out_of_range(case: str) -> None:
    call = OUT_OF_RANGE[case]
    expected = _cpu_error(call)
    with eager(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING), pytest.raises(Exception) as raised:
        host(call("tpu"))
    assert expected in str(raised.value).splitlines()[0]
