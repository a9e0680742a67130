"""An index out of range, diagnosed from the trace of a real `tputrace run`: the finding names the op,
its line and the syncing line, and the report, the TUI's findings view and the HTML report show it."""

from __future__ import annotations

import asyncio
import html
from pathlib import Path
from typing import Any

import pytest

import tputrace
from fixtures.make_tui_fixture import settle
from tputrace.analysis import analyze_path
from tputrace.analysis.findings import Finding
from tputrace.cli.main import main

OP_LINE, SYNC_LINE = 4, 6
# An embedding of 10 rows given the id {last_id}; the sum that reads it comes two lines later.
SCRIPT = (
    "import torch\n"
    "table = torch.nn.Embedding(10, 4).to('tpu')\n"
    "ids = torch.tensor([[1, 2], [3, {last_id}]])\n"
    "rows = table(ids.to('tpu'))\n"
    "total = rows.sum() * 2\n"
    "print(total.item())\n"
)
CAUGHT_SCRIPT = (
    "import torch\n"
    "table = torch.nn.Embedding(10, 4).to('tpu')\n"
    "for last_id in (12, 5):\n"
    "    rows = table(torch.tensor([3, last_id]).to('tpu'))\n"
    "    try:\n"
    "        print(rows.sum().item())\n"
    "    except RuntimeError:\n"
    "        pass\n"
)
MODES = {"defer": [], "strict": ["--mode", "strict"], "blocking": ["--mode", "blocking"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """(script, trace) of each run: the bad id in each mode, a clean run, and a run that catches the error.
    The scripts live in a folder whose name is Rich markup, so views that print paths must escape them."""
    folder = tmp_path_factory.mktemp("runs") / "[bold]ids[red]"
    folder.mkdir()
    scripts = {"bad": SCRIPT.format(last_id=10), "clean": SCRIPT.format(last_id=9), "caught": CAUGHT_SCRIPT}
    plans = {mode: ("bad", options) for mode, options in MODES.items()}
    plans.update(clean=("clean", []), caught=("caught", []))
    runs = {}
    for name, (script_name, options) in plans.items():
        script = folder / f"{script_name}.py"
        script.write_text(scripts[script_name])
        trace_path = folder / f"{name}.tptrace"
        status = main(["run", "--no-summary", *options, "-o", str(trace_path), str(script)])
        assert status == (1 if script_name == "bad" else 0), name
        runs[name] = (script, trace_path)
    return runs


def index_findings(trace_path: Path) -> list[Finding]:
    return [finding for finding in analyze_path(trace_path).findings if finding.analyzer == "index_errors"]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_diagnosis_names_the_op_and_its_line(runs: dict[str, tuple[Path, Path]], mode: str) -> None:
    script, trace_path = runs[mode]
    report = analyze_path(trace_path)
    (finding,) = [finding for finding in report.findings if finding.analyzer == "index_errors"]
    assert report.findings[0] == finding  # an error comes before any cost
    assert finding.severity == "critical"
    assert (finding.file, finding.line) == (str(script), OP_LINE)
    with tputrace.open(trace_path) as trace:
        assert finding.cost_total_ns == trace.wall_ns()
    assert "The run stopped with this error." in finding.explanation
    lines = {(evidence.file, evidence.line) for evidence in finding.evidence if evidence.file}
    if mode == "blocking":  # checked at the op: one line, and torch's own error
        assert finding.title == f"Index out of range in aten.embedding at bad.py:{OP_LINE}"
        assert "IndexError: index out of range in self" in finding.evidence[0].text
        assert "--mode blocking checked the indices on the host at the op" in finding.explanation
        assert "TPUTRACE_INDEX_CHECKS=0" not in finding.suggestion
        assert not lines
    else:  # checked on the chip: the op's line and the line of the sync that raised
        assert finding.title == f"Index out of range in aten.embedding at bad.py:{OP_LINE}, raised at bad.py:{SYNC_LINE} by the sync"
        assert lines == {(str(script), OP_LINE), (str(script), SYNC_LINE)}
        assert "--mode blocking" in finding.suggestion and "TPUTRACE_INDEX_CHECKS=0" in finding.suggestion
    assert finding.suggestion.startswith("Fix the index given to aten.embedding")


SAMPLING_SCRIPT = (
    "import torch\n"
    "logits = torch.tensor([[0.5, float('nan'), 1.0]]).to('tpu')\n"
    "token = torch.multinomial(logits.softmax(-1), 1)\n"
    "print(token.item())\n"
)
ONE_HOT_SCRIPT = (
    "import torch\n"
    "labels = torch.tensor([0, 2, 3]).to('tpu')\n"
    "targets = torch.nn.functional.one_hot(labels, 3)\n"
    "print(targets.sum().item())\n"
)
# script -> (the finding's title up to the op's line, the start of its suggestion)
OTHER_CHECKS = {
    SAMPLING_SCRIPT: ("Invalid values in aten.multinomial", "Fix the values given to aten.multinomial"),
    ONE_HOT_SCRIPT: ("Index out of range in aten.one_hot", "Fix the index given to aten.one_hot"),
}


@pytest.mark.parametrize("mode", ["defer", "blocking"])
@pytest.mark.parametrize("script_text", list(OTHER_CHECKS), ids=["multinomial", "one_hot"])
def test_invalid_probabilities_and_classes_are_diagnosed(tmp_path: Path, mode: str, script_text: str) -> None:
    """A nan logit makes multinomial's probabilities nan (the CPU refuses them, CUDA asserts, XLA would sample);
    a label past one_hot's classes (XLA would give a row of zeros). Both at the op's line, in both kinds of check."""
    title, suggestion = OTHER_CHECKS[script_text]
    script = tmp_path / "labels.py"
    script.write_text(script_text)
    trace_path = tmp_path / "labels.tptrace"
    assert main(["run", "--no-summary", *MODES[mode], "-o", str(trace_path), str(script)]) == 1
    (finding,) = index_findings(trace_path)
    assert (finding.file, finding.line) == (str(script), 3)
    raised = "" if mode == "blocking" else ", raised at labels.py:4 by the sync"
    assert finding.title == f"{title} at labels.py:3{raised}"
    assert finding.suggestion.startswith(suggestion)
    if script_text is SAMPLING_SCRIPT:
        assert "values its CPU kernel refuses" in finding.explanation and "checked the values" in finding.explanation


def test_a_clean_run_has_no_index_error(runs: dict[str, tuple[Path, Path]]) -> None:
    assert index_findings(runs["clean"][1]) == []


def test_an_error_the_script_caught_is_still_diagnosed(runs: dict[str, tuple[Path, Path]]) -> None:
    script, trace_path = runs["caught"]
    (finding,) = index_findings(trace_path)
    assert (finding.file, finding.line) == (str(script), 4)
    assert finding.title.endswith("raised at caught.py:6 by the sync")
    assert "The script went on after the error (1 time)" in finding.explanation


def test_the_report_command_shows_it(runs: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(runs["defer"][1])]) == 0
    text = capsys.readouterr().out
    assert f"1. [critical] Index out of range in aten.embedding at bad.py:{OP_LINE}, raised at bad.py:{SYNC_LINE}" in text
    assert "index out of range in aten.embedding at bad.py:4 (an index >= 10 or < 0)" in text


def test_the_html_report_shows_it_escaped(runs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    from tputrace.viewers.report import report_html

    output = tmp_path / "report.html"
    report_html.write_report(runs["defer"][1], output)
    page = output.read_text(encoding="utf-8")
    (finding,) = index_findings(runs["defer"][1])
    assert html.escape(finding.title) in page
    assert "(an index &gt;= 10 or &lt; 0)" in page and "(an index >= 10 or < 0)" not in page


def test_the_tui_lists_it_and_goes_to_the_ops_line(runs: dict[str, tuple[Path, Path]]) -> None:
    from tputrace.tui.app import TraceApp
    from tputrace.tui.session import Session

    script, trace_path = runs["defer"]

    async def drive(trace: Any) -> None:
        app = TraceApp(Session.open(trace))
        async with app.run_test(size=(130, 40)) as pilot:
            await settle(pilot)
            await pilot.press("2")
            await settle(pilot)
            table = app.screen.query_one("#findings-table")
            first = [str(getattr(cell, "plain", cell)) for cell in table.get_row_at(0)]
            assert first[1] == "critical" and first[4].startswith(f"Index out of range in aten.embedding at bad.py:{OP_LINE}")
            detail = app.query_one("#findings-detail").content.plain
            assert f"where: {script}:{OP_LINE}" in detail and "The run stopped with this error." in detail
            await pilot.press("enter")
            await settle(pilot)
            source = app.view("source")
            assert app.query_one("#views").active == "source"
            assert source.file is not None and source.file.file == str(script) and source.current_line() == OP_LINE

    with tputrace.open(trace_path) as trace:
        asyncio.run(drive(trace))
