"""Every view tells the same, right figures on kinds of run the other view tests do not record: a strict-mode
(DEFER_NEVER) loop, a `torch.compile`d model with a graph break whose loop reads its loss each step, and an XProf
capture of a jitted JAX step made here with `jax.profiler` and imported. The truth each figure is checked against
is read from the trace's tables."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import tputrace
from fixtures.make_tui_fixture import make_session, settle
from test_tui import screen_text, table_rows
from tputrace.analysis.render import render_json
from tputrace.analysis.report import analyze
from tputrace.analysis.target import DEFAULT_TARGET, target_chip
from tputrace.derived.run_facts import run_facts
from tputrace.summary import render_text, summarize
from tputrace.wording import format_ns

REPO_ROOT = Path(__file__).resolve().parents[2]

STRICT_LOOP = textwrap.dedent("""\
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(6):
        x = torch.randn(32, 64, device="tpu")
        y = torch.randint(0, 10, (32,), device="tpu")
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 2 == 0:
            print(step, loss.item())
""")

COMPILED_WITH_BREAK = textwrap.dedent("""\
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(32, 64)
            self.b = nn.Linear(64, 8)

        def forward(self, x):
            h = torch.relu(self.a(x))
            print("hidden", tuple(h.shape))  # a graph break
            return self.b(h)

    model = Net().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model)
    for step in range(5):
        loss = compiled(torch.randn(16, 32, device="tpu")).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(step, loss.item())
""")

FALLBACK_LOOP = textwrap.dedent("""\
    import torch
    from torch import nn

    model = nn.Linear(32, 32).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        out = model(torch.randn(16, 32, device="tpu"))
        counts = torch.histogram(out.detach().flatten().float(), bins=10, range=(-3, 3)).hist
        loss = out.pow(2).mean() + counts.sum() * 0
        loss.backward()
        opt.step()
        opt.zero_grad()
    print(loss.item())
""")

RAISES_MIDWAY = textwrap.dedent("""\
    import torch
    from torch import nn

    model = nn.Sequential()
    model.add_module("[bold]<script>alert(1)</script>", nn.Linear(16, 16))
    model = model.to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(8):
        loss = model(torch.randn(8, 16, device="tpu")).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(step, loss.item())
        if step == 2:
            error = RuntimeError("[red]<b>diverged</b> at step 2")
            error.add_note("a note printed after the exception's line")
            raise error
""")

JAX_STEPS = textwrap.dedent("""\
    import sys

    import jax
    import jax.numpy as jnp

    @jax.jit
    def step(w, x):
        y = jnp.tanh(x @ w)
        return w - 0.01 * (x.T @ y), y.sum()

    w, x = jnp.ones((256, 256)), jnp.ones((128, 256))
    step(w, x)[0].block_until_ready()
    jax.profiler.start_trace(sys.argv[1])
    for i in range(4):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            w, total = step(w, x)
            total.block_until_ready()
    jax.profiler.stop_trace()
""")


def _tputrace(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "tputrace.cli.main", *args], capture_output=True, text=True,
                            timeout=900, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]


def _record(folder: Path, name: str, source: str, *options: str) -> Path:
    pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")
    pytest.importorskip("jax", reason="recording a run needs jax (pip install -e .[backend])")
    script = folder / f"{name}.py"
    script.write_text(source)
    trace_path = folder / f"{name}.tptrace"
    _tputrace("run", "--quiet", *options, "-o", str(trace_path), str(script))
    return trace_path


@pytest.fixture(scope="module")
def strict_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("strict"), "strict_loop", STRICT_LOOP, "--mode", "strict")


@pytest.fixture(scope="module")
def compiled_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("compiled"), "compiled_break", COMPILED_WITH_BREAK)


@pytest.fixture(scope="module")
def fallback_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("fallback"), "fallback_loop", FALLBACK_LOOP)


@pytest.fixture(scope="module")
def raising_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("raises") / "run[bold]<i>s"
    folder.mkdir()
    script = folder / "train[red]<script>.py"
    script.write_text(RAISES_MIDWAY)
    trace_path = folder.parent / "raises.tptrace"
    result = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "run", "--quiet", "-o", str(trace_path), str(script)],
                            capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    assert result.returncode == 1 and trace_path.exists(), result.stderr[-3000:]
    return trace_path


@pytest.fixture(scope="module")
def four_rank_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/ddp_train.py on four ranks (`tputrace run --nproc 4`), merged into one trace."""
    pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")
    pytest.importorskip("jax", reason="recording a run needs jax (pip install -e .[backend])")
    trace_path = tmp_path_factory.mktemp("four_ranks") / "ddp4.tptrace"
    _tputrace("run", "--quiet", "--nproc", "4", "-o", str(trace_path), str(REPO_ROOT / "examples" / "ddp_train.py"), "--steps", "3")
    return trace_path


