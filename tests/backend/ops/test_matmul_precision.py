"""`torch.set_float32_matmul_precision` on tpu: float32 products are lowered at XLA's HIGHEST, HIGH or
DEFAULT precision, results stay right, switching the setting compiles new programs in every mode, the
trace records the setting, and the precision analyzer reads it."""

from __future__ import annotations

import contextlib
import json
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import pytest
import torch
import torch.nn.functional as F

import tputrace
from backend_helpers import eager, host
from tputrace.analysis import analyze_path
from tputrace.analysis.findings import Finding
from tputrace.analysis.precision import PrecisionData
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core import matmul_precision
from tputrace.backend.core.dispatch import dispatcher
from tputrace.backend.core.dtypes import to_jax
from tputrace.cli.main import main

_STABLEHLO = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}
_MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]
# A dot's precision in StableHLO text, and a convolution's.
_PRECISION = re.compile(r"precision = \[(\w+), \w+\]|#stablehlo<precision (\w+)>")
_SCALARS = {"float": 1.0, "int": 1, "bool": True, "complex": 1j}  # a Scalar input's stand-in


@pytest.fixture(autouse=True)
def restore_setting() -> Iterator[None]:
    previous = matmul_precision.setting()
    yield
    with _backend_flags_settable():
        torch.backends.fp32_precision = "none"
        torch.backends.cuda.matmul.fp32_precision = "none"
        torch.set_float32_matmul_precision(previous)


def _backend_flags_settable() -> contextlib.AbstractContextManager:
    """torch's test helpers (the OpInfo parity test's imports) freeze torch.backends flags for the rest
    of the process; this lifts that for a block, as torch's own `flags()` context managers do."""
    return getattr(torch.backends, "__allow_nonbracketed_mutation")()


def _lowered_precisions(op_name: str, setting: str, dtype: torch.dtype = torch.float32) -> set[str]:
    """The precisions in the StableHLO of the plans of `op_name` keyed on `setting` for `dtype` inputs."""
    found: set[str] = set()
    for key, plan in list(dispatcher.plans.items()):
        if getattr(plan, "op_name", None) != op_name or key[-1] != setting or plan.in_specs[0][1] != dtype:
            continue
        avals = [jax.ShapeDtypeStruct(spec[0], to_jax(spec[1])) if len(spec) > 1 else _SCALARS[spec[0]] for spec in plan.in_specs]
        text = jax.jit(plan.fn).lower(*avals).as_text()
        found |= {dot or conv for dot, conv in _PRECISION.findall(text)}
    return found


def _conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x, w, padding=1)


def _attention(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, k, is_causal=True)


_CASES: list[tuple[str, Callable[..., torch.Tensor], tuple[tuple[int, ...], ...], tuple[str, ...]]] = [
    ("mm", torch.mm, ((8, 16), (16, 4)), ("aten.mm.default",)),
    ("linear", lambda x, w: F.linear(x, w), ((3, 8, 16), (4, 16)), ("aten.mm.default",)),
    ("baddbmm", lambda b, x, y: torch.baddbmm(b, x, y, alpha=0.5), ((2, 8, 4), (2, 8, 16), (2, 16, 4)), ("aten.baddbmm.default",)),
    ("einsum", lambda x, y: torch.einsum("bij,bjk->bik", x, y), ((2, 8, 16), (2, 16, 4)), ("aten.bmm.default",)),
    ("conv", _conv, ((2, 3, 8, 8), (4, 3, 3, 3)), ("aten.convolution.default", "aten.convolution_backward.default")),
    ("attention", _attention, ((2, 2, 8, 16), (2, 2, 8, 16)),
     ("aten._scaled_dot_product_flash_attention_for_cpu.default", "aten._scaled_dot_product_flash_attention_for_cpu_backward.default")),
]


@pytest.mark.parametrize("setting", ["highest", "high", "medium"])
@pytest.mark.parametrize("case", _CASES, ids=[case[0] for case in _CASES])
def test_products_are_lowered_at_the_setting_and_stay_right(case: tuple, setting: str) -> None:
    _, function, shapes, op_names = case
    torch.manual_seed(0)
    inputs = [torch.randn(shape, requires_grad=True) for shape in shapes]
    expected = function(*inputs)
    expected.sum().backward()
    torch.set_float32_matmul_precision(setting)
    chip_inputs = [value.detach().to("tpu").requires_grad_() for value in inputs]
    result = function(*chip_inputs)
    result.sum().backward()
    torch.testing.assert_close(host(result), expected.detach(), rtol=1e-4, atol=1e-4)
    for value, chip_value in zip(inputs, chip_inputs):
        torch.testing.assert_close(host(chip_value.grad), value.grad, rtol=1e-4, atol=1e-4)
    for op_name in op_names:
        assert _lowered_precisions(op_name, setting) == {_STABLEHLO[setting]}, op_name


def test_half_precision_products_stay_at_highest() -> None:
    torch.set_float32_matmul_precision("medium")
    x = torch.randn(8, 16, device="tpu", dtype=torch.bfloat16)
    (x @ torch.randn(16, 4, device="tpu", dtype=torch.bfloat16)).cpu()
    plans = [plan for key, plan in dispatcher.plans.items() if getattr(plan, "op_name", None) == "aten.mm.default" and plan.in_specs[0][1] == torch.bfloat16]
    assert plans and all(plan.matmul_precision is None for plan in plans)
    assert _lowered_precisions("aten.mm.default", "medium", torch.bfloat16) == {"HIGHEST"}  # keyed on the setting, lowered at HIGHEST


