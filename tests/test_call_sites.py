"""Calls on one source line: in strict mode each call of an op compiles its own programs, so a line with
three matmuls whose shapes change each step has three recompile storms, each with its own varying dims,
named by the call's column and text, while per-line views still show the line once."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tputrace.analysis import analyze
from tputrace.store.reader import open_trace
from tputrace.store.records import SourceLocation
from tputrace.store.writer import TraceWriter
from tputrace.tui import queries
from tputrace.tui.compiles import compile_detail
from tputrace.viewers import plotly_data

CALLS_LINE = "    scores = (q @ w) @ (w @ k)"
SCRIPT = textwrap.dedent(
    """
    import torch
    import tputrace

    w = torch.ones(16, 16, device="tpu")
    for step in range(6):
        n = 8 + 4 * step
        q = torch.ones(n, 16, device="tpu")
        k = torch.ones(16, n, device="tpu")
    {calls_line}
        tputrace.step()
        print(float(scores.sum()))
    """
).format(calls_line=CALLS_LINE)


@pytest.fixture(scope="module")
def strict_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("calls")
    script = folder / "calls.py"
    script.write_text(SCRIPT)
    trace = folder / "calls.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--mode", "strict", "-o", str(trace), str(script)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=folder)
    assert completed.returncode == 0, completed.stderr
    sizes = [8 + 4 * step for step in range(6)]
    assert [float(value) for value in completed.stdout.split()] == [16.0 * 16 * 16 * n * n for n in sizes]
    return script, trace


def _label(text: str) -> str:
    line = SCRIPT.splitlines().index(CALLS_LINE) + 1
    return f"calls.py:{line}:col {CALLS_LINE.index(text) + 1} ({text})"


def test_each_call_on_the_line_is_its_own_storm_with_its_own_dims(strict_trace: tuple[Path, Path]) -> None:
    _, trace_path = strict_trace
    with open_trace(trace_path) as trace:
        report = analyze(trace)
    storms = {storm["call"]: storm for storm in report.results["recompiles"].data["storms"] if storm["name"] == "aten.mm.default"}
    # q @ w: (n, 16) x (16, 16); w @ k: (16, 16) x (16, n); their product: (n, 16) x (16, n).
    # At n = 16 the first two are the same program, so the second call compiles one size fewer.
    expected = {
        _label("q @ w"): ({(0, 0)}, [8, 12, 16, 20, 24, 28]),
        _label("w @ k"): ({(1, 1)}, [8, 12, 20, 24, 28]),
        _label("(q @ w) @ (w @ k)"): ({(0, 0), (1, 1)}, [8, 12, 20, 24, 28]),
    }
    assert set(storms) == set(expected)
    for call, (positions, values) in expected.items():
        (dim,) = storms[call]["varying_dims"]
        assert {tuple(position) for position in dim["positions"]} == positions
        assert dim["values"] == values
    titles = [finding.title for finding in report.results["recompiles"].findings]
    assert all(any(call in title for title in titles) for call in expected)


def test_per_line_views_keep_the_line_together(strict_trace: tuple[Path, Path]) -> None:
    script, trace_path = strict_trace
    line = SCRIPT.splitlines().index(CALLS_LINE) + 1
    with open_trace(trace_path) as trace:
        compile_locations = [record.source for record in trace.records("compiles") if record.source is not None]
        at_line = [location for location in compile_locations if location.line == line]
        assert len({location.call_key for location in at_line}) == 3
        assert len(set(at_line)) == 1  # one location for per-line grouping
        sites = [site for site in queries.compile_sites(trace, 0) if site.source is not None and site.source.line == line]
        assert len(sites) == 1 and sites[0].count == len(at_line)
        (file_stat,) = [stat for stat in queries.source_stats(trace, 0) if stat.file == str(script)]
        assert file_stat.lines[line].compiles == len(at_line)
        details = {compile_detail(row).plain.split("call site: ")[1].splitlines()[0]
                   for row in queries.compile_rows(trace, 0) if row.source is not None and row.source.line == line}
    assert details == {f"{script}:{line} (<module>) · col {CALLS_LINE.index(text) + 1}"
                       for text in ("q @ w", "w @ k", "(q @ w) @ (w @ k)")}


def test_a_file_without_frame_columns_reads_them_as_none(tmp_path: Path) -> None:
    path = tmp_path / "older.tptrace"
    writer = TraceWriter(path)
    writer.set_run(world_size=1, script="train.py", argv=[])
    frame_id = writer.frame("/proj/train.py", 7, "main", 4, 9)
    writer.close()
    with sqlite3.connect(path) as connection:
        connection.execute("ALTER TABLE frames DROP COLUMN end_col")
        connection.execute("ALTER TABLE frames DROP COLUMN col")
    with open_trace(path) as trace:
        location = trace.frame(frame_id)
        (record,) = trace.records("frames")
    assert location == SourceLocation("/proj/train.py", 7, "main")
    assert (location.col, location.end_col, record.col, record.end_col) == (None, None, None, None)


def test_the_html_report_names_each_call(strict_trace: tuple[Path, Path]) -> None:
    _, trace_path = strict_trace
    line = SCRIPT.splitlines().index(CALLS_LINE) + 1
    with open_trace(trace_path) as trace:
        data = plotly_data.prepare_recompilations(trace)
    sites = {item.site for item in data.varying if item.name == "aten.mm.default"}
    assert sites == {f"calls.py:{line}:col {CALLS_LINE.index(text) + 1}" for text in ("q @ w", "w @ k", "(q @ w) @ (w @ k)")}
