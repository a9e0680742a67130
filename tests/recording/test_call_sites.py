"""Calls on one source line: in strict mode each call of an op compiles its own programs, so a line with
three matmuls whose shapes change each step has three recompile storms, each with its own varying dims,
named by the call's column and text (in characters; a call over several lines reads as one), while per-line
views still show the line once; the TUI's compile sites give such a line a row per call."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fixtures.make_tui_fixture import settle

import tputrace
from tputrace.analysis import analyze
from tputrace.analysis.call_sites import call_label, call_name, call_text
from tputrace.cli.main import main
from tputrace.merge import merge_traces
from tputrace.source_digests import digest_file
from tputrace.store.reader import open_trace
from tputrace.store.records import SourceLocation
from tputrace.store.writer import TraceWriter
from tputrace.tui import queries
from tputrace.tui.compiles import UNCHECKED_COLUMNS, compile_detail
from tputrace.tui.session import Session
from tputrace.viewers.report import compile_data

CALLS_LINE = "    scores = (q @ w) @ (w @ k)"
ACCENTED_LINE = '    résumé = ("é", torch.mm(q, [u][0]) @ ut)[1]  # 日本語'  # `[u]` is also Rich markup (underline)
MULTILINE_CALL = """\
    pair = (torch.mm(z, k), torch.matmul(
        ut,  # the (4, 16) one
        k,
    ))"""
SCRIPT = textwrap.dedent(
    """
    import torch
    import tputrace

    w = torch.ones(16, 16, device="tpu")
    u, ut, z = torch.ones(16, 4, device="tpu"), torch.ones(4, 16, device="tpu"), torch.ones(2, 16, device="tpu")
    for step in range(6):
        n = 8 + 4 * step
        q = torch.ones(n, 16, device="tpu")
        k = torch.ones(16, n, device="tpu")
    {calls_line}
    {accented_line}
    {multiline_call}
        tputrace.step()
        print(float(scores.sum()))
    """
).format(calls_line=CALLS_LINE, accented_line=ACCENTED_LINE, multiline_call=MULTILINE_CALL)
SIZES = [8 + 4 * step for step in range(6)]


@pytest.fixture(scope="module")
def strict_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("calls")
    script = folder / "calls.py"
    script.write_text(SCRIPT, encoding="utf-8")
    trace = folder / "calls.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--mode", "strict", "-o", str(trace), str(script)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=folder)
    assert completed.returncode == 0, completed.stderr
    assert [float(value) for value in completed.stdout.split()] == [16.0 * 16 * 16 * n * n for n in SIZES]
    return script, trace


def _line(source_line: str) -> int:
    return SCRIPT.splitlines().index(source_line.splitlines()[0]) + 1


def _label(text: str, source_line: str = CALLS_LINE, shown: str | None = None) -> str:
    """The report's name of the call starting with `text` on `source_line`: `shown` is its text there."""
    return f"calls.py:{_line(source_line)}:col {source_line.index(text) + 1} ({shown or text})"


