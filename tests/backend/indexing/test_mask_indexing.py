"""`x[mask]` and `masked_select` index on the chip: the mask's set positions are read on the host
(no sync for a host mask), and no CPU fallback runs; results and gradients match the CPU in both
eager modes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from backend_helpers import eager, host, recorded_fallbacks
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)


def _grid(d: str) -> torch.Tensor:
    return torch.arange(24.0, device=d).reshape(4, 3, 2)


def _on(d: str, mask: torch.Tensor) -> torch.Tensor:
    return mask.to(d)


# Each case: (x, mask) -> the selection; `mask_device` places the mask ("cpu" keeps a host mask).
SELECTIONS: dict[str, Callable[[torch.Tensor, str], torch.Tensor]] = {
    "rows": lambda x, d: x[_on(d, torch.tensor([True, False, True, True]))],
    "two leading dims": lambda x, d: x[_on(d, x.detach().cpu()[..., 0] > 7)],
    "all dims": lambda x, d: x[_on(d, x.detach().cpu() % 3 == 1)],
    "inner dim": lambda x, d: x[:, _on(d, torch.tensor([False, True, True]))],
    "inner two dims": lambda x, d: x[:, _on(d, x.detach().cpu()[0] % 3 != 1)],
    "mask then integer index": lambda x, d: x[_on(d, torch.tensor([True, False, True, True])), :, torch.tensor([1, 0, 1], device=x.device)],
    "uint8 mask": lambda x, d: x[_on(d, torch.tensor([1, 0, 0, 1], dtype=torch.uint8))],
    "nothing selected": lambda x, d: x[_on(d, torch.zeros(4, dtype=torch.bool))],
    "masked_select": lambda x, d: torch.masked_select(x, _on(d, x.detach().cpu() > 10)),
    "masked_select broadcast": lambda x, d: x.masked_select(_on(d, torch.tensor([[True], [False], [True]]))),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("mask_device", ["cpu", "tpu"])
@pytest.mark.parametrize("case", sorted(SELECTIONS))
def test_mask_selection_matches_the_cpu_with_no_fallback(mode: EagerMode, mask_device: str, case: str) -> None:
    select = SELECTIONS[case]
    expected_input = _grid("cpu").requires_grad_()
    expected = select(expected_input, "cpu")
    expected.pow(2).sum().backward()
    with eager(mode), recorded_fallbacks() as fallbacks:
        grid = _grid("tpu").requires_grad_()
        selected = select(grid, mask_device)
        selected.pow(2).sum().backward()
        values, gradient = host(selected), host(grid.grad)
    assert "aten.index.Tensor" not in fallbacks and "aten.masked_select" not in fallbacks
    assert selected.device == torch.device("tpu:0")
    torch.testing.assert_close(values, expected.detach())
    torch.testing.assert_close(gradient, expected_input.grad)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_mask_of_the_wrong_shape_raises_torchs_error(mode: EagerMode) -> None:
    mask = torch.tensor([True, False, True])
    with pytest.raises(IndexError, match="does not match the shape of the indexed tensor") as on_cpu:
        _grid("cpu")[mask]
    with eager(mode), pytest.raises(IndexError) as on_tpu:
        _grid("tpu")[mask.to("tpu")]
    assert str(on_tpu.value) == str(on_cpu.value)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("density", [0.0, 0.03, 0.5, 1.0])
def test_a_chip_mask_is_read_only_as_its_count(mode: EagerMode, density: float) -> None:
    """A mask of more than one 32-bit word (37x29, not a multiple of 32): the host reads one number
    per mask (`x[mask]` and `x[mask, idx]` read the first's count once; `masked_select` gets a view
    of the mask, counted on its own), and the values and gradients are the CPU's."""
    from tputrace.backend.core.dispatch import dispatcher

    generator = torch.Generator().manual_seed(7)
    values = torch.randn(37, 29, 3, generator=generator)
    mask = torch.rand(37, 29, generator=generator) < density
    columns = torch.rand(29, generator=generator) < density

    def select(x: torch.Tensor, rows_mask: torch.Tensor, columns_mask: torch.Tensor) -> list[torch.Tensor]:
        return [x[rows_mask], x[:, columns_mask], torch.masked_select(x, rows_mask[..., None]), x[rows_mask, torch.tensor([2], device=x.device)]]

    expected_input = values.clone().requires_grad_()
    expected = select(expected_input, mask, columns)
    sum(part.pow(2).sum() for part in expected).backward()
    read_sizes: list[int] = []
    to_host = dispatcher.to_host

    def counted(tensor: torch.Tensor, sync_kind: str) -> torch.Tensor:
        read_sizes.append(tensor.numel())
        return to_host(tensor, sync_kind)

    with eager(mode), recorded_fallbacks() as fallbacks:
        grid = values.to("tpu").requires_grad_()
        chip_mask, chip_columns = mask.to("tpu"), columns.to("tpu")
        dispatcher.to_host = counted
        try:
            selected = select(grid, chip_mask, chip_columns)
        finally:
            del dispatcher.to_host
        sum(part.pow(2).sum() for part in selected).backward()
        for part, expected_part in zip(selected, expected):
            torch.testing.assert_close(host(part), expected_part.detach())
        torch.testing.assert_close(host(grid.grad), expected_input.grad)
    assert fallbacks == []
    assert read_sizes == [1, 1, 1]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_mask_written_after_a_selection_is_counted_again(mode: EagerMode) -> None:
    """A mask's count is remembered only while the mask is unwritten: after `mask[5:] = True` (and
    after `mask.copy_`), `x[mask]` selects by the new count."""
    values = torch.arange(10.0)
    mask = values < 3
    with eager(mode):
        chip_values, chip_mask = values.to("tpu"), mask.to("tpu")
        before = host(chip_values[chip_mask])
        chip_mask[5:] = True
        widened = host(chip_values[chip_mask])
        chip_mask.copy_((values > 8).to("tpu"))
        narrowed = host(chip_values[chip_mask])
    assert torch.equal(before, values[:3])
    assert torch.equal(widened, torch.cat([values[:3], values[5:]]))
    assert torch.equal(narrowed, values[9:])


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_writes_through_a_chip_mask_with_other_indices_run_on_the_chip(mode: EagerMode) -> None:
    """`x[:, mask] = v` and `x[mask, idx] += v` (a mask beside other indices) match the CPU with no
    fallback: the mask becomes positions on the chip, as in `x[mask]`."""

    def write(x: torch.Tensor, columns: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        x[:, columns] = torch.arange(8.0, device=x.device).reshape(4, 2)
        x.index_put_((rows, torch.tensor([0, 2, 1], device=x.device)), torch.tensor(-1.0, device=x.device), accumulate=True)
        return x

    columns, rows = torch.tensor([True, False, True]), torch.tensor([True, False, True, True])
    expected = write(_grid("cpu")[..., 0].clone(), columns, rows)
    with eager(mode), recorded_fallbacks() as fallbacks:
        written = write(_grid("tpu")[..., 0].clone(), columns.to("tpu"), rows.to("tpu"))
        torch.testing.assert_close(host(written), expected)
    assert fallbacks == []


def test_a_mask_counted_again_after_a_write_is_remembered_as_the_newest() -> None:
    """A mask written since its count is counted again; its new count is then the newest remembered,
    not dropped by the masks counted after it (as when its entry kept its old place: the test of a
    mask read only as its count once read it twice, after earlier tests left a dead mask's entry
    under its id)."""
    from tputrace.backend.indexing import mask_counts
    from tputrace.backend.core.dispatch import dispatcher

    values = torch.arange(12.0).to("tpu")
    masks = [(torch.arange(12) % (index + 2) == 0).to("tpu") for index in range(mask_counts._REMEMBERED)]
    rewritten = masks[1]
    reads: list[int] = []
    to_host = dispatcher.to_host

    def counted(tensor: torch.Tensor, sync_kind: str) -> torch.Tensor:
        reads.append(tensor.numel())
        return to_host(tensor, sync_kind)

    with eager(EagerMode.DEFER_NEVER):
        for mask in masks:
            values[mask]
        rewritten[0] = True  # its buffer's version changes: the next count reads it again
        dispatcher.to_host = counted
        try:
            values[rewritten]
            for remainder in (1, 2):  # two more masks counted after it
                values[(torch.arange(12) % 5 == remainder).to("tpu")]
            selected = values[rewritten]
        finally:
            del dispatcher.to_host
    assert reads == [1, 1, 1]
    assert host(selected).tolist() == [0.0, 3.0, 6.0, 9.0]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_backward_expand_to_a_cut_length_elsewhere_keeps_torchs_layout(mode: EagerMode) -> None:
    """A mask count equal to a dim of an unrelated tensor does not make that tensor's gradient a cut:
    after `x[mask]` selects 8 values, `adaptive_avg_pool2d(y, 1)`'s backward expands (2, 3, 1, 1) to
    y's (2, 3, 8, 8), and y's retained gradient (what a hook gets) keeps torch's strides (so
    `grad.view(-1)` works) and values."""
    values, mask = torch.arange(10.0), torch.arange(10) < 8
    images = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))

    def gradient(device: str) -> torch.Tensor:
        hidden = images.to(device).detach().requires_grad_() * 2
        hidden.retain_grad()
        pooled = torch.nn.functional.adaptive_avg_pool2d(hidden, 1)
        (pooled * torch.linspace(-1, 1, 6, device=device).reshape(2, 3, 1, 1)).sum().backward()
        return hidden.grad

    expected = gradient("cpu")
    with eager(mode):
        chip_values = values.to("tpu")
        assert torch.equal(host(chip_values[(values < 3).to("tpu")]), values[:3])  # 8 is then cut from a longer buffer
        assert torch.equal(host(chip_values[mask.to("tpu")]), values[:8])
        got = gradient("tpu")
        assert got.stride() == expected.stride()
        torch.testing.assert_close(host(got.view(-1)), expected.view(-1))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_one_element_selection_leaves_later_backwards_of_scalars_alone(mode: EagerMode) -> None:
    """`x[mask]` of one value is a cut whose shape, (1,), is all leading 1s: a later backward's expand of a
    0-d gradient (`loss.sum()` of a scalar loss) is not taken for that cut, and gives torch's gradient."""
    values = torch.arange(5.0)

    def gradient(device: str) -> torch.Tensor:
        scores = torch.linspace(-1, 1, 6, device=device).reshape(2, 3).requires_grad_()
        loss = torch.nn.functional.cross_entropy(scores, torch.tensor([0, 2], device=device))
        (loss * 3).sum().backward()
        return scores.grad

    expected = gradient("cpu")
    with eager(mode):
        assert host(values.to("tpu")[(values == 2).to("tpu")]).tolist() == [2.0]
        torch.testing.assert_close(host(gradient("tpu")), expected)


