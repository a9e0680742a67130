"""Ops whose output length depends on the data (`nonzero`, the `unique` family, `bincount`,
`repeat_interleave` without `output_size`) and `histc` run on the chip: results match the CPU's in
both eager modes, the host reads only what fixes the length (one data-dependent sync, none for
`histc`), no CPU fallback runs, and value errors are torch's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tputrace
from backend_helpers import assert_matches_cpu, eager, host, recorded_fallbacks, recorded_host_reads
from tputrace.analysis import analyze_path
from tputrace.backend.compat.device_module import EagerMode
from tputrace.cli.main import main

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
NAN = float("nan")


def _t(values: Any, device: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).to(device)


def _ints(device: str) -> torch.Tensor:
    return _t([[3, 1, 0, 1], [0, 7, 3, 3], [2, 0, 0, 5]], device)


def _floats(device: str) -> torch.Tensor:
    return _t([2.5, -1.0, 0.0, 2.5, -0.0, 7.0, -1.0, 0.0], device)


def _rows(device: str) -> torch.Tensor:
    return _t([[1, 2, 3], [0, 5, 1], [1, 2, 3], [0, 5, 0], [0, 5, 1]], device)


# Each case: device -> the op's result (a tensor or a tuple of them).
CASES: dict[str, Callable[[str], Any]] = {
    "nonzero ints 2d": lambda d: torch.nonzero(_ints(d)),
    "nonzero floats nan and -0": lambda d: torch.nonzero(_t([NAN, -0.0, 0.0, 1e-30, -2.0], d)),
    "nonzero bools 3d": lambda d: torch.nonzero(_ints(d).reshape(2, 3, 2) > 1),
    "nonzero as tuple": lambda d: torch.nonzero(_ints(d), as_tuple=True),
    "nonzero none set": lambda d: torch.nonzero(torch.zeros(3, 2, device=d)),
    "nonzero empty": lambda d: torch.nonzero(torch.ones(0, 3, device=d)),
    "nonzero 0-d set": lambda d: torch.nonzero(_t(4, d)),
    "nonzero 0-d zero": lambda d: torch.nonzero(_t(0.0, d)),
    "nonzero complex": lambda d: torch.nonzero(_t([0j, 1j, 0j, 2 + 0j], d)),
    "unique ints": lambda d: torch.unique(_ints(d)),
    "unique ints inverse counts": lambda d: torch.unique(_ints(d), return_inverse=True, return_counts=True),
    "unique unsorted is sorted": lambda d: torch.unique(_ints(d), sorted=False, return_inverse=True),
    "unique floats counts": lambda d: torch.unique(_floats(d), return_counts=True),
    "unique nan each distinct": lambda d: torch.unique(_t([NAN, 1.0, NAN, 1.0], d), return_counts=True),
    "unique bools": lambda d: torch.unique(_ints(d) > 2, return_inverse=True, return_counts=True),
    "unique bfloat16": lambda d: torch.unique(_floats(d).bfloat16(), return_inverse=True),
    "unique empty": lambda d: torch.unique(torch.ones(0, 3, device=d), return_inverse=True, return_counts=True),
    "unique 0-d": lambda d: torch.unique(_t(5, d), return_inverse=True, return_counts=True),
    "unique one element": lambda d: torch.unique(_t([5], d), return_inverse=True, return_counts=True),
    "_unique": lambda d: torch._unique(_ints(d), return_inverse=True),
    "unique dim 0": lambda d: torch.unique(_rows(d), dim=0, return_inverse=True, return_counts=True),
    "unique dim 1": lambda d: torch.unique(_rows(d).T, dim=1, return_inverse=True, return_counts=True),
    "unique dim -1 3d": lambda d: torch.unique(_ints(d).reshape(3, 2, 2) % 2, dim=-1, return_counts=True),
    "unique dim floats": lambda d: torch.unique(_floats(d).reshape(4, 2), dim=0, return_inverse=True),
    "unique dim no inverse asked": lambda d: torch.ops.aten.unique_dim.default(_rows(d), 0),
    "unique dim empty selected": lambda d: torch.unique(torch.ones(0, 3, device=d), dim=0, return_inverse=True, return_counts=True),
    "unique_consecutive": lambda d: torch.unique_consecutive(_t([1, 1, 2, 2, 3, 1, 1, 2], d), return_inverse=True, return_counts=True),
    "unique_consecutive 2d flattened": lambda d: torch.unique_consecutive(_ints(d), return_inverse=True, return_counts=True),
    "unique_consecutive values only": lambda d: torch.unique_consecutive(_floats(d)),
    "unique_consecutive dim 0": lambda d: torch.unique_consecutive(_rows(d)[[0, 2, 1, 4, 3]], dim=0, return_inverse=True, return_counts=True),
    "unique_consecutive dim 1": lambda d: torch.unique_consecutive(_rows(d).T, dim=1),
    "unique_consecutive empty": lambda d: torch.unique_consecutive(torch.ones(0, device=d), return_inverse=True, return_counts=True),
    "unique_consecutive 0-d": lambda d: torch.unique_consecutive(_t(5, d), return_inverse=True, return_counts=True),
    "bincount": lambda d: torch.bincount(_ints(d).flatten()),
    "bincount minlength": lambda d: torch.bincount(_t([1, 1, 3], d), minlength=7),
    "bincount minlength below max": lambda d: torch.bincount(_t([1, 1, 9], d), minlength=3),
    "bincount float32 weights": lambda d: torch.bincount(_t([1, 1, 3, 0], d), weights=_t([0.5, 0.25, 2.0, -1.0], d)),
    "bincount float64 weights": lambda d: torch.bincount(_t([2, 0, 2], d), weights=_t([0.1, 0.2, 0.3], d, torch.float64)),
    "bincount int weights": lambda d: torch.bincount(_t([2, 0, 2], d), weights=_t([1, 2, 3], d)),
    "bincount half weights": lambda d: torch.bincount(_t([2, 0, 2], d), weights=_t([1.5, 2, 3], d, torch.float16)),
    "bincount uint8": lambda d: torch.bincount(_t([4, 0, 4, 255], d, torch.uint8)),
    "bincount int32": lambda d: torch.bincount(_t([4, 0, 4], d, torch.int32), minlength=2),
    "bincount empty": lambda d: torch.bincount(torch.zeros(0, dtype=torch.long, device=d), minlength=3),
    "bincount empty weights": lambda d: torch.bincount(torch.zeros(0, dtype=torch.long, device=d), weights=torch.zeros(0, device=d)),
    "repeat_interleave counts": lambda d: torch.repeat_interleave(_t([2, 0, 3, 1], d)),
    "repeat_interleave int32": lambda d: torch.repeat_interleave(_t([2, 0, 3], d, torch.int32)),
    "repeat_interleave zeros": lambda d: torch.repeat_interleave(_t([0, 0], d)),
    "repeat_interleave empty": lambda d: torch.repeat_interleave(torch.zeros(0, dtype=torch.long, device=d)),
    "repeat_interleave rows": lambda d: torch.repeat_interleave(_rows(d).float(), _t([1, 0, 2, 1, 3], d), dim=0),
    "repeat_interleave flattened": lambda d: torch.repeat_interleave(_t([[1, 2], [3, 4]], d), _t([2, 1, 0, 3], d)),
    "histc data range": lambda d: torch.histc(_floats(d), bins=5),
    "histc given range": lambda d: torch.histc(_floats(d), bins=4, min=-1, max=3),
    "histc equal bounds use the data": lambda d: torch.histc(_floats(d), bins=3, min=2, max=2),
    "histc constant": lambda d: torch.histc(_t([2.0, 2.0], d), bins=4),
    "histc float64": lambda d: torch.histc(_floats(d).double(), bins=6, min=0, max=2.5),
    "histc empty": lambda d: torch.histc(torch.ones(0, device=d), bins=3),
    "histc nan ignored in a given range": lambda d: torch.histc(_t([NAN, 0.5, 1.0], d), bins=2, min=0, max=1),
}
# Inputs whose output length is known from the shapes alone: no value is read.
NO_READ = {
    "nonzero empty", "unique empty", "unique 0-d", "unique one element", "unique dim empty selected",
    "unique_consecutive empty", "unique_consecutive 0-d", "bincount empty", "bincount empty weights",
    "repeat_interleave empty",
}
HISTC = {name for name in CASES if name.startswith("histc")}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_the_cpu_with_one_read_and_no_fallback(mode: EagerMode, case: str) -> None:
    expected = CASES[case]("cpu")
    with eager(mode), recorded_fallbacks() as fallbacks:
        with recorded_host_reads() as reads:
            result = CASES[case]("tpu")
        assert_matches_cpu(result, expected, device="tpu", atol=1e-6, rtol=1e-6)
    assert fallbacks == []
    expected_reads = [] if case in NO_READ or case in HISTC else ["data_dependent"]
    assert reads == expected_reads


def test_a_pending_input_is_flushed_by_the_read() -> None:
    """In DEFER_AND_FUSE the input is still pending when the count is read: the read flushes it."""
    with eager(EagerMode.DEFER_AND_FUSE):
        values = torch.arange(10, device="tpu") % 4
        kept = torch.nonzero(values * 2 > 3)
        distinct, counts = torch.unique(values + 1, return_counts=True)
        expanded = torch.repeat_interleave(counts)
        assert_matches_cpu((kept, distinct, counts, expanded), (
            torch.tensor([[2], [3], [6], [7]]), torch.tensor([1, 2, 3, 4]), torch.tensor([3, 3, 2, 2]),
            torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 3, 3]),
        ), device="tpu", atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_repeat_interleave_gradient_matches_the_cpu(mode: EagerMode) -> None:
    def grad(device: str) -> torch.Tensor:
        rows = torch.arange(6.0).reshape(3, 2).to(device).requires_grad_()
        expanded = torch.repeat_interleave(rows, _t([2, 0, 3], device), dim=0)
        (expanded * torch.arange(10.0).reshape(5, 2).to(device)).sum().backward()
        return rows.grad

    expected = grad("cpu")
    with eager(mode), recorded_fallbacks() as fallbacks:
        assert_matches_cpu(grad("tpu"), expected, device="tpu")
    assert fallbacks == []


VALUE_ERRORS: dict[str, Callable[[str], Any]] = {
    "bincount negative": lambda d: torch.bincount(_t([1, -1, 2], d)),
    "repeat_interleave negative": lambda d: torch.repeat_interleave(_t([1, -1, 2], d)),
}
SHAPE_ERRORS: dict[str, Callable[[str], Any]] = {
    "bincount 2-d": lambda d: torch.bincount(_t([[1]], d)),
    "bincount floats": lambda d: torch.bincount(_t([1.0], d)),
    "bincount weights of another length": lambda d: torch.bincount(_t([1, 2], d), weights=_t([1.0], d)),
    "repeat_interleave 2-d": lambda d: torch.repeat_interleave(_t([[1]], d)),
    "unique dim out of range": lambda d: torch.unique(_ints(d), dim=2),
    "unique dim zero-size unselected": lambda d: torch.unique(torch.ones(0, 3, device=d), dim=1),
    "unique complex": lambda d: torch.unique(_t([1j], d)),
    "histc no bins": lambda d: torch.histc(_floats(d), bins=0),
    "histc reversed range": lambda d: torch.histc(_floats(d), bins=3, min=3, max=1),
    "histc infinite range": lambda d: torch.histc(_floats(d), bins=3, min=float("-inf"), max=1),
}


def _cpu_error(call: Callable[[str], Any]) -> BaseException:
    with pytest.raises(Exception) as raised:
        call("cpu")
    return raised.value


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(VALUE_ERRORS))
def test_a_value_torch_refuses_raises_its_error_on_the_chip(mode: EagerMode, case: str) -> None:
    expected = _cpu_error(VALUE_ERRORS[case])
    with eager(mode), recorded_fallbacks() as fallbacks, pytest.raises(type(expected)) as raised:
        VALUE_ERRORS[case]("tpu")
    assert str(raised.value) == str(expected)
    assert fallbacks == []


@pytest.mark.parametrize("case", sorted(SHAPE_ERRORS))
def test_arguments_torch_refuses_raise_its_error(case: str) -> None:
    expected = _cpu_error(SHAPE_ERRORS[case])
    with pytest.raises(type(expected)) as raised:
        SHAPE_ERRORS[case]("tpu")
    assert str(raised.value).splitlines()[0] == str(expected).splitlines()[0]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("value", [NAN, float("inf")])
def test_histc_of_data_not_finite_raises_at_the_next_sync(mode: EagerMode, value: float) -> None:
    """histc over the data's range is refused for an inf or nan value: checked on the chip, raised at
    the next sync (as an index out of range is), with no sync of its own."""
    with eager(mode), recorded_host_reads() as reads:
        counts = torch.histc(_t([1.0, value], "tpu"), bins=3)
        assert reads == []
        with pytest.raises(RuntimeError, match=r"invalid values in aten\.histc .*an inf or nan value"):
            host(counts)


def test_histc_of_data_not_finite_raises_torchs_error_at_the_op_when_blocking() -> None:
    expected = _cpu_error(lambda d: torch.histc(_t([1.0, NAN], d), bins=3))
    with eager(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING), pytest.raises(RuntimeError) as raised:
        torch.histc(_t([1.0, NAN], "tpu"), bins=3)
    assert str(raised.value) == str(expected)


def test_a_new_length_compiles_once_and_is_reused() -> None:
    """Two calls whose results have the same length share their programs."""
    from tputrace.backend.core.dispatch import dispatcher

    torch.unique(_t([4, 4, 1], "tpu"))
    plans = len(dispatcher.plans)
    distinct = torch.unique(_t([9, 2, 2], "tpu"))
    assert len(dispatcher.plans) == plans
    assert host(distinct).tolist() == [2, 9]


def test_varying_lengths_compile_a_few_programs_and_match_the_cpu() -> None:
    """30 different counts compile programs for a few padded lengths (see `length_buckets`), not one
    per count, and each result is cut to exactly the CPU's (DEFER_NEVER, where each program is a plan
    of its own)."""
    from tputrace.backend.core.dispatch import dispatcher
    from tputrace.backend.indexing.length_buckets import padded_length

    def results(values: torch.Tensor, rows: torch.Tensor, count: int) -> tuple[torch.Tensor, ...]:
        distinct, inverse, counts = torch.unique(values % count, return_inverse=True, return_counts=True)
        return torch.nonzero(values < count), rows[values < count], distinct, inverse, counts, torch.repeat_interleave(values[:50] % count % 3), torch.bincount(values % count)

    counts = range(3, 123, 4)
    ops = ("aten.nonzero_static.default", "aten.index.Tensor", "aten._unique2.default", "aten.repeat_interleave.Tensor", "aten.bincount.default")
    values = torch.randperm(300, generator=torch.Generator().manual_seed(3))
    rows = torch.randn(300, 2, generator=torch.Generator().manual_seed(4))
    with eager(EagerMode.DEFER_NEVER):
        before = {key for key, plan in dispatcher.plans.items() if getattr(plan, "op_name", None) in ops}
        chip_values, chip_rows = values.to("tpu"), rows.to("tpu")
        for count in counts:
            assert_matches_cpu(
                results(chip_values, chip_rows, count), results(values, rows, count), device="tpu", atol=1e-6, rtol=1e-6
            )
        added = Counter(plan.op_name for key, plan in dispatcher.plans.items() if getattr(plan, "op_name", None) in ops and key not in before)
    padded_lengths = len({padded_length(count) for count in counts})
    assert padded_lengths < len(counts) / 2
    # one program per padded length, and one measure step each for unique, bincount and repeat_interleave
    assert set(added) == set(ops) and max(added.values()) <= padded_lengths + 1


def test_compiled_function_matches_the_cpu() -> None:
    """Under torch.compile(backend="tpu") these ops break the graph (as on CUDA without capture of
    dynamic output shapes) and run eagerly on the chip."""

    def select(values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        doubled = values * 2
        distinct, counts = torch.unique(doubled, return_counts=True)
        return torch.nonzero(doubled > 4), distinct, counts, torch.bincount(values), torch.repeat_interleave(counts) + 1

    values = _t([3, 1, 2, 3, 0, 3], "cpu")
    expected = select(values)
    torch._dynamo.reset()
    with recorded_fallbacks() as fallbacks:
        result = torch.compile(select, backend="tpu")(values.to("tpu"))
    assert_matches_cpu(tuple(result), expected, device="tpu", atol=1e-6, rtol=1e-6)
    assert fallbacks == []


def test_the_trace_records_a_data_dependent_sync_and_no_fallback(tmp_path: Path) -> None:
    script = tmp_path / "data_dependent.py"
    script.write_text(
        "import torch\n"
        "x = torch.tensor([3, 1, 0, 3], device='tpu')\n"
        "kept = torch.nonzero(x)\n"
        "distinct = torch.unique(x)\n"
        "counts = torch.bincount(x)\n"
        "print(kept.shape, distinct.shape, counts.shape)\n"
    )
    trace_path = tmp_path / "data_dependent.tptrace"
    assert main(["run", "-o", str(trace_path), str(script)]) == 0
    with tputrace.open(trace_path) as trace:
        data_dependent = sorted(sync.source.line for sync in trace.records("syncs") if sync.kind == "data_dependent")
        assert data_dependent == [3, 4, 5]
        assert trace.count("fallbacks") == 0


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_out_variants_run_on_the_chip(mode: EagerMode) -> None:
    """`out=` forms resize their outputs to the data-dependent length, as on the CPU, with no fallback."""

    def run(device: str) -> list[torch.Tensor]:
        values = _ints(device)
        outs = [torch.empty(0, dtype=torch.long, device=device) for _ in range(11)] + [torch.empty(0, device=device)]
        torch.nonzero(values, out=outs[0])
        torch.ops.aten._unique2.out(values, return_inverse=True, return_counts=True, out0=outs[1], out1=outs[2], out2=outs[3])
        torch.ops.aten.bincount.out(values.flatten(), out=outs[4])
        torch.ops.aten.unique_dim.out(values, 1, return_inverse=True, return_counts=True, out0=outs[5], out1=outs[6], out2=outs[7])
        torch.ops.aten.unique_consecutive.out(values.flatten(), return_inverse=True, return_counts=True, out0=outs[8], out1=outs[9], out2=outs[10])
        torch.masked_select(values.float(), values > 2, out=outs[11])
        return outs

    expected = run("cpu")
    with eager(mode), recorded_fallbacks() as fallbacks:
        assert_matches_cpu(tuple(run("tpu")), tuple(expected), device="tpu", atol=1e-6, rtol=1e-6)
    assert fallbacks == []


def test_varying_counts_in_a_traced_run_are_no_recompilation_storm(tmp_path: Path) -> None:
    """`tputrace run --mode strict` of a loop over 20 counts: the programs of the padded lengths are
    compiled, and the recompiles analyzer finds no storm (it found one in `x[mask]`'s index, whose
    host-made indices had the count's length)."""
    script = tmp_path / "varying.py"
    script.write_text(
        "import torch\n"
        "values = torch.randperm(512).to('tpu')\n"
        "rows = torch.randn(512, 2).to('tpu')\n"
        "for count in range(5, 400, 20):\n"
        "    kept = torch.nonzero(values < count)\n"
        "    picked = rows[values < count]\n"
        "    assert kept.shape[0] == picked.shape[0] == count\n"
    )
    trace_path = tmp_path / "varying.tptrace"
    assert main(["run", "--mode", "strict", "-o", str(trace_path), str(script)]) == 0
    with tputrace.open(trace_path) as trace:
        compiled = Counter(trace.string(name_sid) for (name_sid,) in trace.sql("SELECT name_sid FROM compiles"))
    report = analyze_path(trace_path)
    assert report.results["recompiles"].data.storms == ()
    assert compiled["aten.nonzero_static.default"] == compiled["aten.index.Tensor"] < 20
