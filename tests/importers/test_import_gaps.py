"""Problems the report on an imported capture must name, on capture kinds the other importer tests do not make."""

from __future__ import annotations

from pathlib import Path

import pytest

import tputrace

from tputrace.analysis import analyze_path
from tputrace.cli.main import main


def test_a_compile_that_failed_and_left_its_function_eager_is_a_finding(tmp_path: Path) -> None:
    from captures import TORCH_FAILED_COMPILE, torch_failed_compile_capture

    def_line = next(index for index, text in enumerate(TORCH_FAILED_COMPILE.splitlines(), 1) if "def loss_of" in text)
    run = torch_failed_compile_capture(tmp_path)
    both, log_only = tmp_path / "both.tptrace", tmp_path / "log.tptrace"
    assert main(["import", str(run), "-o", str(both)]) == 0
    assert main(["import", str(run / "torch_trace"), "-o", str(log_only)]) == 0

    (finding,) = [found for found in analyze_path(both).findings if "failed" in found.title]
    assert finding.severity == "warning"
    assert (Path(finding.file or "").name, finding.line) == ("failed_compile.py", def_line)
    assert finding.title.startswith("torch.compile of loss_of (failed_compile.py:")
    assert "RuntimeError: cannot lower aten.addmm: unsupported layout" in finding.title
    assert "second line" not in finding.title and "runs eagerly" in finding.title
    assert "4 eager calls" in finding.explanation
    assert finding.cost_per_step_ns is not None and finding.cost_per_step_ns > 0

    (alone,) = [found for found in analyze_path(log_only).findings if "failed" in found.title]
    assert alone.cost_total_ns == 0 and "with_stack=True" in alone.explanation


def test_jax_recompiles_with_unchanged_shapes_are_named_by_what_changed(tmp_path: Path) -> None:
    from captures import JAX_RECOMPILE_CAUSES, jax_recompile_causes_capture

    lines = JAX_RECOMPILE_CAUSES.splitlines()
    output = tmp_path / "causes.tptrace"
    assert main(["import", str(jax_recompile_causes_capture(tmp_path)), "-o", str(output)]) == 0
    report = analyze_path(output)
    storms = {finding.title.split(" compiled ")[0].removeprefix("Recompilation storm: "): finding
              for finding in report.findings if finding.analyzer == "recompiles"}

    static = storms["jit_update"]
    assert "5 times with the same input shapes" in static.title
    assert "a constant in its program changed (0.1, 0.05, 0.0333333, 0.025, 0.02)" in static.title
    assert "static_argnames" in static.explanation and "static_argnames" in static.suggestion
    assert static.line is not None and "static_argnames" in lines[static.line - 1] and static.cost_total_ns > 0

    rejitted = storms["jit__lambda"]
    assert "the same program was compiled again" in rejitted.title
    assert "outside the loop" in rejitted.suggestion

    shapes = storms["jit_fit"]
    assert "input 1 dim 0 took 5 values (8, 9, 10, 11, 12)" in shapes.explanation
    for advice in (shapes.explanation, shapes.suggestion):
        assert "flushed" not in advice and "collate_fn" not in advice
    assert "the jitted function at" in shapes.explanation and "jnp.pad" in shapes.suggestion


@pytest.mark.parametrize("source", ["generator", "queue", "traceme"])
def test_devices_idle_while_the_host_makes_batches_is_an_input_bound_finding(tmp_path: Path, source: str) -> None:
    from captures import JAX_INPUT_BOUND, jax_input_bound_capture

    batch_line = next(index for index, text in enumerate(JAX_INPUT_BOUND.splitlines(), 1) if "def make_batch" in text)
    output = tmp_path / "input.tptrace"
    assert main(["import", str(jax_input_bound_capture(tmp_path, source)), "-o", str(output)]) == 0
    (finding,) = [found for found in analyze_path(output).findings if found.analyzer == "input_wait"]
    assert finding.title.startswith("The devices idle ") and "waiting for the host" in finding.title
    assert finding.cost_per_step_ns is not None and finding.cost_per_step_ns > 0
    assert "prefetch" in finding.suggestion and "collate_fn" not in finding.suggestion
    if source == "traceme":  # no Python frames: the user's range around the input code names it
        assert finding.title.endswith("the host is in load_batch")
        return
    assert f"the host is in jax_input_{source}.py:{batch_line} make_batch" in finding.title
    assert "`time sleep`" in finding.explanation and finding.line == batch_line


def test_a_jax_loops_smaller_last_batch_recompiling_is_named_with_jax_advice(tmp_path: Path) -> None:
    from captures import jax_last_batch_capture

    output = tmp_path / "last.tptrace"
    assert main(["import", str(jax_last_batch_capture(tmp_path)), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        diffs = [compile.diff for compile in trace.records("compiles")]
    assert diffs == [None, "arg 1 dim 0: 64 -> 5"]
    (late,) = [found for found in analyze_path(output).findings if "compiled again in step" in found.title]
    assert late.title.startswith("The last batch, smaller (5 rows, not 64), compiled again in step 8: ")
    assert "drop_remainder=True" in late.suggestion and "DataLoader" not in late.suggestion


def test_a_fullgraph_compile_that_failed_names_the_line_dynamo_could_not_trace(tmp_path: Path) -> None:
    from captures import TORCH_FULLGRAPH_FAILED, torch_fullgraph_failed_capture

    branch_line = next(index for index, text in enumerate(TORCH_FULLGRAPH_FAILED.splitlines(), 1) if "if y.sum()" in text)
    output = tmp_path / "fullgraph.tptrace"
    assert main(["import", str(torch_fullgraph_failed_capture(tmp_path)), "-o", str(output)]) == 0
    (finding,) = [found for found in analyze_path(output).findings if "failed" in found.title]
    assert f"failed at fullgraph_failed.py:{branch_line}: Data-dependent branching; it runs eagerly" in finding.title
    assert "torch.where" in finding.suggestion
    assert any(evidence.line == branch_line for evidence in finding.evidence)
