"""What a user reads once a trace exists, on runs the other view tests do not make: a script that switches its
eager mode part-way (`torch.tpu.set_eager_mode`), read by `summary`, `info`, the TUI's overview, the HTML report
and `report`, and compared by `diff` with the same script run strict throughout; the Ops and Source views of an
optimizer whose first step compiles inside an op; the pytest plugin on a test of forward passes in several shapes."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fixtures.make_tui_fixture import settle
from test_tui import screen_text

pytest.importorskip("torch", reason="recording needs torch (pip install -e .[backend])")

# Two steps fused (the default of `tputrace run`), then six in strict eager: the script's own switch. The last fused
# step's program runs while the host compiles the first strict step's ops, which can stretch its time past the step's
# dispatch; with five strict steady steps after it, that step does not set the medians.
SWITCHES_TO_STRICT = textwrap.dedent("""\
    import torch
    from torch import nn

    model = nn.Linear(8, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(8):
        if step == 2:
            torch.tpu.set_eager_mode("DEFER_NEVER")
        loss = model(torch.randn(4, 8, device="tpu")).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
""")


def _tputrace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tputrace.cli.main", *args], capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)


def _record(folder: Path, name: str, source: str, *options: str) -> Path:
    script = folder / f"{name}.py"
    script.write_text(source)
    trace_path = folder / f"{name}.tptrace"
    result = _tputrace("run", "--quiet", *options, "-o", str(trace_path), str(script))
    assert result.returncode == 0, result.stderr[-3000:]
    return trace_path


@pytest.fixture(scope="module")
def switches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("switches"), "switches", SWITCHES_TO_STRICT)


def test_a_run_that_switches_its_eager_mode_part_way_shows_both_modes_in_every_view(switches: Path,
                                                                                   tmp_path: Path) -> None:
    """The run's row keeps the mode active at its end: every view called the run DEFER_NEVER throughout (and the
    report told it to leave `--mode strict`, an option it was not run with), though its first steps were fused. The
    HTML report's top source lines list each line once, where a line was a row per recorded frame of it."""
    from tputrace.store.reader import open_trace
    from tputrace.tui.app import TraceApp
    from tputrace.tui.session import Session

    trace_path = switches
    modes = "DEFER_AND_FUSE, then DEFER_NEVER from step 2 (switches.py:9)"

    summary = _tputrace("summary", str(trace_path))
    assert summary.returncode == 0, summary.stderr
    assert summary.stdout.splitlines()[0] == f"run    switches.py · cpu, 1 chip, {modes} · exit 0", summary.stdout
    info = _tputrace("info", str(trace_path))
    assert f", {modes}\n" in info.stdout, info.stdout

    report = _tputrace("report", str(trace_path))
    assert report.returncode == 0, report.stderr
    assert "The run was in DEFER_NEVER mode (`--mode strict`)" not in report.stdout, report.stdout
    if "Host-bound steps" in report.stdout:
        assert "The script switched from DEFER_AND_FUSE to DEFER_NEVER in step 2" in report.stdout, report.stdout

    page = tmp_path / "switches.html"
    assert _tputrace("plot", str(trace_path), "-o", str(page)).returncode == 0
    html = page.read_text()
    assert f"cpu · {modes}" in html
    # A line's ops (a frame per call's columns) and its flushes' compiles (the whole line's frame) are one row.
    top_lines = html[html.index("Top source lines"):].split("</table>")[0]
    lines = re.findall(r'<tr><td class="">(switches\.py:\d+)</td>', top_lines)
    assert lines and len(lines) == len(set(lines)), lines

    shown: list[str] = []

    async def drive() -> None:
        app = TraceApp(Session.open(open_trace(trace_path)))
        async with app.run_test(size=(200, 30)) as pilot:
            await settle(pilot)
            shown.append(screen_text(app))

    asyncio.run(drive())
    assert f"cpu, 1 chip · {modes} · torch" in shown[0], shown[0]


def test_diff_matches_a_finding_without_a_line_whose_wording_changed(switches: Path, tmp_path: Path) -> None:
    """The same script in `--mode strict`, then switching to strict after two fused steps: both runs are host-bound,
    one against the chip's roofline estimate (`the chip would run (target roofline estimate) ...`), one against its
    measured programs (`the chip ran ...`). A finding with no line is matched by its title with the figures blanked
    out, so the words that differ made it one new and one fixed finding; it is one changed finding."""
    strict = tmp_path / "strict.tptrace"
    script = switches.parent / "switches.py"
    made = _tputrace("run", "--quiet", "--mode", "strict", "-o", str(strict), str(script))
    assert made.returncode == 0, made.stderr[-3000:]
    switched = switches
    if "Host-bound steps" not in _tputrace("report", str(switched)).stdout:
        # A loaded host stretches strict ops' waits for the chip past their dispatch: the run is then not host-bound,
        # which is the host's doing, not the diff's. It is recorded once more.
        again = tmp_path / "again"
        again.mkdir()
        switched = _record(again, "switches", SWITCHES_TO_STRICT)
    result = _tputrace("diff", str(strict), str(switched))
    assert result.returncode == 0, result.stderr
    host_bound = [line for line in result.stdout.splitlines() if "Host-bound steps" in line]
    assert host_bound and all(line.startswith("  changed finding: Host-bound steps: ") for line in host_bound), \
        result.stdout


