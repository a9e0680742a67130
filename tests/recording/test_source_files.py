"""The trace keeps each user source file's digest as the run saw it (`source_files`), and the TUI's
source view prefers the copy the run used and warns when the file it shows changed since."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import sqlite3
import textwrap
from pathlib import Path
from typing import Any

import pytest

import tputrace
from fixtures.make_tui_fixture import settle
from tputrace.cli.main import main
from tputrace.source_digests import SourceDigest
from tputrace.tui import queries

SCRIPT = textwrap.dedent(
    """\
    import torch
    import tputrace.backend

    x = torch.ones(8, 8, device="tpu")
    for step in range(3):
        total = (x @ x).sum()
        print(total.item())
    """
)
CHANGED_WARNING = "changed since the run was recorded"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(script, trace) of a real run."""
    directory = tmp_path_factory.mktemp("source_files")
    script = directory / "train.py"
    script.write_text(SCRIPT)
    trace_path = directory / "train.tptrace"
    assert main(["run", "-o", str(trace_path), str(script)]) == 0
    return script, trace_path


def source_view_status(trace_path: Path, roots: tuple[str, ...]) -> tuple[str, Path | None]:
    """The source view's status line and the file it shows, for the trace's hottest file."""
    from tputrace.tui.app import TraceApp
    from tputrace.tui.session import Session

    seen: dict[str, Any] = {}

    async def drive() -> None:
        with tputrace.open(trace_path) as trace:
            app = TraceApp(Session(trace, 0, roots))
            async with app.run_test(size=(130, 40)) as pilot:
                await settle(pilot)
                await pilot.press("8")
                await settle(pilot)
                view = app.view("source")
                for _ in range(100):
                    if view.source is not None:
                        break
                    await asyncio.sleep(0.05)
                seen["status"] = str(app.screen.query_one("#source-status").render())
                seen["path"] = view.source.path if view.source is not None else None

    asyncio.run(drive())
    return seen["status"], seen["path"]


def test_the_trace_records_the_scripts_digest(recorded: tuple[Path, Path]) -> None:
    script, trace_path = recorded
    with tputrace.open(trace_path) as trace:
        files = trace.source_files()
        assert trace.count("source_files") == 1
    record = files[str(script)]
    assert (record.rank, record.sha256, record.size) == (0, hashlib.sha256(SCRIPT.encode()).hexdigest(), len(SCRIPT.encode()))


def test_the_source_view_warns_only_when_the_file_changed(recorded: tuple[Path, Path]) -> None:
    script, trace_path = recorded
    status, shown = source_view_status(trace_path, ())
    assert shown == script and CHANGED_WARNING not in status
    original = script.read_text()
    try:
        script.write_text("# edited after the run\n" + SCRIPT)
        status, shown = source_view_status(trace_path, ())
        assert shown == script and CHANGED_WARNING in status
    finally:
        script.write_text(original)


def test_a_copy_with_the_runs_content_is_preferred_over_a_changed_file(recorded: tuple[Path, Path], tmp_path: Path) -> None:
    script, trace_path = recorded
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copy(script, checkout / "train.py")
    with tputrace.open(trace_path) as trace:
        record = trace.source_files()[str(script)]
    seen = SourceDigest(record.sha256, record.size)
    original = script.read_text()
    try:
        script.write_text(original.replace("range(3)", "range(30)"))
        assert queries.resolve_source(str(script), [str(checkout)], seen) == checkout / "train.py"
        assert queries.resolve_source(str(script), [str(checkout)]) == script
        status, shown = source_view_status(trace_path, (str(checkout),))
        assert shown == checkout / "train.py" and CHANGED_WARNING not in status
    finally:
        script.write_text(original)


def test_a_trace_older_than_the_table_reads_it_as_empty(recorded: tuple[Path, Path], tmp_path: Path) -> None:
    _, trace_path = recorded
    older = tmp_path / "older.tptrace"
    shutil.copy(trace_path, older)
    with sqlite3.connect(older) as connection:
        connection.execute("DROP TABLE source_files")
    connection.close()
    with tputrace.open(older) as trace:
        assert not trace.has_table("source_files")
        assert trace.counts()["source_files"] == 0
        assert trace.source_files() == {} and list(trace.records("source_files")) == []
        assert trace.count("ops") > 0
    status, shown = source_view_status(older, ())
    assert shown is not None and CHANGED_WARNING not in status
