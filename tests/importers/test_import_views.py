"""The views on imported captures: step numbers as the capture has them, and what an import's times are."""

from __future__ import annotations

import asyncio
import html
import json
import re
from pathlib import Path
import pytest

import tputrace
from tputrace.cli.main import main


def _import(tmp_path: Path, *paths: Path, name: str = "imported.tptrace") -> Path:
    output = tmp_path / name
    assert main(["import", *map(str, paths), "-o", str(output)]) == 0
    return output


def _overview_text(path: Path) -> str:
    """What the TUI's overview shows for a trace, run headless (read from its SVG screenshot)."""
    from fixtures.make_tui_fixture import settle
    from tputrace.tui.app import TraceApp
    from tputrace.tui.session import Session

    shown: list[str] = []

    async def drive() -> None:
        app = TraceApp(Session.open(tputrace.open(path)))
        async with app.run_test(size=(160, 50)) as pilot:
            await settle(pilot)
            svg = app.export_screenshot()
            rows: dict[int, list[tuple[float, str]]] = {}
            for match in re.finditer(r'<text [^>]*x="([\d.]+)"[^>]*clip-path="url\(#terminal-\d+-line-(\d+)\)">([^<]*)</text>', svg):
                rows.setdefault(int(match.group(2)), []).append(
                    (float(match.group(1)), html.unescape(match.group(3)).replace("\xa0", " ")))
            shown.extend("".join(text for _, text in sorted(parts)) for _, parts in sorted(rows.items()))

    asyncio.run(drive())
    return "\n".join(shown)


def test_step_numbers_are_the_captures_in_every_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A profiling schedule records ProfilerStep#2, #3, #6 and #7: the trace, the report, the TUI's step chart and
    diff speak of those numbers, as the user's log does, not of steps 1 to 4."""
    from captures import torch_schedule_capture

    output = _import(tmp_path, torch_schedule_capture(tmp_path))
    with tputrace.open(output) as trace:
        steps = {step.step: step.dur_ns for step in trace.step_times(rank=0)}
        ops_per_step = {step: trace.count("ops", where="step = ?", params=(step,)) for step in steps}
        before = trace.count("ops", where="step NOT IN (2, 3, 6, 7)")
    assert list(steps) == [2, 3, 6, 7] and before == 0 and len(set(ops_per_step.values())) == 1, ops_per_step
    slowest = max(steps, key=lambda step: steps[step])
    assert f"slowest: step {slowest} " in _overview_text(output)
    capsys.readouterr()
    assert main(["report", str(output), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 4
    assert main(["summary", str(output)]) == 0 and "4 steps" in capsys.readouterr().out
    assert main(["diff", str(output), str(output)]) == 0 and "no regression" in capsys.readouterr().out.lower()


def test_a_cpu_capture_projects_no_tpu_time_from_nothing(captures: dict[str, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """XLA:CPU's XProf capture has no XLA costs: the report, the summary and the TUI say its times were measured on
    the capture's CPU, not on this host, and project no TPU time (they said '0 ns projected for v6e')."""
    output = _import(tmp_path, captures["jax"])
    capsys.readouterr()
    assert main(["report", str(output)]) == 0
    report = capsys.readouterr().out
    assert "measured on the capture's cpu" in report and "projected" not in report
    assert main(["report", str(output), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["projected_median_step_ns"] is None
    assert main(["summary", str(output)]) == 0
    summary = capsys.readouterr().out
    assert "measured on its cpu, not a TPU's; it has no XLA costs, so no TPU time is projected" in summary
    assert "XLA:CPU" not in summary and "projected for" not in summary
    overview = _overview_text(output)
    assert "projected for" not in overview
    assert "measured on the capture's cpu" in overview and "this host" not in overview


def test_gloo_collectives_are_not_compared_with_a_tpus_ici(tmp_path: Path) -> None:
    """Two gloo ranks on this host's CPU: the collectives finding says their bandwidth is the capture's own, measured
    on its CPU, with no TPU ICI beside it; without steps it is a share of the run, not 'of each step'."""
    from captures import torch_gloo_capture

    from tputrace.analysis import analyze_path

    output = _import(tmp_path, torch_gloo_capture(tmp_path))
    findings = [finding for finding in analyze_path(output).findings if finding.analyzer == "collectives"]
    assert not any("ICI of" in finding.explanation for finding in findings), findings
    # On a busy host one rank can also wait on the other long enough for a straggler finding beside this one.
    (share,) = [finding for finding in findings if finding.title.endswith("of the run on rank 0")]
    assert "measured on the capture's cpu" in share.explanation


@pytest.mark.parametrize("raw", [False, True])
def test_dump_lists_an_imports_ops_in_dispatch_order(captures: dict[str, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str], raw: bool) -> None:
    """A torch.profiler op's row is written when it ends, a parent after its children: `dump` lists ops by their
    dispatch sequence, not as stored."""
    output = _import(tmp_path, captures["profiler"])
    capsys.readouterr()
    assert main(["dump", "--kind", "ops", "--json", *(["--raw"] if raw else []), str(output)]) == 0
    order = [(row["rank"], row["seq"]) for row in map(json.loads, capsys.readouterr().out.splitlines())]
    with tputrace.open(output) as trace:
        stored = [seq for (seq,) in trace.sql("SELECT seq FROM ops ORDER BY rowid")]
    assert stored != sorted(stored)  # the capture's ops are not stored in dispatch order
    assert len(order) == len(stored) and order == sorted(order)
