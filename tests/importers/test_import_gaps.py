"""Problems the report on an imported capture must name, on capture kinds the other importer tests do not make."""

from __future__ import annotations

from pathlib import Path

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
