"""torch.profiler captures whose steps or wall need more than the `ProfilerStep#N` markers: a profile without a schedule
(its steps the user's `record_function` around each iteration), and a schedule that repeats (its windows' time apart
from the unrecorded gaps between them)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import tputrace
from tputrace.cli.main import main


def _import(tmp_path: Path, capture: Path) -> tputrace.Trace:
    output = tmp_path / "imported.tptrace"
    assert main(["import", str(capture), "-o", str(output)]) == 0
    return tputrace.open(output)


def test_an_unscheduled_profile_takes_its_steps_from_the_users_repeated_range(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from captures import torch_unscheduled_capture

    capture = torch_unscheduled_capture(tmp_path)
    events = json.loads(capture.read_text())["traceEvents"]
    assert not [event for event in events if str(event.get("name", "")).startswith("ProfilerStep#")]
    trace = _import(tmp_path, capture)
    steps = [step for step in trace.records("steps") if step.source == "imported"]
    assert [step.step for step in steps] == [1, 2, 3, 4]
    (source,) = json.loads(trace.meta["imported"])
    # `train_step`, not the shorter `load` before it, the `forward` nested in it, nor the other thread's longer `poll`.
    assert (source["step_source"], source["step_range"]) == ("user_annotation", "train_step")
    train_steps = sorted((row.start_ns, row.start_ns + row.dur_ns) for row in trace.records("annotations")
                         if row.name == "train_step")
    # Each step ends with its range, and starts where the step before it ended (the first: with its range), as
    # `ProfilerStep#N` markers divide a loop.
    starts = [train_steps[0][0]] + [end for _, end in train_steps[:-1]]
    assert len(train_steps) == 4 and all(abs(step.start_ns - start) <= 1 and abs(step.end_ns - end) <= 1  # rounding
                                         for step, start, (_, end) in zip(steps, starts, train_steps))
    # The batch loaded between two `train_step` ranges is in the step it is loaded for, not the one before it.
    loads = sorted(row.start_ns for row in trace.records("annotations") if row.name == "load")
    randn_steps = [op.step for op in sorted(trace.records("ops"), key=lambda op: op.start_ns)
                   if op.op == "aten::randn" and op.start_ns >= loads[1]]
    assert randn_steps == [2, 3, 4]
    # Each step holds its iteration's ops: two linear layers forward, their gradients' matmuls and the SGD update.
    for name, per_iteration in (("aten::addmm", 2), ("aten::mm", 3), ("aten::add_", 4)):
        assert Counter(op.step for op in trace.records("ops") if op.op == name) == dict.fromkeys(range(1, 5),
                                                                                                 per_iteration), name
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "imported.tptrace")]) == 0
    assert "4 steps" in capsys.readouterr().out


def test_a_profile_with_step_markers_keeps_them(captures: dict[str, Path], tmp_path: Path) -> None:
    from captures import torch_schedule_capture

    trace = _import(tmp_path, torch_schedule_capture(tmp_path))  # its `forward_backward` ranges repeat too
    (source,) = json.loads(trace.meta["imported"])
    assert "step_source" not in source
    assert [step.step for step in trace.records("steps")] == [2, 3, 6, 7]


def test_the_time_split_of_repeated_windows_is_of_the_windows_time(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from captures import torch_repeated_windows_capture

    folder = torch_repeated_windows_capture(tmp_path)
    windows = sorted(folder.glob("*.pt.trace.json"))
    assert len(windows) == 3
    trace = _import(tmp_path, folder)
    (source,) = json.loads(trace.meta["imported"])
    # Each window's time: Kineto's span of it (`PyTorch Profiler (N)`).
    spans = [next(event["dur"] for event in json.loads(path.read_text())["traceEvents"] if event.get("cat") == "Trace")
             for path in windows]
    assert abs(source["recorded_ns"] - sum(spans) * 1000) < 10
    wall = trace.wall_ns()
    steps = list(trace.records("steps"))
    # The windows' time leaves out the unrecorded steps between them (a busy host can stretch one window's step to
    # most of the wall, so no fixed share of it is asserted).
    assert len(steps) == 3 and sum(step.end_ns - step.start_ns for step in steps) <= source["recorded_ns"] < wall
    ops_ns = sum(op.dur_ns for op in trace.records("ops"))
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "imported.tptrace")]) == 0
    text = capsys.readouterr().out
    assert "time split (% of the profiling windows'" in text
    (dispatch,) = [line for line in text.splitlines() if line.strip().startswith("host dispatch ")]
    assert dispatch.split()[-1] == f"{100 * ops_ns / source['recorded_ns']:.1f}%"
    # The TUI's overview gives the same share of the same windows' time.
    from rich.console import Console

    from tputrace.derived.run_facts import run_facts
    from tui.overview import split_table

    facts = run_facts(trace, 0)
    assert facts.recorded_ns == source["recorded_ns"]
    console = Console(width=160, record=True)
    console.print(split_table(trace.time_split(rank=0), "green", facts))
    rendered = console.export_text()
    (tui_dispatch,) = [line for line in rendered.splitlines() if line.strip().startswith("host dispatch ")]
    assert tui_dispatch.split()[4] == f"{100 * ops_ns / source['recorded_ns']:.1f}%" and "profiled" in rendered