# Each case: a selection of columns, `x[:, mask]` (a chip mask: a cut of a padded buffer) -> what is read of it.
COLUMN_READS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "strides": lambda z: torch.tensor([*z.stride(), z.storage_offset(), z.is_contiguous()]),
    "view(-1)": lambda z: z.view(-1) * 2,
    "view after t().contiguous()": lambda z: z.t().contiguous().view(-1),
    "unfold then reshape": lambda z: z.unfold(1, 2, 1).reshape(-1),
    "as_strided over rows": lambda z: z.as_strided((2, 2), z.stride(), 1),
    "as_strided of its transpose": lambda z: z.t().as_strided((3, 2), (1, z.shape[1]), 2),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(COLUMN_READS))
def test_a_selection_of_columns_has_the_cpus_strides(mode: EagerMode, case: str) -> None:
    """`x[:, mask]` is a new contiguous tensor on the CPU, and on the chip too (not its padded buffer's
    strides): `view(-1)` works, and an `as_strided` of its strides reads what the CPU's does."""
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    mask = torch.randperm(40, generator=torch.Generator().manual_seed(1)) < 19  # a padded length of 20
    expected = COLUMN_READS[case](x[:, mask])
    with eager(mode):
        got = COLUMN_READS[case](x.to("tpu")[:, mask.to("tpu")]).cpu()
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_narrow_like_a_selection_of_columns_keeps_its_own_strides(mode: EagerMode) -> None:
    """A tensor's own `narrow` along a later dim, of the padded buffer's shape and the selection's length,
    keeps the strides of the tensor it views: an `as_strided` of it reads that tensor, not the
    contiguous entries a selection of columns of that length would have."""
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    y = torch.randn(3, 20, generator=torch.Generator().manual_seed(2))
    mask = torch.randperm(40, generator=torch.Generator().manual_seed(1)) < 19  # a padded length of 20

    def reads(device: str) -> list[torch.Tensor]:
        selected = x.to(device)[:, mask.to(device)]
        narrowed = y.to(device).narrow(1, 0, 19)
        return [selected.cpu(), narrowed.as_strided((2, 2), narrowed.stride(), 1).cpu(), narrowed.as_strided((2, 3), (1, 2), 4).cpu()]

    expected = reads("cpu")
    with eager(mode):
        got = reads("tpu")
    for value, wanted in zip(got, expected):
        torch.testing.assert_close(value, wanted)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_a_write_through_an_as_strided_view_of_columns_reaches_them(mode: EagerMode) -> None:
    """A write through `as_strided` of `x[:, mask]` lands on the entries the CPU's does, and the
    selection and its other views read it."""
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    mask = torch.randperm(40, generator=torch.Generator().manual_seed(1)) < 19

    def written(device: str) -> list[torch.Tensor]:
        selected = x.to(device)[:, mask.to(device)]
        selected.as_strided((2, 3), (selected.stride(0), 2), 1).mul_(10)
        return [selected.cpu(), selected.view(-1).cpu(), selected.sum(1).cpu()]

    expected = written("cpu")
    with eager(mode):
        got = written("tpu")
    for value, wanted in zip(got, expected):
        torch.testing.assert_close(value, wanted)
