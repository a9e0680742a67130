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