# Adam's first `step()` makes its state inside its first foreach op: that op's call holds a flush and its compile.
ADAM_LOOP = textwrap.dedent("""\
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(3):
        loss = model(torch.randn(4, 8, device="tpu")).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
""")


def test_every_grouping_of_the_ops_view_counts_dispatch_without_the_flushes_and_compiles_inside_ops(
        tmp_path: Path) -> None:
    """Grouped by op, an op's time leaves out the flushes and compiles that ran inside its call (as the summary ranks
    ops); grouped by source line, module or op and shapes it kept them, so `opt.step()`'s line held nearly all the
    "host dispatch" (its first step's state compile), and the Source view counted that compile twice: in the line's
    ops and as the line's compile."""
    from tputrace.store.reader import open_trace
    from tputrace.tui.app import TraceApp
    from tputrace.tui.session import Session

    trace_path = _record(tmp_path, "adam", ADAM_LOOP)
    step_line = 8
    with open_trace(trace_path) as trace:
        (nested_ns,), = trace.sql(
            "SELECT COALESCE(SUM(c.dur_ns), 0) FROM compiles c JOIN ops o ON o.rank = c.rank AND c.start_ns >= o.start_ns"
            " AND c.start_ns + c.dur_ns <= o.start_ns + o.dur_ns")
        (line_compiles_ns,), = trace.sql(
            "SELECT COALESCE(SUM(c.dur_ns), 0) FROM compiles c JOIN frames f ON f.id = c.frame_id WHERE f.line = ?",
            (step_line,))
    assert nested_ns > 0, "no compile ran inside an op: the run does not test what it should"

    session = Session.open(open_trace(trace_path))
    totals = {grouping: sum(group.total_ns for group in session.op_groups(0, grouping))
              for grouping in ("op", "op_shapes", "source", "module")}
    assert len(set(totals.values())) == 1, totals
    by_line = {group.source.line: group for group in session.op_groups(0, "source") if group.source is not None}
    (adam_file,) = [stat for stat in session.source_stats() if stat.file.endswith("adam.py")]
    assert adam_file.lines[step_line].time_ns == by_line[step_line].total_ns + line_compiles_ns

    shown: list[str] = []

    async def drive() -> None:
        app = TraceApp(Session.open(open_trace(trace_path)))
        async with app.run_test(size=(200, 30)) as pilot:
            await settle(pilot)
            for key in ("3", "g", "g"):
                await pilot.press(key)
                await settle(pilot)
            shown.append(screen_text(app))

    asyncio.run(drive())
    assert "by source line · sorted by total · host dispatch (excl. flushes/compiles), measured on this host" in shown[0], \
        shown[0]


# Forward passes of three batch sizes, with no optimizer step: every compile falls in the run's warm-up.
PLUGIN_SIZES_TEST = textwrap.dedent("""\
    import pytest
    import torch


    @pytest.mark.tputrace(max_recompiles=0)
    def test_three_sizes():
        model = torch.nn.Linear(8, 2).to("tpu")
        for rows in (2, 3, 4):
            model(torch.randn(rows, 8, device="tpu")).sum()
        torch.tpu.synchronize()
""")


def test_max_recompiles_on_a_test_without_steps_that_recompiled_cannot_be_checked(tmp_path: Path) -> None:
    """A test of forward passes has no step after warm-up, so every recompile is a warm-up one: `max_recompiles=0`
    passed with "0 recompile(s) after warm-up" though the linear layer compiled again for each new batch size; it
    fails as a limit that cannot be checked, and says how many recompiles the warm-up held."""
    (tmp_path / "test_sizes.py").write_text(PLUGIN_SIZES_TEST)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:tputrace",
                             "-p", "tputrace.pytest_plugin", "--tputrace=traces", "test_sizes.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"max_recompiles = 0 cannot be checked: no step after warm-up to count recompiles in \(the run has"
                     r" 0 steps;.*\); its \d+ recompiles came in the warm-up", result.stdout), result.stdout
