"""The TUI's Compare view of a recorded run against an imported torch.profiler capture (both made here): what the
capture does not record is shown as not recorded, and neither a regression nor an improvement."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="recording needs torch (pip install -e .[backend])")
pytest.importorskip("textual")

from fixtures.make_tui_fixture import settle  # noqa: E402
from recording.test_compare_imports import recorded_and_imported  # noqa: E402

import tputrace  # noqa: E402


def test_compare_view_shows_figures_the_import_lacks_as_not_recorded(tmp_path: Path) -> None:
    from textual.widgets import Static

    from tputrace.tui.app import TraceApp
    from tputrace.tui.session import Session

    recorded, imported = recorded_and_imported(tmp_path)
    session = Session.open(tputrace.open(imported), baseline_path=recorded)

    async def drive() -> None:
        app = TraceApp(session)
        async with app.run_test(size=(180, 50)) as pilot:
            await settle(pilot)
            await pilot.press("0")
            await settle(pilot)
            table = app.screen.query_one("#compare-figures")
            rows = {str(cells[0]): [str(getattr(cell, "plain", cell)) for cell in cells]
                    for cells in (table.get_row_at(index) for index in range(table.row_count))}
            for name in ("host syncs", "transfers", "recompiles after warm-up", "peak memory"):
                assert "-> not recorded (B: " in rows[name][1] and rows[name][2] == "", rows[name]
            status = str(app.screen.query_one("#compare-status").render())
            assert "no regression" in status
            improved = app.screen.query_one("#compare-improved", Static)
            assert str(improved.render()).strip() == ""

    asyncio.run(drive())