@pytest.mark.parametrize("mode", _MODES, ids=["strict", "defer"])
def test_switching_the_setting_runs_the_other_program(mode: EagerMode) -> None:
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    with eager(mode):
        chip_x, chip_w = x.to("tpu"), w.to("tpu")
        for setting in ("highest", "medium", "high", "highest"):
            torch.set_float32_matmul_precision(setting)
            torch.testing.assert_close(host(chip_x @ chip_w), x @ w, rtol=1e-4, atol=1e-4)
            assert _lowered_precisions("aten.mm.default", setting) == {_STABLEHLO[setting]}


def test_the_per_backend_api_is_followed_where_torch_gives_no_single_answer() -> None:
    with _backend_flags_settable():
        torch.backends.cuda.matmul.fp32_precision = "tf32"  # CUDA's own: torch's backend-agnostic getter refuses
        assert matmul_precision.setting() == "highest"
        torch.backends.fp32_precision = "tf32"  # every backend's
        assert matmul_precision.setting() == "high"
        torch.backends.fp32_precision = "bf16"
        assert matmul_precision.setting() == "medium"


_SCRIPT = """
import torch
import tputrace

x = torch.randn(16, 64, device="tpu")
w = torch.randn(64, 32, device="tpu")
torch.tpu.synchronize()
product = torch.mm
if {compiled}:
    product = torch.compile(lambda a, b: torch.relu(a @ b), backend="tpu")
for setting in ("highest", "high", "medium", "highest"):
    torch.set_float32_matmul_precision(setting)
    print(product(x, w).sum().item())
    tputrace.step()
"""


@pytest.mark.parametrize("mode", ["strict", "defer", "compile"])
def test_the_trace_records_the_setting_and_each_switch_compiles(mode: str, tmp_path: Path) -> None:
    script = tmp_path / "switch.py"
    script.write_text(textwrap.dedent(_SCRIPT.format(compiled=mode == "compile")))
    trace_path = tmp_path / "switch.tptrace"
    assert main(["run", "--mode", mode, "-o", str(trace_path), str(script)]) == 0
    with tputrace.open(trace_path) as trace:
        rows = trace.sql(
            "SELECT c.kind, c.reason, d.text, c.detail FROM compiles c LEFT JOIN strings d ON d.id = c.diff_sid "
            "WHERE c.detail LIKE '%matmul_precision%' ORDER BY c.id"
        )
    kind = {"strict": "op", "defer": "fused", "compile": "xla"}[mode]
    compiled = [(reason, diff, json.loads(detail)["matmul_precision"]) for row_kind, reason, diff, detail in rows if row_kind == kind]
    # One program per setting: going back to "highest" reuses the first.
    assert [precision for _, _, precision in compiled] == ["highest", "high", "medium"], rows
    # Dynamo guards on allow_tf32 ("highest" against the others): "high" is a new graph there, whose
    # program is a first compile; "medium" reuses that graph and only the program's key sees the change.
    changes = ("highest -> high", "high -> medium")[mode == "compile":]
    for (reason, diff, _), change in zip(compiled[3 - len(changes):], changes):
        assert reason == "recompile" and diff.endswith(f"float32 matmul precision: {change}"), rows


_TRAINING = """
import torch
import tputrace

torch.set_float32_matmul_precision({setting!r})
layer = torch.nn.Linear(2048, 2048, bias=False).to("tpu")
x = torch.randn(1024, 2048, device="tpu")
for _ in range(3):
    layer(x).sum().item()  # tputrace: product
    tputrace.step()
"""


@pytest.fixture(scope="module")
def precision_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One recorded run of a compute-bound float32 product per setting (DeferAndFuse: measured chip time)."""
    folder = tmp_path_factory.mktemp("precision")
    traces = {}
    previous = matmul_precision.setting()  # the scripts run in this process and set it
    try:
        for setting in ("highest", "high", "medium"):
            script = folder / f"{setting}.py"
            script.write_text(textwrap.dedent(_TRAINING.format(setting=setting)))
            traces[setting] = folder / f"{setting}.tptrace"
            assert main(["run", "--mode", "defer", "-o", str(traces[setting]), str(script)]) == 0
    finally:
        torch.set_float32_matmul_precision(previous)
    return traces


def _precision_findings(path: Path) -> tuple[tuple[Finding, ...], PrecisionData]:
    result = analyze_path(path).results["precision"]
    return result.findings, result.data


def test_the_analyzer_suggests_the_lighter_setting_at_highest(precision_traces: dict[str, Path]) -> None:
    (finding,), data = _precision_findings(precision_traces["highest"])
    assert 'torch.set_float32_matmul_precision("high")' in finding.suggestion and "autocast" in finding.suggestion
    assert finding.line == 9
    assert {row.matmul_precision for row in data.products} == {"highest"}
    assert 0 < data.high_saving_estimate_ns < data.saving_estimate_ns


def test_the_analyzer_counts_products_at_high_as_three_passes(precision_traces: dict[str, Path]) -> None:
    highest_data = _precision_findings(precision_traces["highest"])[1]
    (finding,), data = _precision_findings(precision_traces["high"])
    assert 'matmul precision "high"' in finding.title and '"medium"' in finding.suggestion
    assert {row.matmul_precision for row in data.products} == {"high"}
    highest_row, high_row = highest_data.products[0], data.products[0]
    assert 0 < high_row.saving_estimate < highest_row.saving_estimate


def test_the_analyzer_leaves_products_at_medium_alone(precision_traces: dict[str, Path]) -> None:
    findings, data = _precision_findings(precision_traces["medium"])
    assert findings == ()
    assert data.products and all(row.matmul_precision == "medium" and row.saving_estimate == 0 for row in data.products)