@pytest.fixture(scope="module")
def imported_jax_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("jax", reason="making a capture needs jax (pip install -e .[backend])")
    folder = tmp_path_factory.mktemp("jax_capture")
    script = folder / "jax_steps.py"
    script.write_text(JAX_STEPS)
    result = subprocess.run([sys.executable, str(script), str(folder / "logdir")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    trace_path = folder / "jax.tptrace"
    _tputrace("import", str(folder / "logdir"), "-o", str(trace_path))
    return trace_path


def _perfetto(trace: Any, path: Path) -> dict[str, Any]:
    """The trace's Perfetto export, as `tputrace export --perfetto` writes it."""
    from tputrace.viewers.export.perfetto import export_perfetto

    export_perfetto(trace, path)
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def _run_tui(trace_path: Path, keys: str) -> dict[str, Any]:
    """Open the TUI on `trace_path`, press each key in turn, and give back what each view showed: its screen's
    text by key, and the Ops and Timeline views' tables."""
    from tputrace.tui.app import TraceApp

    shown: dict[str, Any] = {}

    async def drive() -> None:
        app = TraceApp(make_session(trace_path))
        async with app.run_test(size=(150, 45)) as pilot:
            await settle(pilot)
            for key in keys:
                await pilot.press(key)
                await settle(pilot)
                shown[key] = screen_text(app)
                if key == "3":
                    table = app.screen.query_one("#ops-groups")
                    shown["ops_headers"] = [str(column.label) for column in table.columns.values()]
                    shown["ops_labels"] = [row[0] for row in table_rows(app, "#ops-groups")]
                elif key == "7":
                    shown["event_kinds"] = {row[0] for row in table_rows(app, "#timeline-events")}

    asyncio.run(drive())
    return shown


# -- strict mode ----------------------------------------------------------------------------------


def test_a_strict_runs_projected_chip_time_is_its_ops_programs_in_every_view(strict_trace: Path) -> None:
    """Strict eager launches one program per op and writes no `executions` rows: the projection per step adds up
    each op's program's roofline on the target, and the summary, the report, the TUI and the HTML all tell it."""
    from tputrace.viewers.report.data import prepare_report
    from tputrace.viewers.report.report_html import render_report

    chip = target_chip(DEFAULT_TARGET)
    with tputrace.open(strict_trace) as trace:
        assert trace.run.eager_mode == "DEFER_NEVER" and not trace.count("executions")
        by_step = dict(trace.sql(
            "SELECT o.step, SUM(MAX(COALESCE(p.flops, 0) / ?, COALESCE(p.bytes_accessed, 0) / ?)) FROM ops o "
            "JOIN programs p ON p.id = o.program_id WHERE p.kind = 'op' GROUP BY o.step",
            (chip.peak_flops_per_ns, chip.hbm_bytes_per_ns)))
        steps = [step for (step,) in trace.sql("SELECT step FROM steps WHERE source = 'optimizer' ORDER BY step")]
        summary = summarize(trace)
        report = json.loads(render_json(analyze(trace)))
        html = render_report(prepare_report(trace), plotlyjs="cdn")
        perfetto = _perfetto(trace, strict_trace.with_suffix(".json"))
    steady = sorted(int(by_step.get(step, 0.0)) for step in steps[1:])
    expected = steady[len(steady) // 2] if len(steady) % 2 else (steady[len(steady) // 2 - 1] + steady[len(steady) // 2]) // 2
    assert expected > 0
    assert summary.projected is not None and summary.projected.median_ns == pytest.approx(expected, abs=1)
    projected_text = format_ns(summary.projected.median_ns)
    assert f"{projected_text} projected for {chip.name}" in render_text(summary)
    assert report["projected_median_step_ns"] == summary.projected.median_ns
    assert f"{projected_text} projected for {chip.name}" in html
    assert perfetto["otherData"]["step_times"]["projected_median_step_ns"] == summary.projected.median_ns
    tui = _run_tui(strict_trace, "1")
    assert f"chip time {projected_text} projected for {chip.name}" in tui["1"]


# -- torch.compile with a graph break, reading the loss each step ----------------------------------


def test_a_loop_that_reads_its_loss_each_step_has_no_chip_pace(compiled_trace: Path) -> None:
    """Each step's programs were ready before the next host iteration ended (the loss is read every step), so the
    host never ran ahead of the chip; the second step's compile makes the steps uneven, which is the host's own
    time, not the chip's pace."""
    with tputrace.open(compiled_trace) as trace:
        ready_by_step = dict(trace.sql("SELECT step, MAX(start_ns + dur_ns) FROM executions GROUP BY step"))
        steps = trace.sql("SELECT step, end_ns FROM steps WHERE source = 'optimizer' ORDER BY step")
        assert trace.count("graph_breaks") and trace.count("compiles", where="kind = 'dynamo_frame'")
        # The loss read each step waits for the step's programs (their recorded ends lag by the watcher's, a few ms at
        # most): the host never ran a step ahead.
        assert all(ready_by_step.get(step, 0) <= next_end + 5_000_000 for (step, _), (_, next_end) in zip(steps, steps[1:]))
        summary = summarize(trace)
        report = json.loads(render_json(analyze(trace)))
        facts = run_facts(trace, 0)
    assert summary.chip_pace is None and facts.chip_pace is None and report.get("chip_pace") is None
    assert "\npace " not in render_text(summary)


# -- the Source view's time per line -----------------------------------------------------------------


def _covered_ns(spans: list[tuple[int, int]]) -> int:
    total = covered_to = 0
    for start_ns, end_ns in sorted(spans):
        total += max(0, end_ns - max(start_ns, covered_to))
        covered_to = max(covered_to, end_ns)
    return total


def _events_at(trace: Any, file: str, line: int | None = None) -> list[tuple[int, int]]:
    """The (start, end) of every compile, sync, fallback, transfer and collective at `file` (and `line`)."""
    where, params = ("file = ? AND line = ?", (file, line)) if line is not None else ("file = ?", (file,))
    return [(start, start + dur) for table in ("compiles", "syncs", "fallbacks", "transfers", "collectives")
            for start, dur in trace.sql(f"SELECT start_ns, dur_ns FROM {table}_v WHERE {where} AND dur_ns > 0", params)]


@pytest.mark.parametrize("kind", ["fallback", "compiled"])
def test_a_lines_time_counts_its_nested_events_once(kind: str, request: pytest.FixtureRequest) -> None:
    """A CPU fallback holds the sync that read its input, which holds the compile of the program it waited for; a
    torch.compile frame's compile holds its graphs' compiles, some at other lines. The Source view's time of a
    line (and of its file) counts each instant of those once: the line's ops plus the union of its other events."""
    trace_path = request.getfixturevalue(f"{kind}_trace")
    files = {stat.file: stat for stat in make_session(trace_path).source_stats()}  # as the Source view reads them
    with tputrace.open(trace_path) as trace:
        script = trace.run.script
        lines = [line for (line,) in trace.sql(" UNION ".join(
            f"SELECT line FROM {table}_v WHERE file = ?1" for table in ("ops", "compiles", "syncs", "fallbacks", "transfers")),
            (script,))]
        ops_ns = dict(trace.sql("SELECT line, SUM(dur_ns) FROM ops_v WHERE file = ? GROUP BY line", (script,)))
        expected = {line: (ops_ns.get(line) or 0) + _covered_ns(_events_at(trace, script, line)) for line in lines}
        file_ns = sum(value or 0 for value in ops_ns.values()) + _covered_ns(_events_at(trace, script))
        # The events do nest: summed, they exceed the time they cover (at the fallback's line; in the compiled file).
        nesting = [(start, end) for start, end in _events_at(trace, script, *(
            [trace.sql("SELECT line FROM fallbacks_v LIMIT 1")[0][0]] if kind == "fallback" else []))]
        assert sum(end - start for start, end in nesting) > _covered_ns(nesting)
        wall_ns = trace.wall_ns()
    stat = files[script]
    assert {line: stat.lines[line].time_ns for line in expected} == expected
    assert stat.time_ns == file_ns <= wall_ns


# -- a script that raises midway, with markup and HTML in its path, module and error ------------------


def test_a_run_that_raised_says_its_exception_literally_in_every_view(raising_trace: Path) -> None:
    """The exception's own line (not the note printed after it) is told by the summary, the TUI's overview and the
    HTML report's header; the script's path, the module path and the error show as written, never as markup."""
    from tputrace.viewers.report.data import prepare_report
    from tputrace.viewers.report.report_html import render_report

    with tputrace.open(raising_trace) as trace:
        script, error = trace.run.script, trace.run.error
        modules = {module for (module,) in trace.sql("SELECT DISTINCT module FROM ops_v WHERE module IS NOT NULL")}
        steps = trace.count("steps", where="source = 'optimizer'")
        summary = summarize(trace)
        html = render_report(prepare_report(trace), plotlyjs="cdn")
    raised = "RuntimeError: [red]<b>diverged</b> at step 2"
    assert error and raised in error and error.strip().splitlines()[-1] != raised
    assert steps == summary.step_count == 3
    assert f"exit 1, raised {raised}" in render_text(summary)
    tui = _run_tui(raising_trace, "13")
    assert f"the script raised: {raised}" in tui["1"] and script in tui["1"]
    module = next(module for module in modules if "[bold]<script>" in module)
    assert module.endswith("[bold]<script>alert(1)</script>")
    assert "exit status 1, raised RuntimeError: [red]&lt;b&gt;diverged&lt;/b&gt; at step 2" in html
    assert html.count("<script>alert") == 0 and "[bold]&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "run[bold]&lt;i&gt;s/train[red]&lt;script&gt;.py" in html


# -- four ranks ------------------------------------------------------------------------------------


def test_each_ranks_overview_counts_that_ranks_ops_and_collectives(four_rank_trace: Path) -> None:
    """The overview's facts line is the rank's (its wall, steps and compiles): its op count is the rank's too, as the
    summary of that rank says, not the file's; the Collectives view's per-rank table is each rank's rows."""
    with tputrace.open(four_rank_trace) as trace:
        ranks = trace.ranks
        ops = dict(trace.sql("SELECT rank, COUNT(*) FROM ops GROUP BY rank"))
        collectives = {rank: (count, total) for rank, count, total in trace.sql(
            "SELECT rank, COUNT(*), SUM(dur_ns) FROM collectives GROUP BY rank")}
        summaries = {rank: summarize(trace, rank=rank) for rank in ranks}
    assert len(ranks) == 4 and sum(ops.values()) > max(ops.values()) > 0
    from tputrace.tui.app import TraceApp
    from tputrace.tui.render import fmt_ns

    async def drive() -> tuple[list[str], list[list[str]]]:
        app = TraceApp(make_session(four_rank_trace))
        overviews = []
        async with app.run_test(size=(150, 45)) as pilot:
            await settle(pilot)
            for _ in ranks:
                overviews.append(screen_text(app))
                await pilot.press("R")
                await settle(pilot)
            await pilot.press("6")
            await settle(pilot)
            return overviews, table_rows(app, "#collectives-ranks")

    overviews, rank_rows = asyncio.run(drive())
    for rank, overview in zip(ranks, overviews):
        assert f"rank {rank} of 4" in overview
        assert summaries[rank].op_count == ops[rank]
        assert f" · {ops[rank]:,} ops · " in overview, overview[:600]
    assert {int(row[0]): (int(row[1].replace(",", "")), row[2]) for row in rank_rows} == {
        rank: (count, fmt_ns(total)) for rank, (count, total) in collectives.items()}


# -- an imported XProf capture ---------------------------------------------------------------------


def test_an_xprof_imports_op_times_are_device_op_times_in_every_view(imported_jax_trace: Path) -> None:
    """An XProf capture's ops are XLA ops' device times with no XLA costs to project from: the summary calls them
    device op time and tells no chip time share; so do the TUI's overview, Ops and Timeline and the HTML report."""
    from tputrace.viewers.report.data import prepare_report
    from tputrace.viewers.report.report_html import render_report

    with tputrace.open(imported_jax_trace) as trace:
        summary = summarize(trace)
        ops = dict(trace.sql("SELECT s.text, SUM(o.dur_ns) FROM ops o JOIN strings s ON s.id = o.op_sid GROUP BY s.text"))
        html = render_report(prepare_report(trace), plotlyjs="cdn")
        perfetto = _perfetto(trace, imported_jax_trace.with_suffix(".json"))
    assert summary.device_ops and summary.op_target is None
    assert "device op time" in render_text(summary) and "chip time share" not in render_text(summary)
    tui = _run_tui(imported_jax_trace, "137")
    overview = tui["1"][tui["1"].index("Where the time went"):]
    assert "device op time" in overview and "host dispatch" not in overview
    assert tui["ops_headers"][1:5] == ["calls", "device op time", "mean time", "share"]
    assert "chip time share" not in tui["ops_headers"] and "chip time share" not in tui["3"]
    assert "device op time, measured on the capture's cpu" in tui["3"]
    assert set(tui["ops_labels"]) == set(ops)  # no row of 0 calls for programs without recorded ops
    assert "device ops (" in tui["7"] and "dispatch (" not in tui["7"]
    assert "device op time" in tui["event_kinds"] and "host dispatch" not in tui["event_kinds"]
    assert "host dispatch" not in html and "device op time, measured on the capture&#x27;s cpu" in html
    assert perfetto["otherData"]["step_times"]["median_step_basis"] == "measured on the capture's cpu"
    tracks = {event["args"]["name"] for event in perfetto["traceEvents"] if event.get("name") == "thread_name"}
    assert "Device ops" in tracks and "Python dispatch" not in tracks
