"""Views tell the truth on kinds of trace the other view tests do not make: an XProf capture of collectives whose
message sizes and waits it does not have, a TORCH_TRACE log whose costs were measured on the capture's host, a
run of two steps, and a trace whose damaged schema makes SQLite's own error message bytes that are not text."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import tputrace
from fixtures.make_tui_fixture import make_session, settle
from importers.captures import jax_collectives_capture
from test_tui import screen_text, table_rows
from test_views_on_varied_runs import imported_jax_trace
from tputrace.derived.imported_sources import imported_device, measured_on
from tputrace.derived.steps import loop_step_durations
from tputrace.summary import render_text, summarize
from tputrace.wording import format_ns

__all__ = ["imported_jax_trace"]  # a fixture shared with the varied-runs tests

REPO_ROOT = Path(__file__).resolve().parents[2]

# A function whose guard on a global fails for each new value: Dynamo traces it again each time.
TORCH_GLOBAL_GUARD = textwrap.dedent("""\
    import torch

    SCALE = 1
    def h(x):
        return x * SCALE

    hc = torch.compile(h, backend="eager")
    for SCALE in (1, 2, 3, 4):
        hc(torch.ones(3))
""")

# A CPU-only torch.profiler window with memory profiling: its memory samples are the host's (chip -1).
TORCH_PROFILED_MEMORY = textwrap.dedent("""\
    import sys, torch
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
        for _ in range(2):
            model(torch.randn(8, 16)).sum().backward()
    prof.export_chrome_trace(sys.argv[1])
