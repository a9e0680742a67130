"""A mask beside other indices (`x[mask, idx]`, `x[idx, :, mask]`, `x[:, mask] = v`): results,
gradients and writes equal the CPU's in both eager modes, the host reads only the count, and counts
of one padded length share their programs (JAX compiles nothing for a new count)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import pytest
import torch

from backend_helpers import eager, host, recorded_fallbacks, recorded_host_reads
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.indexing.mask_beside_indices import result_layout

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_backend_compiles: list[str] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **_: _backend_compiles.append(event) if event == _COMPILE_EVENT else None
)


def _grid(device: str) -> torch.Tensor:
    return torch.arange(120.0, device=device).reshape(5, 4, 6)


def _ints(values: list, device: str) -> torch.Tensor:
    return torch.tensor(values, device=device)


# Each case: (x, rows mask (5,), columns mask (4,), plane mask (4, 6)) -> x indexed with a mask and more.
SELECTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "mask, index": lambda x, rows, columns, plane: x[rows, _ints([2], x.device)],
    "mask, 0-dim index": lambda x, rows, columns, plane: x[rows, _ints(3, x.device)],
    "mask, negative index": lambda x, rows, columns, plane: x[rows, :, _ints([-1], x.device)],
    "index, mask": lambda x, rows, columns, plane: x[_ints([4], x.device), columns],
    "column of indices, mask": lambda x, rows, columns, plane: x[_ints([[0], [3], [3]], x.device), columns],
    "index, slice, mask: dims first": lambda x, rows, columns, plane: x[_ints([1], x.device), :, _ints([True, False, True, True, False, True], rows.device)],
    "0-dim index, 2-d mask": lambda x, rows, columns, plane: x[_ints(2, x.device), plane],
    "slice, mask, index": lambda x, rows, columns, plane: x[1:, columns, _ints([5], x.device)],
    "uint8 mask, index": lambda x, rows, columns, plane: x[rows.to(torch.uint8), _ints([1], x.device)],
    "host index": lambda x, rows, columns, plane: x[rows, torch.tensor([0])],
}


def _masks(device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    rows, columns, plane = (torch.rand(shape, generator=generator) < 0.6 for shape in ((5,), (4,), (4, 6)))
    return rows.to(device), columns.to(device), plane.to(device)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("mask_device", ["cpu", "tpu"])
@pytest.mark.parametrize("case", sorted(SELECTIONS))
def test_a_selection_matches_the_cpu_reading_only_the_count(mode: EagerMode, mask_device: str, case: str) -> None:
    select = SELECTIONS[case]
    expected_input = _grid("cpu").requires_grad_()
    expected = select(expected_input, *_masks("cpu", 0))
    expected.pow(2).sum().backward()
    with eager(mode), recorded_fallbacks() as fallbacks:
        grid = _grid("tpu").requires_grad_()
        masks = _masks(mask_device, 0)
        if "uint8" in case:  # torch's meta kernel refuses it: the shape's first call checks its arguments on the host
            select(grid.detach(), *masks)
        with recorded_host_reads() as reads:
            selected = select(grid, *masks)
        selected.pow(2).sum().backward()
        values, gradient = host(selected), host(grid.grad)
    # torch's own frontend reads a 0-dim index tensor beside a slice as a number (`item`)
    assert [kind for kind in reads if kind != "item"] == ([] if mask_device == "cpu" else ["data_dependent"])
    assert fallbacks == []
    torch.testing.assert_close(values, expected.detach())
    torch.testing.assert_close(gradient, expected_input.grad)


# Each case: (x, rows mask (5,), columns mask (4,)) -> x after a write through a mask and more.
WRITES: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "x[:, mask] = scalar": lambda x, rows, columns: x.__setitem__((slice(None), columns), 0.5) or x,
    "x[mask, idx] = row": lambda x, rows, columns: x.__setitem__((rows, _ints([1], x.device)), torch.arange(6.0, device=x.device)) or x,
    "x[idx, mask] += scalar": lambda x, rows, columns: x.index_put_((_ints([[0], [0], [2]], x.device), columns), _ints(1.0, x.device), accumulate=True),
    "index_put out of place": lambda x, rows, columns: torch.index_put(x, (rows, _ints([3], x.device)), _ints([-1.0], x.device)),
    "bool accumulate": lambda x, rows, columns: (x > 50).index_put_((rows, _ints([0], x.device)), _ints(True, x.device), accumulate=True),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(WRITES))
def test_a_write_matches_the_cpu(mode: EagerMode, case: str) -> None:
    write = WRITES[case]
    expected = write(_grid("cpu"), *_masks("cpu", 1)[:2])
    with eager(mode), recorded_fallbacks() as fallbacks:
        written = host(write(_grid("tpu"), *_masks("tpu", 1)[:2]))
    assert fallbacks == []
    torch.testing.assert_close(written, expected)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_counts_of_one_padded_length_compile_nothing_new(mode: EagerMode) -> None:
    """Counts 33..40 share the padded length 40: after the first, a read and a write through a
    mask beside an index compile no program, and equal the CPU's."""
    values = torch.randperm(64, generator=torch.Generator().manual_seed(2))
    rows = torch.randn(64, 5, generator=torch.Generator().manual_seed(3))

    def results(values: torch.Tensor, rows: torch.Tensor, count: int) -> list[torch.Tensor]:
        mask = values < count
        written = rows.clone()
        written[mask, torch.tensor([4], device=rows.device)] = 0.0
        return [rows[mask, torch.tensor([[1], [3]], device=rows.device)].cpu(), rows.t()[1:, mask].cpu(), written.cpu()]

    with eager(mode):
        chip_values, chip_rows = values.to("tpu"), rows.to("tpu")
        results(chip_values, chip_rows, 33)
        before = len(_backend_compiles)
        for count in (34, 37, 40):
            for chip, cpu in zip(results(chip_values, chip_rows, count), results(values, rows, count)):
                assert torch.equal(chip, cpu)
        assert len(_backend_compiles) == before


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_an_index_out_of_range_raises_at_the_next_sync(mode: EagerMode) -> None:
    grid, rows = _grid("tpu"), _masks("tpu", 0)[0]
    with eager(mode), pytest.raises(RuntimeError, match="index out of range"):
        grid[rows, _ints([4], "tpu")].cpu()


