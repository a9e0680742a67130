"""`tputrace run --steps N`, `--schedule ...` and `--from-code` on real runs: the trace keeps exactly the
window's steps, what it keeps of them is what a whole recording has of them, and every view says so."""

from __future__ import annotations

import json
import textwrap
import warnings
from collections import Counter
from pathlib import Path

import pytest

import tputrace
from tputrace.analysis.render import render_json, render_text as render_report_text
from tputrace.analysis.report import analyze
from tputrace.cli.main import main
from tputrace.derived.recording_window import recording_window
from tputrace.derived.run_facts import run_facts
from tputrace.summary import NO_DEVICE_OPS_TEXT, render_text, summarize

STEPS = 6
TRAIN = f"""
import sys
import torch
import tputrace

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
from_code = "from-code" in sys.argv
for step in range({STEPS}):
    if from_code and step == 2:
        tputrace.start()
    x = torch.randn(16, 8, device="tpu")
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if from_code and step == 3:
        tputrace.stop()
    print("ran step", step)
if from_code:
    with tputrace.record():
        total = model[0].weight.sum()
print("loss", loss.item())
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("window") / "train.py"
    path.write_text(textwrap.dedent(TRAIN))
    return path


def _record(script: Path, folder: Path, name: str, *options: str, script_args: tuple[str, ...] = ()) -> Path:
    """One `tputrace run`, compiling afresh as a process of its own would (the recordings share this process)."""
    from tputrace.backend.core.executor import forget_compiled_programs

    forget_compiled_programs()
    trace_path = folder / f"{name}.tptrace"
    assert main(["run", "--quiet", "--no-summary", *options, "-o", str(trace_path), str(script), *script_args]) == 0
    return trace_path


@pytest.fixture(scope="module")
def traces(script: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("window_traces")
    return {
        "whole": _record(script, folder, "whole"),
        "steps": _record(script, folder, "steps", "--steps", "2"),
        "schedule": _record(script, folder, "schedule", "--schedule", "wait=1,warmup=1,active=2,repeat=1"),
        "from_code": _record(script, folder, "from_code", "--from-code", script_args=("from-code",)),
        "never_opened": _record(script, folder, "never_opened", "--from-code"),
    }


def _ops_by_step(trace_path: Path) -> dict[int, Counter[str]]:
    with tputrace.open(trace_path) as trace:
        rows = trace.sql("SELECT o.step, s.text FROM ops o JOIN strings s ON s.id = o.op_sid")
    by_step: dict[int, Counter[str]] = {}
    for step, name in rows:
        by_step.setdefault(step, Counter())[name] += 1
    return by_step


def _step_numbers(trace_path: Path) -> list[int]:
    with tputrace.open(trace_path) as trace:
        return [row[0] for row in trace.sql("SELECT step FROM steps ORDER BY step")]


def test_steps_keeps_the_first_steps_and_the_script_runs_on(traces: dict[str, Path], capfd: pytest.CaptureFixture[str]) -> None:
    whole, kept = _ops_by_step(traces["whole"]), _ops_by_step(traces["steps"])
    assert sorted(kept) == [0, 1] and _step_numbers(traces["steps"]) == [0, 1]
    assert kept == {step: whole[step] for step in (0, 1)}
    with tputrace.open(traces["steps"]) as trace:
        window = recording_window(trace)
        assert trace.run.exit_status == 0
    assert window is not None and window.kind == "steps" and window.recorded_steps == ((0, 1),)


def test_schedule_keeps_the_steps_torch_profiler_records(traces: dict[str, Path]) -> None:
    whole, kept = _ops_by_step(traces["whole"]), _ops_by_step(traces["schedule"])
    assert sorted(kept) == [2, 3] and _step_numbers(traces["schedule"]) == [2, 3]
    assert kept == {step: whole[step] for step in (2, 3)}
    with tputrace.open(traces["schedule"]) as trace:
        assert trace.count("compiles") == 0  # the programs were compiled in steps 0-1, outside the window
        programs = {row[0] for row in trace.sql("SELECT id FROM programs")}
        flush_programs = {row[0] for row in trace.sql("SELECT program_id FROM flushes")}
        assert flush_programs and flush_programs <= programs
        assert {row[0] for row in trace.sql("SELECT program_id FROM ops WHERE program_id IS NOT NULL")} <= programs
        assert {row[0] for row in trace.sql("SELECT DISTINCT step FROM executions")} == {2, 3}
        assert {row[0] for row in trace.sql("SELECT DISTINCT step FROM flushes")} == {2, 3}
        window = recording_window(trace)
    assert window is not None and window.recorded_steps == ((2, 3),)
    assert window.text == "this trace records steps 2-3 of the run (--schedule wait=1,warmup=1,active=2,repeat=1); the other steps ran unrecorded"


def test_from_code_keeps_what_runs_between_start_and_stop(traces: dict[str, Path]) -> None:
    kept = _ops_by_step(traces["from_code"])
    whole = _ops_by_step(traces["whole"])
    assert {step: kept[step] for step in (2, 3)} == {step: whole[step] for step in (2, 3)}
    assert sorted(kept) == [2, 3, STEPS]  # and the ops inside `with tputrace.record():` after the loop
    assert kept[STEPS] == Counter({"aten.sum.default": 1})
    with tputrace.open(traces["from_code"]) as trace:
        window = recording_window(trace)
    assert window is not None and window.recorded_steps == ((2, 3), (STEPS, STEPS))


def test_every_view_says_which_steps_the_trace_records(traces: dict[str, Path]) -> None:
    from tputrace.tui.overview import facts_text
    from tputrace.viewers.report.data import prepare_report
    from tputrace.viewers.report.report_html import render_report

    sentence = "this trace records steps 2-3 of the run (--schedule wait=1,warmup=1,active=2,repeat=1)"
    with tputrace.open(traces["schedule"]) as trace:
        summary = summarize(trace)
        report = analyze(trace)
        html = render_report(prepare_report(trace), plotlyjs="cdn")
        tui = facts_text(run_facts(trace)).plain
    assert summary.step_count == 2
    assert f"window {sentence}" in render_text(summary)
    assert f"window: {sentence}" in render_report_text(report)
    assert json.loads(render_json(report))["recording_window"]["recorded_steps"] == [[2, 3]]
    assert f"<th>window</th><td>{sentence}" in html
    assert sentence in tui


def test_a_window_that_never_opened_says_so_and_not_that_no_op_ran(traces: dict[str, Path]) -> None:
    with tputrace.open(traces["never_opened"]) as trace:
        assert trace.count("ops") == 0 and trace.count("steps") == 0
        text = render_text(summarize(trace))
        report = analyze(trace)
    assert "the recording window (--from-code) never opened" in text
    assert NO_DEVICE_OPS_TEXT not in text
    assert not [finding for finding in report.findings if finding.severity == "critical"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--schedule", "wait=1,active=2"], "--schedule 'wait=1,active=2': warmup missing"),
        (["--schedule", "wait=1,warmup=1,active=0"], "active must be at least 1"),
        (["--schedule", "wait=-1,warmup=1,active=2"], "wait must not be negative"),
        (["--schedule", "wait=1,warmup=1,active=2,every=3"], "'every=3' is not one of"),
        (["--steps", "0"], "--steps must be at least 1, not 0"),
    ],
)
def test_a_bad_window_is_a_one_line_error(script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          options: list[str], message: str) -> None:
    trace_path = tmp_path / "bad.tptrace"
    assert main(["run", "--quiet", *options, "-o", str(trace_path), str(script)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("tputrace: error: ") and message in error and error.count("\n") == 1
    assert not trace_path.exists()


def test_start_and_stop_do_nothing_outside_a_recording() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tputrace.start()
        tputrace.stop()
        with tputrace.record():
            pass


def test_the_progress_line_says_when_the_window_is_closed() -> None:
    from tputrace.cli.run import format_status

    assert format_status({"steps": 3, "ops": 10, "recording": 0}).endswith(" · outside the recording window")
    assert "window" not in format_status({"steps": 3, "ops": 10, "recording": 1})


def test_each_rank_records_the_window_and_the_merged_trace_says_so(script: Path, tmp_path: Path) -> None:
    trace_path = tmp_path / "ranks.tptrace"
    assert main(["run", "--quiet", "--no-summary", "--nproc", "2", "--steps", "1", "-o", str(trace_path), str(script)]) == 0
    with tputrace.open(trace_path) as trace:
        steps_by_rank = trace.sql("SELECT rank, step FROM steps ORDER BY rank, step")
        op_steps = {row[0] for row in trace.sql("SELECT DISTINCT step FROM ops")}
        window = recording_window(trace)
    assert steps_by_rank == [(0, 0), (1, 0)] and op_steps == {0}
    assert window is not None and window.spec == "--steps 1" and window.recorded_steps == ((0, 0),)