""")

TWO_STEPS = textwrap.dedent("""\
    import torch
    from torch import nn

    model = nn.Linear(16, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        loss = model(torch.randn(8, 16, device="tpu")).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    print(loss.item())
""")

VIEW_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("info",), ("summary",), ("report",), ("report", "--json"), ("dump",), ("tui",), ("sql-views",),
    ("plot", "-o", "{out}/report.html"), ("export", "--perfetto", "{out}/trace.json", "--tensorboard", "{out}/logdir"),
)


def _tputrace(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tputrace.cli.main", *args], capture_output=True, text=True,
                          timeout=900, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL)


def _python(script: Path, *args: str, env: dict[str, str] | None = None) -> None:
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def _import(capture: Path, trace_path: Path) -> Path:
    result = _tputrace("import", str(capture), "-o", str(trace_path))
    assert result.returncode == 0, result.stderr[-3000:]
    return trace_path


@pytest.fixture(scope="module")
def collectives_import(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An XProf capture of a psum and an all_gather on 4 virtual CPU devices, imported."""
    pytest.importorskip("jax", reason="making a capture needs jax (pip install -e .[backend])")
    folder = tmp_path_factory.mktemp("collectives_capture")
    return _import(jax_collectives_capture(folder), folder / "collectives.tptrace")


@pytest.fixture(scope="module")
def torch_trace_import(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TORCH_TRACE log of a function recompiled for each value of a global, imported."""
    pytest.importorskip("torch", reason="making a capture needs torch (pip install -e .[backend])")
    folder = tmp_path_factory.mktemp("torch_trace_capture")
    script = folder / "global_guard.py"
    script.write_text(TORCH_GLOBAL_GUARD)
    _python(script, env={**os.environ, "TORCH_TRACE": str(folder / "torch_trace")})
    return _import(folder / "torch_trace", folder / "global_guard.tptrace")


@pytest.fixture(scope="module")
def profiled_memory_import(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torch.profiler Chrome JSON of a CPU-only window with `profile_memory=True`, imported."""
    pytest.importorskip("torch", reason="making a capture needs torch (pip install -e .[backend])")
    folder = tmp_path_factory.mktemp("profiled_memory")
    script = folder / "profiled_memory.py"
    script.write_text(TORCH_PROFILED_MEMORY)
    _python(script, str(folder / "profile.json"))
    return _import(folder / "profile.json", folder / "profiled_memory.tptrace")


@pytest.fixture(scope="module")
def two_step_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")
    pytest.importorskip("jax", reason="recording a run needs jax (pip install -e .[backend])")
    folder = tmp_path_factory.mktemp("two_steps")
    script = folder / "two_steps.py"
    script.write_text(TWO_STEPS)
    trace_path = folder / "two_steps.tptrace"
    result = _tputrace("run", "--quiet", "-o", str(trace_path), str(script))
    assert result.returncode == 0, result.stderr[-3000:]
    return trace_path


def _html_text(trace_path: Path) -> str:
    """The HTML report's visible text (no scripts or styles), unescaped, with runs of white space made one."""
    from tputrace.viewers.report.data import prepare_report
    from tputrace.viewers.report.report_html import render_report

    with tputrace.open(trace_path) as trace:
        page = render_report(prepare_report(trace), plotlyjs="cdn")
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


# -- imported captures: where their times were measured -------------------------------------------


@pytest.mark.parametrize("kind", ["imported_jax_trace", "torch_trace_import"])
def test_an_imported_captures_html_report_says_its_times_were_measured_on_its_device(
        kind: str, request: pytest.FixtureRequest) -> None:
    """The header's median step and every finding's measured cost name the capture's device, as the text report
    does; none claims this host measured them."""
    from tputrace.analysis.report import analyze

    trace_path: Path = request.getfixturevalue(kind)
    with tputrace.open(trace_path) as trace:
        device = imported_device(trace, trace.run.rank)
        summary = summarize(trace)
        report = analyze(trace)
    assert device is not None
    where = f"measured on {measured_on(device)}"
    text = _html_text(trace_path)
    assert "measured on this host" not in text
    if summary.median_step_ns is not None:
        assert f"median {format_ns(summary.median_step_ns)} {where}" in text
    measured = [finding for finding in report.findings if finding.cost_total_ns and finding.cost_basis == "measured on this host"]
    if kind == "torch_trace_import":
        assert measured, [finding.title for finding in report.findings]
    for finding in measured:
        assert f"≈ {format_ns(finding.cost_total_ns)} ({where})" in text, finding.title


# -- collectives whose sizes and waits the capture does not have ----------------------------------


def _collectives_view(trace_path: Path) -> tuple[str, list[list[str]], list[list[str]]]:
    """The TUI Collectives view's status line, per-kind rows and per-rank rows."""
    from tputrace.tui.app import TraceApp

    shown: dict[str, Any] = {}

    async def drive() -> None:
        app = TraceApp(make_session(trace_path))
        async with app.run_test(size=(160, 45)) as pilot:
            await settle(pilot)
            await pilot.press("6")
            await settle(pilot)
            shown["screen"] = screen_text(app)
            shown["kinds"] = table_rows(app, "#collectives-kinds")
            shown["ranks"] = table_rows(app, "#collectives-ranks")

    asyncio.run(drive())
    return shown["screen"], shown["kinds"], shown["ranks"]


def test_collectives_of_a_capture_show_its_hlo_sizes_and_its_chips_waits_as_measured(
        collectives_import: Path) -> None:
    """XProf on XLA:CPU has no message sizes in its events: the program's HLO gives them, and the Collectives view
    shows them as the summary does. The capture's 4 chips each ran every call and waited in it for the others: both
    show that wait."""
    with tputrace.open(collectives_import) as trace:
        ((count, sized, waited),) = trace.sql("SELECT COUNT(*), COUNT(bytes), COUNT(wait_ns) FROM collectives WHERE rank = 0")
        kinds = {kind for (kind,) in trace.sql("SELECT DISTINCT kind FROM collectives WHERE rank = 0")}
        summary_text = render_text(summarize(trace))
    assert kinds and sized == waited == count
    summary_rows = {line.split()[0]: line.split() for line in summary_text.split("\ncollectives (", 1)[1].splitlines()[1:]
                    if line.strip() and line.split()[0] in kinds}
    assert set(summary_rows) == kinds and all("unknown" not in (row[2], row[-1]) for row in summary_rows.values())
    screen, kind_rows, rank_rows = _collectives_view(collectives_import)
    assert {row[0] for row in kind_rows} == kinds
    for row in kind_rows:
        size, waiting, wait_share = row[1].strip(), row[6].strip(), row[7].strip()
        assert "unknown" not in (size, waiting, wait_share), row
    assert all("unknown" not in (row[3].strip(), row[4].strip()) for row in rank_rows), rank_rows
    assert "unknown (not measured" not in screen and "0 ns waiting" not in screen


# -- the Perfetto export of imported captures ------------------------------------------------------


def _perfetto(trace_path: Path, tmp_path: Path) -> dict[str, Any]:
    result = _tputrace("export", str(trace_path), "--perfetto", str(tmp_path / "trace.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    document: dict[str, Any] = json.loads((tmp_path / "trace.json").read_text())
    return document


def test_perfetto_names_an_imported_captures_chips_by_the_device_it_measured(collectives_import: Path,
                                                                            tmp_path: Path) -> None:
    """An XLA:CPU capture's devices are its processes `rank 0 · cpu:N`, as the summary says `cpu, 4 chips`, not
    TPU chips the capture never ran on."""
    with tputrace.open(collectives_import) as trace:
        chips, device = trace.run.chips, imported_device(trace, 0)
        summary_text = render_text(summarize(trace))
    assert device == "cpu" and chips and f"cpu, {chips} chips" in summary_text
    document = _perfetto(collectives_import, tmp_path)
    processes = {event["args"]["name"] for event in document["traceEvents"] if event.get("name") == "process_name"}
    chip_processes = {name for name in processes if "host" not in name}
    assert chip_processes == {f"rank 0 · cpu:{chip}" for chip in range(chips)}


def test_perfetto_puts_an_imports_host_memory_on_its_host_not_on_a_chip(profiled_memory_import: Path,
                                                                        tmp_path: Path) -> None:
    """torch.profiler's memory samples are the host's (chip -1 in the trace): the export draws them as the host's
    memory counter, not as a chip `tpu:-1`'s HBM; with no program runs, no op time is said to be an estimate."""
    with tputrace.open(profiled_memory_import) as trace:
        samples = trace.sql("SELECT chip, COUNT(*) FROM memory WHERE rank = 0 GROUP BY chip")
        program_runs = trace.count("executions")
    assert samples and all(chip == -1 for chip, _ in samples) and not program_runs
    document = _perfetto(profiled_memory_import, tmp_path)
    processes = {event["pid"]: event["args"]["name"] for event in document["traceEvents"] if event.get("name") == "process_name"}
    counters = [event for event in document["traceEvents"] if event.get("ph") == "C"]
    assert len(counters) == sum(count for _, count in samples)
    assert {(processes[event["pid"]], event["name"]) for event in counters} == {(processes[1], "host memory bytes")}
    assert processes[1].startswith("rank 0 · host") and not any("tpu" in name for name in processes.values())
    assert document["otherData"]["op_times"] == "measured"


def test_an_imports_host_memory_samples_are_the_hosts_in_the_html_report_and_the_tui_says_where_they_are(
        profiled_memory_import: Path) -> None:
    """The HTML report draws torch.profiler's host memory samples as the host's, not as a chip `tpu:-1`, and does
    not weigh them against a TPU's HBM; the TUI Memory view names the host as the place of the allocations' peak
    (the Overview draws none)."""
    from tputrace.tui.app import TraceApp

    with tputrace.open(profiled_memory_import) as trace:
        samples = trace.sql("SELECT COUNT(*) FROM memory WHERE rank = 0 AND chip = -1")[0][0]
    assert samples
    from tputrace.viewers.report.data import prepare_report
    from tputrace.viewers.report.report_html import render_report

    with tputrace.open(profiled_memory_import) as trace:
        page = render_report(prepare_report(trace), plotlyjs="cdn")
    assert '"name":"host live"' in page and "tpu:-1" not in page
    text = _html_text(profiled_memory_import)
    assert "of the HBM of" not in text and "an imported capture's host memory, not a chip's HBM" in text
    shown: dict[str, str] = {}

    async def drive() -> None:
        app = TraceApp(make_session(profiled_memory_import))
        async with app.run_test(size=(160, 45)) as pilot:
            await settle(pilot)
            await pilot.press("M")
            await settle(pilot)
            shown["memory"] = screen_text(app)

    asyncio.run(drive())
    assert "host peaked at" in shown["memory"] and "tpu:-1" not in shown["memory"]
    assert "Overview" not in shown["memory"].split("MMemory", 1)[-1]


def test_the_overview_of_a_capture_without_chips_does_not_say_chips_ran(profiled_memory_import: Path) -> None:
    """A CPU-only torch.profiler window has no chips: the Overview's time split says its shares overlap, not that
    chips ran while the host worked."""
    from tputrace.tui.app import TraceApp

    with tputrace.open(profiled_memory_import) as trace:
        assert trace.run.chips == 0
    shown: dict[str, str] = {}

    async def drive() -> None:
        app = TraceApp(make_session(profiled_memory_import))
        async with app.run_test(size=(160, 45)) as pilot:
            await settle(pilot)
            shown["overview"] = screen_text(app)

    asyncio.run(drive())
    wall_row = next(line for line in shown["overview"].splitlines() if line.startswith("wall time"))
    assert wall_row.rstrip().endswith("shares overlap") and "chips" not in wall_row


# -- a run of two steps ---------------------------------------------------------------------------


def test_a_two_step_runs_median_is_said_to_be_of_both_steps_in_every_view(two_step_trace: Path) -> None:
    """With two steps, the median step is of both (the first is not left out of so few): the summary says so,
    and the report, the TUI overview and the HTML report give the same figure."""
    from tputrace.analysis.render import render_text as render_report_text
    from tputrace.analysis.report import analyze

    with tputrace.open(two_step_trace) as trace:
        durations = loop_step_durations(trace, 0)
        summary_text = render_text(summarize(trace))
        report_text = render_report_text(analyze(trace))
    assert len(durations) == 2
    median = format_ns(sum(durations) // 2)
    wall_line = next(line for line in summary_text.splitlines() if line.startswith("wall"))
    assert f"2 steps (first {format_ns(durations[0])}; median of both {median})" in wall_line
    assert "then median" not in wall_line
    assert f"median step {median}" in report_text
    from tputrace.tui.app import TraceApp

    shown: dict[str, str] = {}

    async def drive() -> None:
        app = TraceApp(make_session(two_step_trace))
        async with app.run_test(size=(160, 45)) as pilot:
            await settle(pilot)
            shown["overview"] = screen_text(app)

    asyncio.run(drive())
    assert f"2 steps · median {median}" in shown["overview"]
    assert f"steps 2 · median {median} measured on this host" in _html_text(two_step_trace)


# -- a damaged schema ------------------------------------------------------------------------------


def _damage_a_schema_name(source: Path, damaged: Path) -> str:
    """Copy `source` to `damaged` with the first byte of a view's name in the schema table made 0xff (not UTF-8),
    so that SQLite fails every statement with "malformed database schema (<those bytes>)"; the view's name."""
    with sqlite3.connect(source) as connection:
        names = [name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'view' ORDER BY name")]
    original = source.read_bytes()
    for name in names:  # the first place a name is stored is its schema row's `name` (then `tbl_name`, its SQL)
        data = bytearray(original)
        data[data.index(name.encode())] = 0xFF
        damaged.write_bytes(bytes(data))
        try:
            with sqlite3.connect(f"file:{damaged}?mode=ro", uri=True) as connection:
                connection.execute("SELECT COUNT(*) FROM ops").fetchall()
        except UnicodeDecodeError:
            return name
        except sqlite3.Error:
            pass
    raise AssertionError(f"no view's name in {source} reads back as SQLite's error")


def test_a_trace_with_a_damaged_schema_is_one_line_and_exit_2_in_every_view_command(two_step_trace: Path,
                                                                                   tmp_path: Path) -> None:
    """SQLite's error for such a file quotes the name's bytes, which Python cannot decode: every command that reads
    a trace says in one line that the file is corrupt, and exits 2, instead of showing a traceback."""
    damaged = tmp_path / "damaged.tptrace"
    _damage_a_schema_name(two_step_trace, damaged)
    for command in VIEW_COMMANDS:
        args = [part.format(out=tmp_path) for part in command[1:]]
        result = _tputrace(command[0], str(damaged), *args)
        assert result.returncode == 2, (command, result.stderr[-2000:])
        assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, (command, result.stderr)
        assert result.stderr.startswith(f"tputrace: error: {damaged} is corrupt"), (command, result.stderr)


# -- opening on any view ---------------------------------------------------------------------------


def test_tui_opens_on_every_view_its_view_option_names(two_step_trace: Path) -> None:
    """`tputrace tui --view NAME` takes every view the app has (Compare needs --compare, checked in `open_ui`),
    and the app opened on it shows that view."""
    from textual.widgets import TabbedContent

    from tputrace.cli.main import build_parser
    from tputrace.tui.actions import VIEW_ORDER
    from tputrace.tui.app import TraceApp

    views = [view_id for view_id, _ in VIEW_ORDER if view_id != "compare"]
    shown: dict[str, str] = {}

    async def drive(view: str) -> None:
        app = TraceApp(make_session(two_step_trace), initial_view=view)
        async with app.run_test(size=(160, 45)) as pilot:
            await settle(pilot)
            shown[view] = app.query_one("#views", TabbedContent).active

    for view in views:
        args = build_parser().parse_args(["tui", str(two_step_trace), "--view", view])
        asyncio.run(drive(args.view))
    assert shown == {view: view for view in views}