def test_each_call_on_the_line_is_its_own_storm_with_its_own_dims(strict_trace: tuple[Path, Path]) -> None:
    _, trace_path = strict_trace
    with open_trace(trace_path) as trace:
        report = analyze(trace)
    storms = {storm.call: storm for storm in report.results["recompiles"].data.storms if storm.name == "aten.mm.default"}
    # q @ w: (n, 16) x (16, 16); w @ k: (16, 16) x (16, n); their product: (n, 16) x (16, n).
    # At n = 16 the first two are the same program, so the second call compiles one size fewer.
    # The other lines' calls have shapes of their own (u: 16 x 4, ut: 4 x 16, z: 2 x 16), all sizes each.
    expected = {
        _label("q @ w"): ({(0, 0)}, SIZES),
        _label("w @ k"): ({(1, 1)}, [8, 12, 20, 24, 28]),
        _label("(q @ w) @ (w @ k)"): ({(0, 0), (1, 1)}, [8, 12, 20, 24, 28]),
        _label("torch.mm(q, [u][0])", ACCENTED_LINE): ({(0, 0)}, SIZES),
        _label("torch.mm(q, [u][0]) @ ut", ACCENTED_LINE, "torch.mm(q, [u][0]) @ ut"): ({(0, 0)}, SIZES),
        _label("torch.mm(z, k)", MULTILINE_CALL): ({(1, 1)}, SIZES),
        _label("torch.matmul(", MULTILINE_CALL, "torch.matmul(ut, k)"): ({(1, 1)}, SIZES),
    }
    assert set(storms) == set(expected)
    for call, (positions, values) in expected.items():
        (dim,) = storms[call].varying_dims
        assert set(dim.positions) == positions
        assert list(dim.values) == values
    # One size, made at the `q` and `k` lines, drives every call's storm: one finding, at the line where it first
    # enters a program, lists the calls that recompiled most.
    # Which calls it lists depends on their compile times, which the host's load changes.
    q_line = _line("    q = torch.ones(n, 16, device=\"tpu\")")
    (storm,) = [finding for finding in report.results["recompiles"].findings
                if f"as the shape entering at calls.py:{q_line} changes (6 sizes)" in finding.title]
    assert sum(call in storm.explanation for call in expected) >= 3
    # The sum after the loop's last step compiled too, in no step of the loop.
    assert "compiles happened in 6 of 6 steps" in storm.explanation


def test_columns_count_characters_after_non_ascii_text(strict_trace: tuple[Path, Path]) -> None:
    """`résumé = ("é", ` is 15 characters but 18 UTF-8 bytes: the trace stores characters."""
    script, trace_path = strict_trace
    line = _line(ACCENTED_LINE)
    col = ACCENTED_LINE.index("torch.mm")
    assert len(ACCENTED_LINE[:col].encode()) == col + 3
    with open_trace(trace_path) as trace:
        spans = {(record.col, record.end_col, record.end_line) for record in trace.records("frames") if record.line == line}
        details = {compile_detail(row).plain.split("call site: ")[1].splitlines()[0]
                   for row in queries.compile_rows(trace, 0) if row.source is not None and row.source.line == line}
    inner_end, outer_end = (ACCENTED_LINE.index(text) + len(text) for text in ("torch.mm(q, [u][0])", "@ ut"))
    assert {(col, inner_end, line), (col, outer_end, line)} <= spans
    assert details == {f"{script}:{line} (<module>) · col {col + 1} ({text})"
                       for text in ("torch.mm(q, [u][0])", "torch.mm(q, [u][0]) @ ut")}


def test_a_call_over_several_lines_reads_as_one(strict_trace: tuple[Path, Path]) -> None:
    _, trace_path = strict_trace
    line = _line(MULTILINE_CALL)
    with open_trace(trace_path) as trace:
        (location,) = {record.source.call_key: record.source for record in trace.records("compiles")
                       if record.source is not None and record.source.line == line and record.name == "aten.mm.default"
                       and record.source.end_line != line}.values()
        assert (location.col, location.end_line, location.end_col) == (MULTILINE_CALL.index("torch.matmul("), line + 3, 5)
        assert call_text(location, trace) == "torch.matmul(ut, k)"
        assert call_label(location, trace) == _label("torch.matmul(", MULTILINE_CALL, "torch.matmul(ut, k)")


