"""A torch.compile (Inductor) loop's torch.profiler capture imported with its TORCH_TRACE log: the last, smaller
batch makes Dynamo compile the model again in the last step, one recompile that takes a large share of the run,
which the report names at the line calling the model, with the fixes for a smaller last batch."""

from __future__ import annotations

from pathlib import Path

from tputrace.analysis import analyze_path
from tputrace.cli.main import main


def test_the_last_smaller_batch_recompiling_is_a_finding_on_an_inductor_import(tmp_path: Path) -> None:
    from captures import TORCH_LAST_BATCH, torch_last_batch_capture

    call_line = next(index for index, text in enumerate(TORCH_LAST_BATCH.splitlines(), 1) if "compiled(batch)" in text)
    output = tmp_path / "imported.tptrace"
    assert main(["import", str(torch_last_batch_capture(tmp_path)), "-o", str(output)]) == 0
    report = analyze_path(output)
    late = [finding for finding in report.findings if "compiled again in step" in finding.title]
    assert len(late) == 1, [finding.title for finding in report.findings]
    finding = late[0]
    assert finding.analyzer == "recompiles"
    assert finding.title.startswith("The last batch, smaller (5 rows, not 32), compiled again in step 8: ")
    assert (Path(finding.file).name, finding.line) == ("last_batch.py", call_line)
    assert "drop_last=True" in finding.suggestion and "torch._dynamo.mark_dynamic(x, 0)" in finding.suggestion
    assert "expected 32, actual 5" in finding.evidence[0].text
    (data,) = report.results["recompiles"].data.late_recompiles
    assert data.step_ns > 2 * data.median_step_ns