# Each case: (x, rows mask, device) -> a write torch refuses.
REFUSED_WRITES: dict[str, Callable[[torch.Tensor, torch.Tensor, str], object]] = {
    "values of the wrong shape": lambda x, rows, d: x.__setitem__((rows, _ints([1], d)), torch.ones(7, 6, device=d)),
    "values of another dtype": lambda x, rows, d: x.index_put_((rows, _ints([1], d)), _ints(3, d)),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(REFUSED_WRITES))
def test_a_write_torch_refuses_raises_its_error(mode: EagerMode, case: str) -> None:
    write = REFUSED_WRITES[case]
    rows = _masks("cpu", 0)[0]
    with pytest.raises(RuntimeError) as on_cpu:
        write(_grid("cpu"), rows, "cpu")
    with eager(mode), pytest.raises(RuntimeError) as on_tpu:
        write(_grid("tpu"), rows.to("tpu"), "tpu")
    assert str(on_tpu.value) == str(on_cpu.value)


INDEXINGS: dict[str, tuple[tuple[int, ...], list[torch.Tensor | None], int]] = {
    "mask first": ((5, 4, 6), [torch.ones(5, dtype=torch.bool), torch.zeros(1, dtype=torch.long)], 0),
    "after a slice": ((5, 4, 6), [None, torch.ones(4, 6, dtype=torch.bool)], 1),
    "split by a slice": ((5, 4, 6), [torch.zeros(3, 1, dtype=torch.long), None, torch.ones(6, dtype=torch.bool)], 2),
    "0-dim index": ((5, 4, 6), [torch.tensor(1), torch.ones(4, dtype=torch.bool)], 1),
}


@pytest.mark.parametrize("case", sorted(INDEXINGS))
def test_the_result_layout_is_torchs(case: str) -> None:
    """`result_layout` says the shape torch gives, with `length` where the mask's count goes."""
    shape, indices, mask_at = INDEXINGS[case]
    count = int(indices[mask_at].sum())
    layout = result_layout(shape, indices, mask_at, count)
    assert layout is not None
    expected = torch.ops.aten.index.Tensor(torch.zeros(shape), indices).shape  # None: the whole dim
    assert layout[0] == tuple(expected)
    assert layout[1] == next(dim for dim, length in enumerate(result_layout(shape, indices, mask_at, 97)[0]) if length == 97)


def test_two_masks_or_an_index_as_long_as_the_count_keep_the_exact_path() -> None:
    rows = torch.ones(5, dtype=torch.bool)
    assert result_layout((5, 4), [rows, torch.ones(4, dtype=torch.bool)], 0, 5) is None
    assert result_layout((5, 4), [rows, torch.zeros(5, dtype=torch.long)], 0, 5) is None