def test_dump_prints_where_a_multi_line_call_ends(strict_trace: tuple[Path, Path]) -> None:
    _, trace_path = strict_trace
    command = [sys.executable, "-m", "tputrace.cli.main", "dump", str(trace_path), "--kind", "compiles"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    line, col = _line(MULTILINE_CALL), MULTILINE_CALL.index("torch.matmul(")
    assert f"calls.py:{line}:<module>:col {col}-{line + 3}:5" in completed.stdout
    accented_col = ACCENTED_LINE.index("torch.mm(q, [u][0])")
    assert f":{_line(ACCENTED_LINE)}:<module>:col {accented_col}-{accented_col + len('torch.mm(q, [u][0])')}" in completed.stdout


class _AsRecorded:
    """A trace whose run saw each file as it is now, at its recorded path."""

    def source_copy(self, file: str) -> str | None:
        return file


_AS_RECORDED = _AsRecorded()


def test_call_text_joins_chained_calls_and_continued_lines(tmp_path: Path) -> None:
    source = tmp_path / "chained.py"
    chained = '    .bar(a, "#not a comment")  # a comment'
    source.write_text(f"y = (\n    x.foo()\n{chained}\n)\nz = a + \\\n    b\n")
    bar = SourceLocation(str(source), 2, "<module>", col=4, end_col=chained.index("  #"), end_line=3)
    added = SourceLocation(str(source), 5, "<module>", col=4, end_col=5, end_line=6)
    assert (call_text(bar, _AS_RECORDED), call_text(added, _AS_RECORDED)) == ('x.foo().bar(a, "#not a comment")', "a + b")


def test_per_line_views_keep_the_line_together(strict_trace: tuple[Path, Path]) -> None:
    script, trace_path = strict_trace
    line = _line(CALLS_LINE)
    with open_trace(trace_path) as trace:
        compile_locations = [record.source for record in trace.records("compiles") if record.source is not None]
        at_line = [location for location in compile_locations if location.line == line]
        assert len({location.call_key for location in at_line}) == 3
        assert len(set(at_line)) == 1  # one location for per-line grouping
        (file_stat,) = [stat for stat in queries.source_stats(trace, 0) if stat.file == str(script)]
        assert file_stat.lines[line].compiles == len(at_line)
        details = {compile_detail(row).plain.split("call site: ")[1].splitlines()[0]
                   for row in queries.compile_rows(trace, 0) if row.source is not None and row.source.line == line}
    assert details == {f"{script}:{line} (<module>) · col {CALLS_LINE.index(text) + 1} ({text})"
                       for text in ("q @ w", "w @ k", "(q @ w) @ (w @ k)")}


def test_the_tui_compile_sites_have_a_row_per_call_where_a_line_has_several(strict_trace: tuple[Path, Path]) -> None:
    script, trace_path = strict_trace
    with open_trace(trace_path) as trace:
        compiles = Counter(record.source.call_key for record in trace.records("compiles") if record.source is not None)
        calls_per_line = Counter((file, line) for file, line, *_ in compiles)
        single_lines = sorted(line for (_, line), calls in calls_per_line.items() if calls == 1)
        sites = queries.compile_sites(trace, 0)
    assert single_lines and calls_per_line[(str(script), _line(CALLS_LINE))] == 3
    by_line: dict[int, list[queries.CompileSite]] = {}
    for site in sites:
        assert site.source is not None
        by_line.setdefault(site.source.line, []).append(site)
    for line in single_lines:  # as before: one row, the line, no column
        (site,) = by_line[line]
        assert site.call is None and site.count == sum(count for key, count in compiles.items() if key[1] == line)
    calls = {site.call: site.count for site in by_line[_line(CALLS_LINE)]}
    assert calls == {f"col {CALLS_LINE.index(text) + 1} ({text})": count for text, count in
                     (("q @ w", 6), ("w @ k", 5), ("(q @ w) @ (w @ k)", 5))}
    assert {site.call for site in by_line[_line(ACCENTED_LINE)]} == {
        f"col {ACCENTED_LINE.index('torch.mm') + 1} ({text})" for text in ("torch.mm(q, [u][0])", "torch.mm(q, [u][0]) @ ut")}
    line_runs = [line for line, _ in itertools.groupby(site.source.line for site in sites if site.source is not None)]
    assert len(line_runs) == len(by_line)  # a line's calls are next to each other

    async def scenario(pilot: Any) -> None:
        await pilot.press("4")
        await settle(pilot)
        table = pilot.app.screen.query_one("#compiles-sites")
        shown = [str(getattr(table.get_row_at(index)[0], "plain", "")) for index in range(table.row_count)]
        multiline = _line(MULTILINE_CALL)
        assert f"{script}:{multiline} (<module>) · col {MULTILINE_CALL.index('torch.matmul(') + 1} (torch.matmul(ut, k))" in shown
        assert f"{script}:{single_lines[0]} (<module>)" in shown
        assert len(shown) == len(sites)
        table.focus()
        table.move_cursor(row=shown.index(next(text for text in shown if f":{multiline} (" in text)))
        await pilot.press("enter")
        await settle(pilot)
        assert pilot.app.query_one("#views").active == "source" and pilot.app.view("source").current_line() == multiline

    async def drive() -> None:
        from tputrace.tui.app import TraceApp

        with open_trace(trace_path) as trace:
            app = TraceApp(Session.open(trace))
            async with app.run_test(size=(160, 48)) as pilot:
                await settle(pilot)
                await scenario(pilot)

    asyncio.run(drive())


def test_the_tui_compile_detail_names_the_call_as_the_sites_do(strict_trace: tuple[Path, Path]) -> None:
    """The detail pane of a highlighted compile names its call with its text, shown literally (`[u]` stays)."""
    script, trace_path = strict_trace
    line, col = _line(ACCENTED_LINE), ACCENTED_LINE.index("torch.mm")
    shown: dict[str, str] = {}

    async def drive() -> None:
        from tputrace.tui.app import TraceApp

        with open_trace(trace_path) as trace:
            app = TraceApp(Session.open(trace))
            async with app.run_test(size=(160, 48)) as pilot:
                await settle(pilot)
                await pilot.press("4")
                await settle(pilot)
                view = pilot.app.view("compiles")
                table = pilot.app.screen.query_one("#compiles-table")
                table.focus()
                for index, row in enumerate(view.compiles):
                    if row.source is not None and row.source.line == line:
                        table.move_cursor(row=index)
                        await settle(pilot)
                        detail = pilot.app.screen.query_one("#compiles-detail").render()
                        call_site = detail.plain.split("call site: ")[1].splitlines()[0]
                        shown[call_site] = ",".join(str(span.style) for span in detail.spans)

    asyncio.run(drive())
    assert set(shown) == {f"{script}:{line} (<module>) · col {col + 1} ({text})"
                          for text in ("torch.mm(q, [u][0])", "torch.mm(q, [u][0]) @ ut")}
    assert not any("underline" in styles for styles in shown.values())


def test_a_file_without_frame_columns_reads_them_as_none(tmp_path: Path) -> None:
    path = tmp_path / "older.tptrace"
    writer = TraceWriter(path)
    writer.set_run(world_size=1, script="train.py", argv=[])
    frame_id = writer.frame("/proj/train.py", 7, "main", 4, 9)
    writer.close()
    with sqlite3.connect(path) as connection:
        _drop_sql_views(connection)
        connection.execute("ALTER TABLE frames DROP COLUMN end_col")
        connection.execute("ALTER TABLE frames DROP COLUMN col")
    with open_trace(path) as trace:
        location = trace.frame(frame_id)
        (record,) = trace.records("frames")
    assert location == SourceLocation("/proj/train.py", 7, "main")
    assert (location.col, location.end_col, record.col, record.end_col) == (None, None, None, None)


def test_a_file_with_byte_columns_reads_them_as_characters(tmp_path: Path) -> None:
    """A trace written before `end_line` stored UTF-8 byte offsets, and no end for a call going on past its line."""
    source = tmp_path / "older.py"
    source.write_text(ACCENTED_LINE.strip() + "\n" + MULTILINE_CALL.strip() + "\n", encoding="utf-8")
    accented, opening = ACCENTED_LINE.strip(), MULTILINE_CALL.strip().splitlines()[0]
    byte_col = len(accented[:accented.index("torch.mm")].encode())
    path = tmp_path / "older.tptrace"
    writer = TraceWriter(path)
    writer.set_run(world_size=1, script=str(source), argv=[])
    accented_id = writer.frame(str(source), 1, "<module>", byte_col, byte_col + len("torch.mm(q, [u][0])"))
    opening_id = writer.frame(str(source), 2, "<module>", opening.index("torch.matmul("), None)
    missing_id = writer.frame(str(tmp_path / "gone.py"), 1, "<module>", byte_col, byte_col + 3)
    digest = digest_file(source)
    writer.append("source_files", (0, writer.intern(str(source)), digest.sha256, digest.size))
    writer.close()
    with sqlite3.connect(path) as connection:
        _drop_sql_views(connection)
        connection.execute("ALTER TABLE frames DROP COLUMN end_line")
    with open_trace(path) as trace:
        accented_call, opening_call, missing = (trace.frame(frame_id) for frame_id in (accented_id, opening_id, missing_id))
        stored = {record.id: (record.col, record.end_col, record.end_line) for record in trace.records("frames")}
        assert call_label(accented_call, trace) == f"older.py:1:col {accented.index('torch.mm') + 1} (torch.mm(q, [u][0]))"
        assert call_text(opening_call, trace) == "torch.matmul(…"
    col = accented.index("torch.mm")
    assert (accented_call.col, accented_call.end_col, accented_call.end_line) == (col, col + len("torch.mm(q, [u][0])"), 1)
    assert (opening_call.end_col, opening_call.end_line) == (None, None)
    assert (missing.col, missing.end_col) == (byte_col, byte_col + 3)  # no line to convert on: as stored
    assert stored[accented_id] == (byte_col, byte_col + len("torch.mm(q, [u][0])"), None)
    merge_traces([path], tmp_path / "merged.tptrace")  # a merged file is new: it stores characters
    with open_trace(tmp_path / "merged.tptrace") as merged:
        spans = {(record.line, record.col, record.end_col, record.end_line) for record in merged.records("frames")}
    assert (1, col, col + len("torch.mm(q, [u][0])"), 1) in spans and (2, opening.index("torch.matmul("), None, None) in spans


def _drop_sql_views(connection: sqlite3.Connection) -> None:
    """An older trace has no SQL views, and a view reading a column would block dropping it."""
    for (view,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'view'").fetchall():
        connection.execute(f"DROP VIEW {view}")


def _byte_column_trace(strict_trace: tuple[Path, Path], folder: Path) -> tuple[Path, Path]:
    """(script, trace): copies of the strict run's, the trace's frames pointing at the copied script and
    rewritten to the form written between `col` and `end_line` (UTF-8 byte offsets, no end past the line)."""
    script, trace_path = strict_trace
    folder.mkdir()
    script_copy, trace_copy = folder / script.name, folder / trace_path.name
    shutil.copy(script, script_copy)
    shutil.copy(trace_path, trace_copy)
    lines = SCRIPT.splitlines()
    with sqlite3.connect(trace_copy) as connection:
        connection.execute("UPDATE strings SET text = ? WHERE text = ?", (str(script_copy), str(script)))
        frames = connection.execute("SELECT id, line, col, end_col, end_line FROM frames WHERE col IS NOT NULL").fetchall()
        for frame_id, line, col, end_col, end_line in frames:
            byte_end = len(lines[line - 1][:end_col].encode()) if end_line == line else None
            connection.execute("UPDATE frames SET col = ?, end_col = ? WHERE id = ?",
                               (len(lines[line - 1][:col].encode()), byte_end, frame_id))
        _drop_sql_views(connection)
        connection.execute("ALTER TABLE frames DROP COLUMN end_line")
    connection.close()
    return script_copy, trace_copy


def test_a_call_is_quoted_only_from_the_file_the_run_saw(tmp_path: Path) -> None:
    """A trace from elsewhere names a local file (a key, a config): its calls there are named by column, never
    quoted, whether the trace has no digest of the file or the file here is not the one its run saw."""
    secret = tmp_path / "id_key"
    secret.write_text("SECRET-KEY-MATERIAL-0123456789\n")
    path = tmp_path / "foreign.tptrace"
    writer = TraceWriter(path)
    writer.set_run(world_size=1, script=str(secret), argv=[])
    undigested_id = writer.frame(str(secret), 1, "<module>", 0, 20, 1)
    other = tmp_path / "other.py"
    other.write_text("y = x @ w\n")
    digested_id = writer.frame(str(other), 1, "<module>", 4, 9, 1)
    stale = digest_file(other)
    writer.append("source_files", (0, writer.intern(str(other)), stale.sha256, stale.size))
    writer.close()
    other.write_text("SECRET = 'hunter2-hunter2'\n")  # the file at that path is no longer the run's
    with open_trace(path) as trace:
        labels = [call_label(trace.frame(frame_id), trace) for frame_id in (undigested_id, digested_id)]
    assert labels == ["id_key:1:col 1", "other.py:1:col 5"]


def _accented_calls(trace_path: Path, source_roots: tuple[str, ...] = ()) -> list[SourceLocation]:
    """The compiles' distinct calls on the accented line (one location when the columns are unknown)."""
    with tputrace.open(trace_path, source_roots=source_roots) as trace:  # the public reader takes the roots too
        return list({record.source.call_key: record.source for record in trace.records("compiles")
                     if record.source is not None and record.source.line == _line(ACCENTED_LINE)}.values())


def _compile_detail_shown(trace_path: Path, session_roots: tuple[str, ...] | None) -> str:
    """The TUI's compile detail on opening the Compiles view (the first compile's); the session searches
    `session_roots`, or as `tputrace tui` does (the run's directory, ...) when None."""
    shown: list[str] = []

    async def drive() -> None:
        from tputrace.tui.app import TraceApp

        with open_trace(trace_path) as trace:
            session = Session.open(trace) if session_roots is None else Session(trace, 0, session_roots)
            app = TraceApp(session)
            async with app.run_test(size=(160, 48)) as pilot:
                await settle(pilot)
                await pilot.press("4")
                await settle(pilot)
                shown.append(pilot.app.screen.query_one("#compiles-detail").render().plain)
            session.close()

    asyncio.run(drive())
    return shown[0].split("call site: ")[1].splitlines()[0]


def test_byte_columns_convert_on_the_file_the_run_saw(strict_trace: tuple[Path, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    script, trace_path = _byte_column_trace(strict_trace, tmp_path / "older")
    col = ACCENTED_LINE.index("torch.mm")
    with open_trace(trace_path) as trace:
        assert trace.source_files()[str(script)].sha256  # the trace has the file's digest, and the file matches it
        assert trace.unchecked_column_files() == []
    calls = _accented_calls(trace_path)
    with open_trace(trace_path) as trace:
        assert {call_name(call, trace) for call in calls} == {f"col {col + 1} ({text})" for text in ("torch.mm(q, [u][0])", "torch.mm(q, [u][0]) @ ut")}
    assert not any(call.columns_unchecked for call in calls)
    assert main(["dump", str(trace_path), "--kind", "compiles"]) == 0
    printed = capsys.readouterr()
    assert "unchecked" not in printed.out + printed.err and f":{_line(ACCENTED_LINE)}:<module>:col {col}-" in printed.out


def test_byte_columns_of_a_changed_file_are_not_converted_with_its_text(strict_trace: tuple[Path, Path], tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Edited since the run, the file's lines no longer hold the calls: its columns read as unknown (the
    call is its whole line) and say so, unless a copy with the run's content is found under a source root."""
    script, trace_path = _byte_column_trace(strict_trace, tmp_path / "older")
    run_copy = tmp_path / "checkout" / script.name
    run_copy.parent.mkdir()
    shutil.copy(script, run_copy)
    script.write_text("# edited after the run\n" + SCRIPT, encoding="utf-8")
    calls = _accented_calls(trace_path)
    assert calls and all((call.col, call.end_col, call.end_line, call.columns_unchecked) == (None, None, None, True)
                         for call in calls)
    assert {call_name(call, _AS_RECORDED) for call in calls} == {"whole line"}
    with open_trace(trace_path) as trace:
        assert trace.unchecked_column_files() == [str(script)]
        sites = queries.compile_sites(trace, 0)
    assert all(site.call is None for site in sites)  # a line's calls are one row: no column to tell them apart
    assert _compile_detail_shown(trace_path, ()).endswith(f"(<module>) · {UNCHECKED_COLUMNS}")
    assert main(["dump", str(trace_path), "--kind", "compiles"]) == 0
    printed = capsys.readouterr()
    assert f":{_line(ACCENTED_LINE)}:<module>:col unchecked" in printed.out
    assert ":col " not in printed.out.replace(":col unchecked", "")  # no call's columns shown, right or wrong
    assert f"call columns in {script} not checked" in printed.err

    col = ACCENTED_LINE.index("torch.mm")
    root = str(run_copy.parent)
    assert {(call.col, call.columns_unchecked) for call in _accented_calls(trace_path, (root,))} == {(col, False)}
    assert main(["dump", str(trace_path), "--kind", "compiles", "--source-root", root]) == 0
    printed = capsys.readouterr()
    assert "unchecked" not in printed.out + printed.err and f":{_line(ACCENTED_LINE)}:<module>:col {col}-" in printed.out
    assert "not checked" not in _compile_detail_shown(trace_path, (root,))
    assert "not checked" not in _compile_detail_shown(trace_path, None)  # the run's directory has the original
    # `merge` writes character columns: it finds the run's copy under its roots too, and without one drops the columns.
    for roots, expected in (((), {(None, False)}), ((root,), {(col, False)})):
        merged = tmp_path / f"merged{len(roots)}.tptrace"
        assert main(["merge", str(trace_path), "-o", str(merged), *(option for where in roots for option in ("--source-root", where))]) == 0
        assert {(call.col, call.columns_unchecked) for call in _accented_calls(merged)} == expected


def test_byte_columns_without_a_recorded_digest_convert_as_before(strict_trace: tuple[Path, Path], tmp_path: Path) -> None:
    script, trace_path = _byte_column_trace(strict_trace, tmp_path / "older")
    with sqlite3.connect(trace_path) as connection:
        connection.execute("DELETE FROM source_files")
    connection.close()
    edited = ACCENTED_LINE.replace('"é"', '"e"')
    script.write_text(SCRIPT.replace(ACCENTED_LINE, edited), encoding="utf-8")
    byte_col = len(ACCENTED_LINE[:ACCENTED_LINE.index("torch.mm")].encode())
    with open_trace(trace_path) as trace:
        assert trace.unchecked_column_files() == []
    # converted on the file as it is now: one "é" fewer before the call, so one character off
    assert {(call.col, call.columns_unchecked) for call in _accented_calls(trace_path)} == {(byte_col - 2, False)}


def test_the_html_report_names_each_call(strict_trace: tuple[Path, Path]) -> None:
    _, trace_path = strict_trace
    with open_trace(trace_path) as trace:
        data = compile_data.prepare_recompilations(trace)
    sites = {item.site for item in data.varying if item.name == "aten.mm.default"}
    assert sites == {
        *(_label(text) for text in ("q @ w", "w @ k", "(q @ w) @ (w @ k)")),
        *(_label("torch.mm(q, [u][0])", ACCENTED_LINE, text) for text in ("torch.mm(q, [u][0])", "torch.mm(q, [u][0]) @ ut")),
        _label("torch.mm(z, k)", MULTILINE_CALL), _label("torch.matmul(", MULTILINE_CALL, "torch.matmul(ut, k)"),
    }
