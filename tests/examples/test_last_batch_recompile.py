"""A loop whose last batch is smaller than the others (a dataset the batch size does not divide): every program the
last batch reaches is compiled again once, in the last step, which the report names in each mode exactly once
(in both eager modes the `recompiles` analyzer's last-batch finding; in compile mode the failed size guard's). A function first compiled after warm-up is set-up, not a problem."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

LAST_BATCH = textwrap.dedent("""\
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to("tpu")
    {compile}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(8 * 32 + {rest}, 64)  # 8 full batches of 32, then the rest
    held_out = torch.randn(16, 64)
    for step, batch in enumerate(data.split(32)):
        loss = model(batch.to("tpu")).square().mean()  # batch enters
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == 5:
            with torch.no_grad():
                print(model(held_out.to("tpu")).argmax(-1).float().mean().item())
    print(loss.item())
""")


def _late(report: object) -> list:
    return [finding for finding in report.findings if "compiled again in step" in finding.title]  # type: ignore[attr-defined]


def _script(tmp_path: Path, name: str, rest: int, compiled: bool = False) -> tuple[Path, int]:
    script = tmp_path / f"{name}.py"
    script.write_text(LAST_BATCH.format(rest=rest, compile='model = torch.compile(model, backend="tpu")' if compiled else ""))
    return script, next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "batch enters" in text)


@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_the_last_smaller_batch_recompiling_is_one_finding_in_eager_modes(tmp_path: Path, mode: str) -> None:
    """DeferAndFuse compiles the step's program again; strict mode each op's program, whose other layers' shapes
    compiled in the warm-up step are no storm: one finding, at the line the batch enters."""
    script, line = _script(tmp_path, f"last_batch_{mode}", rest=5)
    report = record(script, tmp_path / f"{mode}.tptrace", [], ("--mode", mode))
    (finding,) = _late(report)
    assert finding.analyzer == "recompiles" and finding.severity == "warning"
    assert finding.title.startswith("The last batch, smaller (5 rows, not 32), compiled again in step 8: ")
    assert (Path(finding.file).name, finding.line) == (script.name, line)
    assert "drop_last=True" in finding.suggestion and "pad the last batch" in finding.suggestion
    assert finding.cost_total_ns > 0 and finding.cost_per_step_ns is None
    (late,) = report.results["recompiles"].data.late_recompiles
    assert (late.step, late.before, late.after) == (8, 32, 5)
    assert late.step_ns > 2 * late.median_step_ns
    assert not report.results["recompiles"].data.storms  # no storm of the one step's recompiles


def test_compile_mode_names_the_last_batch_once_by_its_size_guard(tmp_path: Path) -> None:
    """Under torch.compile(backend="tpu") Dynamo's size guard fails for the last batch: that finding names it, and no
    second finding repeats it."""
    script, line = _script(tmp_path, "last_batch_compile", rest=5, compiled=True)
    report = record(script, tmp_path / "compile.tptrace", [])
    assert not _late(report) and not report.results["recompiles"].data.late_recompiles
    (guard,) = [finding for finding in report.findings if "dim 0 changed (32 -> 5)" in finding.title]
    assert guard.line == line


def test_an_even_split_with_an_evaluation_compiled_after_warm_up_has_no_recompile_finding(tmp_path: Path) -> None:
    script, _ = _script(tmp_path, "even_batches", rest=0)
    report = record(script, tmp_path / "even.tptrace", [])
    assert not _late(report) and not report.results["recompiles"].data.late_recompiles
    assert not [finding for finding in report.findings if finding.analyzer == "recompiles"]
