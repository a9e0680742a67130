"""What a user does once a trace exists, on real runs: `tputrace check` against budgets it cannot check (a
run with no step after warm-up, a limit no run can be held to, a trace passed as the budget), the pytest
plugin on a test of one step and a marker with a misspelt key, `tputrace diff` of two unrelated scripts and of
one script in two eager modes, and the TUI on an imported torch.profiler capture."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fixtures.make_tui_fixture import SMALL_TRACE, make_session, settle
from importers.captures import TORCH_PROFILER
from test_tui import screen_text
from tputrace.cli.main import main

pytest.importorskip("torch", reason="recording needs torch (pip install -e .[backend])")

# No loop: one op and a read of its result, as a quick check script or a test of one step is.
ONE_SHOT = textwrap.dedent("""\
    import torch

    x = torch.ones(4, device="tpu") * 2
    print(x.sum().item())
""")

# Three steps, each reading its loss.
SYNCING_LOOP = textwrap.dedent("""\
    import torch
    from torch import nn

    model = nn.Linear(8, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(torch.randn(4, 8, device="tpu")).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(loss.item())
""")

# Batches of two sizes in turn, made on the host: each size compiles after warm-up, in strict mode each op's
# program, in DeferAndFuse the step's fused programs.
TWO_BATCH_SIZES = textwrap.dedent("""\
    import torch
    from torch import nn

    model = nn.Linear(16, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        x = torch.randn((8, 12)[step % 2], 16).to("tpu")
        model(x).relu().sum().backward()
        opt.step()
        opt.zero_grad()
""")

# One read of the loss a step; in the fourth step, after its read, the process is killed (as an out-of-memory
# killer or a preempted machine kills it): the trace has no end record.
KILLED_MID_STEP = textwrap.dedent("""\
    import os
    import signal
    import time

    import torch
    from torch import nn

    model = nn.Linear(8, 4).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        loss = model(torch.randn(4, 8, device="tpu")).sum()
        loss.backward()
        print(loss.item())
        if step == 3:
            time.sleep(1)  # the writer commits what it holds every quarter second
            os.kill(os.getpid(), signal.SIGKILL)
        opt.step()
        opt.zero_grad()
""")

PLUGIN_TESTS = textwrap.dedent("""\
    import pytest
    import torch


    @pytest.mark.tputrace(max_syncs_per_step=0)
    def test_one_step():
        model = torch.nn.Linear(8, 2).to("tpu")
        loss = model(torch.randn(4, 8, device="tpu")).sum()
        loss.backward()
        assert loss.item() == loss.item()


    @pytest.mark.tputrace(max_recompile=0)
    def test_misspelt_key():
        pass
""")


def _tputrace(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tputrace.cli.main", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd, stdin=subprocess.DEVNULL)


def _record(folder: Path, name: str, source: str, *options: str, trace_name: str | None = None,
            exit_status: int = 0) -> Path:
    script = folder / f"{name}.py"
    script.write_text(source)
    trace_path = folder / f"{trace_name or name}.tptrace"
    result = _tputrace("run", "--quiet", *options, "-o", str(trace_path), str(script))
    assert result.returncode == exit_status, result.stderr[-3000:]
    return trace_path


@pytest.fixture(scope="module")
def one_shot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("one_shot"), "one_shot", ONE_SHOT)


@pytest.fixture(scope="module")
def syncing_loop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _record(tmp_path_factory.mktemp("syncing_loop"), "syncing_loop", SYNCING_LOOP)


@pytest.mark.parametrize(("budget_text", "message"), [
    ("max_compile_seconds = nan\n", "max_compile_seconds must be a number, not nan"),
    ("max_exposed_communication_share = 30\n", "is a share of the step from 0 to 1, not 30 (write 0.3 for 30%)"),
    ("max_recompile = 0\n", "unknown budget key 'max_recompile' (did you mean 'max_recompiles'?"),
    (None, "not a budget file (not UTF-8 text, as TOML is)"),
])
def test_a_budget_no_run_can_be_checked_against_is_one_line_and_exit_2(
        budget_text: str | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A limit every comparison passes (nan, a share given in percent) or a file that is no budget (a trace
    passed as `--budget`, as when the two arguments are swapped) is a bad budget, never "within budget"."""
    budget = tmp_path / "budget.toml"
    if budget_text is None:
        budget.write_bytes(SMALL_TRACE.read_bytes())
    else:
        budget.write_text(budget_text)
    assert main(["check", str(SMALL_TRACE), "--budget", str(budget)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and message in err, err


def test_per_step_limits_on_a_run_without_a_step_after_warm_up_cannot_be_checked(
        one_shot: Path, syncing_loop: Path, tmp_path: Path) -> None:
    """A run with no step after warm-up has no steady step to count syncs or copies in: a per-step limit on it
    cannot be checked (it passed on a count of 0), as a step-time ratio against a run with no timed step cannot."""
    per_step = tmp_path / "per_step.toml"
    per_step.write_text("max_syncs_per_step = 0\nmax_transfers_per_step = 0\n")
    result = _tputrace("check", str(one_shot), "--budget", str(per_step))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("max_syncs_per_step = 0 cannot be checked: no step after warm-up to count host syncs in"
                               " (the run has 0 steps;"), lines
    assert lines[1].startswith("max_transfers_per_step = 0 cannot be checked: no step after warm-up"), lines

    looped = _tputrace("check", str(syncing_loop), "--budget", str(per_step))
    assert looped.returncode == 1
    assert f"max_syncs_per_step = 0 exceeded: 1 host syncs per steady step at {syncing_loop.parent / 'syncing_loop.py'}:11" \
        in looped.stdout, looped.stdout

    ratio = tmp_path / "ratio.toml"
    ratio.write_text("max_step_time_ratio = 1.5\n")
    against = _tputrace("check", str(syncing_loop), "--budget", str(ratio), "--baseline", str(one_shot))
    assert against.returncode == 1, against.stdout + against.stderr
    assert against.stdout == "max_step_time_ratio = 1.5 cannot be checked: the baseline has no timed step\n"


def test_the_pytest_plugin_fails_a_one_step_test_with_a_per_step_limit_and_says_a_misspelt_key_once(
        tmp_path: Path) -> None:
    """A test of one step under `max_syncs_per_step` fails as uncheckable (it passed with "0 host syncs per
    steady step" though it read its loss twice), and the session's summary says it had no step to count syncs in;
    a misspelt marker key is told once, not twice through a chained exception; the test's trace names the test
    once in its summary's first line."""
    (tmp_path / "test_tiny.py").write_text(PLUGIN_TESTS)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rN", "-p", "no:cacheprovider", "-p", "no:tputrace",
                             "-p", "tputrace.pytest_plugin", "--tputrace=traces", "test_tiny.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "max_syncs_per_step = 0 cannot be checked: no step after warm-up to count host syncs in" in result.stdout
    assert result.stdout.count("unknown budget key 'max_recompile'") == 1, result.stdout
    assert "During handling of the above exception" not in result.stdout
    assert ("test_tiny.py::test_one_step: 0 recompile(s) after warm-up, no step after warm-up to count host syncs in,"
            " 1 budget violation(s)") in result.stdout, result.stdout

    summary = _tputrace("summary", str(tmp_path / "traces" / "test_tiny.py_test_one_step.tptrace"))
    assert summary.returncode == 0, summary.stderr
    assert summary.stdout.splitlines()[0].startswith("run    test_tiny.py::test_one_step · "), summary.stdout


def test_diff_of_two_runs_that_share_no_source_file_says_so_in_every_view(one_shot: Path, syncing_loop: Path,
                                                                          tmp_path: Path) -> None:
    """Two unrelated scripts share no line, so every finding of one is "new" and of the other "fixed": `diff`, the
    HTML comparison and the TUI's Compare view say why; a diff of a run with itself has no such note."""
    from tputrace.store.reader import open_trace
    from tputrace.tui.app import TraceApp
    from tputrace.tui.session import Session

    note = ("the runs share no source file (before: one_shot.py, after: syncing_loop.py), so no line of one"
            " matches a line of the other")
    result = _tputrace("diff", str(one_shot), str(syncing_loop))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[lines.index(f"B: {syncing_loop}") + 1].startswith(f"note: {note}"), lines
    assert f"  new finding at {syncing_loop.parent / 'syncing_loop.py'}:11: Host sync every step" in result.stdout

    assert json.loads(_tputrace("diff", str(one_shot), str(syncing_loop), "--json").stdout)["note"].startswith(note)
    assert json.loads(_tputrace("diff", str(syncing_loop), str(syncing_loop), "--json").stdout)["note"] is None

    page = tmp_path / "compare.html"
    assert _tputrace("plot", "--compare", str(one_shot), str(syncing_loop), "-o", str(page)).returncode == 0
    assert f'<p class="tp-note">{note}' in page.read_text()

    shown: list[str] = []

    async def drive() -> None:
        app = TraceApp(Session.open(open_trace(syncing_loop), baseline_path=one_shot))
        async with app.run_test(size=(250, 30)) as pilot:
            await settle(pilot)
            await pilot.press("0")
            await settle(pilot)
            shown.append(screen_text(app))

    asyncio.run(drive())
    assert f"note: {note}" in shown[0], shown[0]


def test_diff_from_strict_to_deferred_matches_a_fused_programs_recompile_to_the_ops_own(tmp_path: Path) -> None:
    """The same loop in strict mode, then in DeferAndFuse: the fused program's recompile, which says which of its
    ops took the new size (`op 0 aten.addmm.default (...): arg 1 dim 0: 8 -> 12`), is the strict addmm program's
    (`input 1 dim 0: 8 -> 12`), not a new recompile that the headline calls a regression; the strict run's
    programs ran as often as their ops, not 0 times."""
    strict = _record(tmp_path, "two_sizes", TWO_BATCH_SIZES, "--mode", "strict", trace_name="strict")
    deferred = _record(tmp_path, "two_sizes", TWO_BATCH_SIZES, trace_name="deferred")
    result = _tputrace("diff", str(strict), str(deferred))
    assert result.returncode == 0, result.stderr
    assert not result.stdout.startswith("regression: new recompile"), result.stdout
    assert "  new recompile" not in result.stdout, result.stdout
    assert "  fixed recompile" in result.stdout, result.stdout
    # A strict op's program runs inside the op's dispatch, with no `executions` row: its runs are its op's calls.
    assert re.search(r"^  gone program: aten\.addmm\.default \(\d+ compiles?, 4 runs\)$", result.stdout, re.M), result.stdout
    assert not re.search(r"^  \w+ program: aten\..*, 0 runs\)$", result.stdout, re.M), result.stdout


def test_check_of_a_rank_the_trace_does_not_have_is_one_line_and_exit_2(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`check --rank N` of a rank the trace lacks is a bad input, as in `summary` and `report`: it checked the
    figures of no rank, which keep every limit."""
    budget = tmp_path / "budget.toml"
    budget.write_text("max_recompiles = 0\nmax_cpu_fallbacks = 0\n")
    assert main(["check", str(SMALL_TRACE), "--budget", str(budget), "--rank", "5"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"tputrace: error: {SMALL_TRACE} has no rank 5 (ranks: 0, 1)\n"
    assert main(["diff", str(SMALL_TRACE), str(SMALL_TRACE), "--rank", "5"]) == 2
    assert capsys.readouterr().err == f"tputrace: error: {SMALL_TRACE} has no rank 5 (ranks: 0, 1)\n"


def test_the_fusions_view_of_an_imported_capture_says_the_capture_has_none(tmp_path: Path) -> None:
    """A torch.profiler capture has no DeferAndFuse flushes: the Fusions view says so, not that the run was a
    strict-mode or compile-mode one."""
    from tputrace.tui.app import TraceApp

    script = tmp_path / "profiled.py"
    script.write_text(TORCH_PROFILER)
    made = subprocess.run([sys.executable, str(script), str(tmp_path / "profile.json")], capture_output=True, text=True,
                          timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    trace_path = tmp_path / "profiled.tptrace"
    imported = _tputrace("import", str(tmp_path / "profile.json"), "-o", str(trace_path))
    assert imported.returncode == 0, imported.stderr

    shown: list[str] = []

    async def drive() -> None:
        app = TraceApp(make_session(trace_path))
        async with app.run_test(size=(180, 30)) as pilot:
            await settle(pilot)
            await pilot.press("5")
            await settle(pilot)
            shown.append(screen_text(app))

    asyncio.run(drive())
    assert ("no flushes: they are the tpu backend's DeferAndFuse programs, which a torch_profiler_json capture does"
            " not have") in shown[0], shown[0]
    assert "strict-mode" not in shown[0]


def test_merging_two_runs_of_the_same_rank_points_to_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two single-process runs are both rank 0: merging them is one line that says merge is for the ranks of one
    run and `diff` compares two."""
    assert main(["merge", str(SMALL_TRACE), str(SMALL_TRACE), "-o", str(tmp_path / "merged.tptrace")]) == 2
    assert capsys.readouterr().err == (f"tputrace: error: rank 0 is in both {SMALL_TRACE} and {SMALL_TRACE} (merge joins the"
                                       " ranks of one distributed run; `tputrace diff A B` compares two runs)\n")


def test_syncs_of_a_step_the_run_did_not_finish_are_not_counted_in_its_steady_steps(tmp_path: Path) -> None:
    """A run killed in the middle of a step read its loss once in each step: the unfinished step's read is not one
    of the steady steps', where it made 1.5 syncs per steady step of two."""
    trace_path = _record(tmp_path, "killed_mid_step", KILLED_MID_STEP, exit_status=-9)
    budget = tmp_path / "budget.toml"
    budget.write_text("max_syncs_per_step = 0.5\n")
    result = _tputrace("check", str(trace_path), "--budget", str(budget))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("max_syncs_per_step = 0.5 exceeded: 1 host syncs per steady step at "
                                    f"{tmp_path / 'killed_mid_step.py'}:13"), result.stdout


TINY_MODEL = textwrap.dedent("""\
    import torch
    from torch import nn

    model = nn.Linear(2, 2).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        loss = model(torch.ones(1, 2, device="tpu")).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
""")


def test_a_tiny_models_projected_step_under_a_nanosecond_is_shown_as_under_one_not_zero(tmp_path: Path) -> None:
    """A 2x2 linear layer's step moves a few hundred bytes: a v6e would run it in a fraction of a nanosecond, which the
    summary, the report and the JSON keep (they said `0 ns projected`, as if nothing ran)."""
    trace_path = _record(tmp_path, "tiny", TINY_MODEL)
    summary = _tputrace("summary", str(trace_path))
    assert summary.returncode == 0, summary.stderr
    assert "<1 ns projected for v6e" in summary.stdout, summary.stdout
    report = _tputrace("report", str(trace_path), "--json")
    projected = json.loads(report.stdout)["projected_median_step_ns"]
    assert 0 < projected < 1, projected
    text = _tputrace("report", str(trace_path))
    assert "(<1 ns projected for v6e)" in text.stdout and "(0 ns projected" not in text.stdout, text.stdout
