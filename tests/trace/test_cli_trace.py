"""The trace commands of the CLI: run (with a stand-in recorder), info, summary, dump, and bad input."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import tputrace
from fixtures.make_traces import BROKEN_TRACE_MESSAGES, build_broken_traces
from tputrace.cli.main import COMMANDS, main
from tputrace.cli.run import LiveStatus, format_status
from tputrace.store import TraceWriter
from tputrace.schema import FORMAT_VERSION

REPO_ROOT = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = Path(sys.executable).parent / "tputrace"


def _stderr_lines(captured: Any) -> list[str]:
    return [line for line in captured.err.splitlines() if line.strip()]


# -- info / summary / dump ---------------------------------------------------------------------


def test_every_command_module_has_the_protocol() -> None:
    import importlib

    for name in COMMANDS:
        command = importlib.import_module(f"tputrace.cli.{name}")
        assert callable(command.prepare_parser) and callable(command.run), name


def test_info(sample_trace_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(sample_trace_path)]) == 0
    out = capsys.readouterr().out
    assert f"format   {FORMAT_VERSION}, created 2026-01-01T00:00:00+00:00 by tputrace 0.1.0" in out
    assert "rank 1   /home/user/proj/train.py --steps 6" in out
    assert "host tpu-vm-0, pid 4242, tpu, 4 chips, DEFER_AND_FUSE" in out
    for table in ("strings", "ops", "collectives", "graph_breaks"):
        assert f"         {table} " in out

    assert main(["info", "--json", str(sample_trace_path)]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["format_version"] == FORMAT_VERSION
    assert facts["counts"]["steps"] == 12
    assert [run["rank"] for run in facts["runs"]] == [0, 1]


def test_summary(sample_trace_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(sample_trace_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run    train.py --steps 6 · rank 0 of 2 · tpu, 4 chips per rank (8 in all), DEFER_AND_FUSE · exit 0\n")
    assert "6 steps (first " in out
    for heading in (
        "time split",
        "top ops by host dispatch (excl. flushes/compiles)",
        "recompiles: 2 of 5 compiles",
        "host syncs: 8 stalls",
        "CPU fallbacks: 7 calls",
        "collectives",
    ):
        assert heading in out, heading
    assert "input 0 dim 1: 128 -> 192" in out
    assert "train.py:35  item" in out
    assert "aten._unique2.default" in out
    assert str(sample_trace_path) in out
    assert "\x1b[" not in out

    assert main(["summary", "--rank", "1", "--top", "2", str(sample_trace_path)]) == 0
    out = capsys.readouterr().out
    assert "rank 1 of 2" in out

    assert main(["summary", "--rank", "7", str(sample_trace_path)]) == 2
    assert _stderr_lines(capsys.readouterr()) == [f"tputrace: error: {sample_trace_path} has no rank 7 (ranks: 0, 1)"]


def test_summary_on_a_terminal_uses_rich(sample_trace_path: Path) -> None:
    from tputrace.summary import print_summary, summarize

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    with tputrace.open(sample_trace_path) as trace:
        print_summary(summarize(trace), terminal)
    assert "top ops by host dispatch (excl. flushes/compiles)" in terminal.getvalue()
    assert "\x1b[" in terminal.getvalue()


def test_summary_on_a_terminal_shows_markup_in_names_as_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Op names, files and reasons are the trace's text: on a terminal, Rich markup in them (`[bold red]`,
    `[link=...]`) is shown as written, never turned into styles or terminal hyperlinks."""
    from tputrace.summary import print_summary, summarize

    monkeypatch.setenv("COLUMNS", "200")
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    op = "aten.[bold red]evil[/].[link=https://example.com]x[/link]"
    path = tmp_path / "markup.tptrace"
    with TraceWriter(path) as writer:
        writer.set_run(world_size=1, script="/w/[b]train[/b].py", argv=[], platform="tpu", chips=1, eager_mode="DEFER_NEVER")
        frame = writer.frame("/w/[i]train[/i].py", 3, "[u]main[/u]")
        writer.append("ops", (0, 0, writer.intern(op), writer.intern("f32[8]"), writer.intern("f32[8]"), 0, 0, 1000, frame,
                              writer.intern("[b]Net[/b]"), 0, None, None))
        writer.update_run(end_ns=2000, exit_status=0)
    terminal = Terminal()
    with tputrace.open(path) as trace:
        print_summary(summarize(trace), terminal)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())
    assert op in shown and "\x1b]8;" not in terminal.getvalue()


ESCAPES = "\x1b]0;retitled\x07\x1b[2J"  # a terminal would retitle its window, then clear the screen


def _trace_with_escapes(path: Path) -> Path:
    """A one-op trace whose op name, file, function, script and error hold terminal escape sequences."""
    with TraceWriter(path) as writer:
        writer.set_run(world_size=1, script=f"/w/train{ESCAPES}.py", argv=[], host=f"h{ESCAPES}", platform="tpu", chips=1,
                       eager_mode="DEFER_NEVER")
        frame = writer.frame(f"/w/train{ESCAPES}.py", 3, f"main{ESCAPES}")
        writer.append("ops", (0, 0, writer.intern(f"aten.add{ESCAPES}"), writer.intern("f32[8]"), writer.intern("f32[8]"), 0, 0,
                              1000, frame, None, 0, None, None))
        writer.append("syncs", (0, "item", frame, 0, 100, 500, 0, 0, None))
        writer.update_run(end_ns=2000, exit_status=1, error=f"ValueError: bad{ESCAPES}")
    return path


@pytest.mark.parametrize("command", [["summary"], ["report"], ["info"], ["dump", "--kind", "ops"], ["dump", "--kind", "syncs"]])
def test_escape_sequences_in_a_trace_reach_no_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """Control characters in the trace's text are printed as escapes (`\\x1b`), never sent to the terminal."""
    path = _trace_with_escapes(tmp_path / "escapes.tptrace")
    assert main([command[0], str(path), *command[1:]]) == 0
    out = capsys.readouterr().out
    assert "\x1b]0;" not in out and "\x07" not in out and "\x1b[2J" not in out
    assert "\\x1b[2J" in out or command == ["report"]  # this report has no finding that names the op or its line


def test_escape_sequences_reach_no_terminal_through_rich(tmp_path: Path) -> None:
    from tputrace.analysis import analyze_path
    from tputrace.analysis.render import print_report
    from tputrace.summary import print_summary, summarize

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    path = _trace_with_escapes(tmp_path / "escapes.tptrace")
    terminal = Terminal()
    with tputrace.open(path) as trace:
        print_summary(summarize(trace), terminal)
    print_report(analyze_path(path), terminal, color=True)
    shown = terminal.getvalue()
    assert "\x1b]0;" not in shown and "\x1b[2J" not in shown and "\\x1b[2J" in shown


def test_dump(sample_trace_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", "--kind", "ops", "--limit", "3", str(sample_trace_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith('ops seq=1 rank=0 op="aten.embedding.default" inputs="f32[1024,256], i64[8,128]"')
    assert "source=/home/user/proj/model.py:88:forward" in lines[0]

    assert main(["dump", "--json", "--kind", "compiles", str(sample_trace_path)]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == 9
    assert {record["table"] for record in records} == {"compiles"}
    assert records[0]["source"] == {"file": "/home/user/proj/train.py", "line": 35, "function": "train_step"}
    assert any(record["reason"] == "recompile" for record in records)

    assert main(["dump", "--raw", "--kind", "ops", "--limit", "1", str(sample_trace_path)]) == 0
    assert "op_sid=" in capsys.readouterr().out

    assert main(["dump", str(sample_trace_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith('meta key="magic" value="tputrace-trace"\n')
    with tputrace.open(sample_trace_path) as trace:
        assert len(out.splitlines()) == len(trace.meta) + sum(trace.counts().values())


@pytest.mark.parametrize("command", ["info", "summary", "dump"])
def test_bad_traces_give_one_line_and_exit_2(
    tmp_path: Path, sample_trace_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    for name, path in build_broken_traces(tmp_path, sample_trace_path).items():
        assert main([command, str(path)]) == 2, name
        lines = _stderr_lines(capsys.readouterr())
        assert len(lines) == 1, (name, lines)
        assert lines[0].startswith("tputrace: error: ") and BROKEN_TRACE_MESSAGES[name] in lines[0], (name, lines)


@pytest.mark.skipif(
    not CONSOLE_SCRIPT.exists(), reason="the tputrace console script is not installed (pip install -e .)"
)
def test_console_script_reports_bad_traces(tmp_path: Path, sample_trace_path: Path) -> None:
    broken = build_broken_traces(tmp_path, sample_trace_path)
    for name in ("missing", "directory", "corrupt", "truncated", "text", "newer_version"):
        result = subprocess.run(
            [str(CONSOLE_SCRIPT), "summary", str(broken[name])], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2, (name, result.stderr)
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("tputrace: error: "), (name, result.stderr)
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), "info", str(sample_trace_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "records" in result.stdout


@pytest.mark.parametrize(
    ("update", "error"),
    [
        ("UPDATE ops SET start_ns = 'x'", "ops.start_ns holds 'x' (text) where the format has integers"),
        ("UPDATE ops SET dur_ns = dur_ns + 0.5", "ops.dur_ns holds"),
        ("UPDATE ops SET dur_ns = -5, start_ns = -100", "ops.dur_ns holds -5, a negative duration"),
        ("UPDATE steps SET start_ns = NULL", "steps.start_ns holds NULL where the format needs a value"),
        ("UPDATE strings SET text = CAST(text AS BLOB)", "(blob) where the format has text"),
        ("UPDATE programs SET flops = 'lots'", "programs.flops holds 'lots' (text) where the format has numbers"),
        ("UPDATE runs SET rank = NULL", "runs.rank holds NULL where the format needs a value"),
        ("UPDATE programs SET flops = 9e999", "programs.flops holds inf, not a finite number"),
        ("UPDATE ops SET start_ns = 9223372036854775807",
         "ops.start_ns holds 9223372036854775807, more nanoseconds than any run lasts"),
    ],
    ids=["text-time", "real-duration", "negative-duration", "null-step-start", "blob-string", "text-flops", "null-rank",
         "infinite-flops", "huge-time"],
)
def test_values_of_the_wrong_type_are_one_line(
    tmp_path: Path, sample_trace_path: Path, capsys: pytest.CaptureFixture[str], update: str, error: str
) -> None:
    import shutil
    import sqlite3

    path = tmp_path / "damaged.tptrace"
    shutil.copyfile(sample_trace_path, path)
    with sqlite3.connect(path) as connection:
        connection.execute(update)
    connection.close()
    commands = [["summary"], ["report"], ["plot", "-o", str(tmp_path / "r.html")],
                ["export", "--perfetto", str(tmp_path / "p.json.gz")], ["export", "--tensorboard", str(tmp_path / "tb")]]
    failed = 0
    for command in commands:
        status = main([command[0], str(path), *command[1:]])
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err, (command, captured.err)
        if status != 0:
            failed += 1
            last = _stderr_lines(captured)[-1]
            assert status == 2 and last.startswith(f"tputrace: error: {path} is damaged: ") and error in last, (command, last)
    assert failed, "no command failed on the damaged trace"
    empty = [folder for folder in (tmp_path / "tb").rglob("*") if folder.is_dir() and not any(folder.iterdir())]
    assert not empty, f"a failed export left an empty run for TensorBoard to list: {empty}"



def test_report_json_stays_json_when_a_trace_holds_infinities(
    tmp_path: Path, sample_trace_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`report --json` is strict JSON (no `Infinity`, which JSON lacks) even on a trace whose costs hold `inf`."""
    import shutil
    import sqlite3

    path = tmp_path / "infinite.tptrace"
    shutil.copyfile(sample_trace_path, path)
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE programs SET flops = 9e999, bytes_accessed = 9e999")
    connection.close()
    assert main(["report", str(path), "--json"]) == 0

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    assert json.loads(capsys.readouterr().out, parse_constant=refuse)["findings"] is not None


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (["run"], "tputrace run: error: the following arguments are required: script.py | module"),
        (["summary", "{trace}", "--top", "0"], "tputrace summary: error: argument --top: must be at least 1, not 0"),
        (["report", "{trace}", "--top", "-1"], "tputrace report: error: argument --top: must be at least 1, not -1"),
        (["dump", "{trace}", "--limit", "-1"], "tputrace dump: error: argument --limit: must be at least 0, not -1"),
        (["dump", "{trace}", "--limit", "ten"], "tputrace dump: error: argument --limit: 'ten' is not a whole number"),
    ],
    ids=["run-without-a-script", "summary-top-0", "report-top-negative", "dump-limit-negative", "dump-limit-not-a-number"],
)
def test_bad_arguments_are_a_usage_error_that_names_them(
    sample_trace_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], error: str
) -> None:
    with pytest.raises(SystemExit) as exit_request:
        main([argument.format(trace=sample_trace_path) for argument in arguments])
    assert exit_request.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert _stderr_lines(captured)[-1] == error


def test_the_smallest_counts_are_accepted(sample_trace_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", str(sample_trace_path), "--kind", "steps", "--limit", "0"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["report", str(sample_trace_path), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "1. [" in out and "\n2. [" not in out


# -- run ----------------------------------------------------------------------------------------


class StandInRecorder:
    """Stands in for tputrace.recording.lifecycle (start/stop/live_counts) and writes a real, minimal trace."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.writer: TraceWriter | None = None

    def start(self, path: str | None, *, script: str, argv: list[str], mode: str, window: Any = None) -> StandInRecorder:
        self.calls.append(("start", path, script, argv, mode, os.environ.get("TPUTRACE_CHIPS")))
        if path is not None:
            self.writer = TraceWriter(path)
            self.writer.set_run(script=script, argv=argv, platform="cpu", chips=1, start_unix_ns=time.time_ns())
            self.writer.append("steps", (0, 1, 0, 5_000, "explicit"))
        return self

    def stop(self, exit_status: int, error: str | None = None) -> None:
        self.calls.append(("stop", exit_status, error))
        if self.writer is not None:
            self.writer.update_run(end_ns=10_000, exit_status=exit_status, error=error)
            self.writer.close()

    def live_counts(self) -> dict[str, int]:
        return {"steps": 1, "ops": 2, "compiles": 3}

    def live_compiles(self, after: int) -> tuple[list[str], int]:
        return [], after


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> StandInRecorder:
    stand_in = StandInRecorder()
    monkeypatch.setitem(sys.modules, "tputrace.recording.lifecycle", stand_in)
    monkeypatch.setenv("TPUTRACE_CHIPS", "97")  # a value no test passes as --chips
    return stand_in


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


_REPORTING_SCRIPT = """
    import json, sys
    with open(sys.argv[1], "w") as out:
        json.dump({"argv": sys.argv, "path0": sys.path[0], "name": __name__}, out)
"""


def test_run_script_as_main(tmp_path: Path, recorder: StandInRecorder, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script(tmp_path, _REPORTING_SCRIPT)
    report, trace_path = tmp_path / "report.json", tmp_path / "out.tptrace"
    argv_before, path_before = sys.argv[:], sys.path[:]
    assert (
        main(
            [
                "run",
                "-o",
                str(trace_path),
                "--chips",
                "3",
                "--mode",
                "strict",
                str(script),
                str(report),
                "-o",
                "x",
                "--mode",
            ]
        )
        == 0
    )
    seen = json.loads(report.read_text())
    assert seen == {"argv": [str(script), str(report), "-o", "x", "--mode"], "path0": str(tmp_path), "name": "__main__"}
    assert (sys.argv, sys.path) == (argv_before, path_before)
    assert recorder.calls == [
        ("start", str(trace_path), str(script), [str(report), "-o", "x", "--mode"], "strict", "3"),
        ("stop", 0, None),
    ]
    err = capsys.readouterr().err
    assert "run    train.py" in err and "exit 0" in err
    assert err.rstrip().endswith(f"tputrace: trace saved to {trace_path}")
    with tputrace.open(trace_path) as trace:
        assert trace.run.exit_status == 0


def test_run_default_trace_path(
    tmp_path: Path, recorder: StandInRecorder, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    script = _script(tmp_path, "x = 1\n", name="my_model.py")
    assert main(["run", str(script)]) == 0
    traces = list(tmp_path.glob("tputrace-my_model-*.tptrace"))
    assert len(traces) == 1
    assert len(traces[0].stem.removeprefix("tputrace-my_model-")) == len("20260101-000000")
    assert recorder.calls[0][1] == str(traces[0]) and recorder.calls[0][4] == "defer"
    assert f"trace saved to {traces[0]}" in capsys.readouterr().err


def test_run_module(tmp_path: Path, recorder: StandInRecorder, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _script(package, _REPORTING_SCRIPT, name="job.py")
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "report.json"
    assert main(["run", "--no-trace", "-m", "pkg.job", str(report), "--flag"]) == 0
    seen = json.loads(report.read_text())
    assert seen["argv"] == [str(package / "job.py"), str(report), "--flag"]
    assert seen["path0"] == str(tmp_path) and seen["name"] == "__main__"
    assert recorder.calls == [
        ("start", None, "-m pkg.job", [str(report), "--flag"], "defer", "97"),
        ("stop", 0, None),
    ]


def test_run_script_that_raises(tmp_path: Path, recorder: StandInRecorder, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script(
        tmp_path,
        """
        def train():
            raise ValueError("boom")
        train()
    """,
    )
    assert main(["run", "-o", str(tmp_path / "t.tptrace"), str(script)]) == 1
    err = capsys.readouterr().err
    traceback_text = err.split("\n\n")[0]
    assert traceback_text.startswith("Traceback (most recent call last):\n")
    assert f'File "{script}", line 4, in <module>' in traceback_text
    assert "ValueError: boom" in traceback_text
    assert "runpy" not in traceback_text and "tputrace" not in traceback_text
    stop = recorder.calls[-1]
    assert stop[:2] == ("stop", 1) and stop[2].rstrip().endswith("ValueError: boom")
    assert "raised ValueError: boom" in err


def test_summary_names_the_exception_line_of_an_error_with_text_after_it(tmp_path: Path) -> None:
    """Dynamo's errors end with their user frames and a `TORCHDYNAMO_VERBOSE` hint after the exception's
    line; the run line names the exception, not the hint."""
    script = _script(
        tmp_path,
        """
        class Unsupported(Exception):
            pass
        raise Unsupported("Data-dependent branching\\n\\nfrom user code:\\n   File \\"train.py\\", line 5, in f\\n    if x.sum() > 0:\\n\\nSet TORCHDYNAMO_VERBOSE=1 for the internal stack trace")
    """,
    )
    trace_path = tmp_path / "t.tptrace"
    run = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace_path), str(script)], capture_output=True, text=True)
    assert run.returncode == 1, run.stderr[-2000:]
    summary = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "summary", str(trace_path)], capture_output=True, text=True)
    info = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "info", str(trace_path)], capture_output=True, text=True)
    for output in (summary.stdout, info.stdout):
        assert "raised Unsupported: Data-dependent branching" in output, output
        assert "TORCHDYNAMO_VERBOSE" not in output


# A launcher stopping the other ranks after one died sends SIGTERM while a rank is still formatting the
# error its collective raised: the run then recorded exit status 0.
SIGTERM_WHILE_REPORTING_AN_ERROR = (
    "import os, signal\n"
    "class PeerGone(Exception):\n"
    "    @property\n"
    "    def __notes__(self):\n"
    "        os.kill(os.getpid(), signal.SIGTERM)\n"
    "        return []\n"
    "raise PeerGone()\n"
)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ("import sys\nsys.exit(3)\n", 3, None),
        ("import sys\nsys.exit()\n", 0, None),
        ("import sys\nsys.exit('bad config')\n", 1, "bad config"),
        ("raise KeyboardInterrupt\n", 130, "KeyboardInterrupt"),
        ("import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(10)\n", 143, None),
        (SIGTERM_WHILE_REPORTING_AN_ERROR, 143, None),
    ],
    ids=["exit-3", "exit-none", "exit-message", "ctrl-c", "sigterm", "sigterm-while-reporting-an-error"],
)
def test_run_exit_paths(
    tmp_path: Path,
    recorder: StandInRecorder,
    capsys: pytest.CaptureFixture[str],
    body: str,
    status: int,
    message: str | None,
) -> None:
    import signal

    handler_before = signal.getsignal(signal.SIGTERM)
    script = _script(tmp_path, body)
    assert main(["run", "-o", str(tmp_path / "t.tptrace"), str(script)]) == status
    assert recorder.calls[-1][:2] == ("stop", status)
    assert signal.getsignal(signal.SIGTERM) == handler_before
    err = capsys.readouterr().err
    if message is not None:
        assert message in err
    # A stop request gets the trace's path at once, not the summary: its analysis could outlast a grace period.
    assert ("stopped by SIGTERM; trace saved to" in err) == (status == 143)
    with tputrace.open(tmp_path / "t.tptrace") as trace:
        assert trace.run.exit_status == status


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (["missing.py"], "tputrace: error: no such script: missing.py"),
        (["."], "tputrace: error: . is a directory, not a script"),
        (["-m", "no_such_module_xyz"], "tputrace: error: no module named no_such_module_xyz"),
        (["--chips", "0", "x.py"], "tputrace: error: --chips must be at least 1, not 0"),
        (
            ["--compile-cache", "x.py/programs", "x.py"],
            "tputrace: error: --compile-cache x.py/programs cannot be used as a directory (Not a directory)",
        ),
        (
            ["-o", "no/such/dir/t.tptrace", "x.py"],
            "tputrace: error: cannot write the trace to {cwd}/no/such/dir/t.tptrace: {cwd}/no/such/dir does not exist",
        ),
    ],
)
def test_run_bad_targets(
    tmp_path: Path,
    recorder: StandInRecorder,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    arguments: list[str],
    error: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("")
    assert main(["run", *arguments]) == 2
    assert _stderr_lines(capsys.readouterr()) == [error.format(cwd=tmp_path.resolve())]
    assert recorder.calls == []


def test_run_prints_top_findings_when_the_analysis_provides_them(
    tmp_path: Path, recorder: StandInRecorder, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import types

    analysis = types.ModuleType("tputrace.analysis")
    analysis.print_top_findings = lambda trace_path, file: print(f"findings for {Path(trace_path).name}", file=file)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tputrace.analysis", analysis)
    monkeypatch.setattr(tputrace, "analysis", analysis, raising=False)
    script = _script(tmp_path, "x = 1\n")
    assert main(["run", "-o", str(tmp_path / "t.tptrace"), str(script)]) == 0
    assert "findings for t.tptrace" in capsys.readouterr().err


def test_the_end_of_a_run_sets_the_findings_apart_from_the_summary(
    sample_trace_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tputrace.cli.run import report

    report(sample_trace_path)
    lines = capsys.readouterr().err.splitlines()
    findings = next(index for index, line in enumerate(lines) if line.startswith("top findings ("))
    assert lines[findings - 1] == "" and lines[findings - 2].strip()
    assert lines[-1] == f"tputrace: trace saved to {sample_trace_path}"


def test_live_status_redraws_and_erases() -> None:
    stream = io.StringIO()
    status = LiveStatus(lambda: {"steps": 4, "ops": 12345, "compiles": 6}, stream, interval_s=0.01)
    status.start()
    time.sleep(0.1)
    status.stop()
    status.stop()
    text = stream.getvalue()
    assert format_status({"steps": 4, "ops": 12345, "compiles": 6}) == "tputrace: step 4 · 12,345 ops · 6 compiles · 0 syncs"
    assert format_status({"steps": 1, "ops": 1, "compiles": 1, "syncs": 1, "step_ns": 2_500_000}) == (
        "tputrace: step 1 (last 2.50 ms) · 1 op · 1 compile · 1 sync")
    assert "\r\x1b[2Ktputrace: step 4 · 12,345 ops · 6 compiles · 0 syncs" in text
    assert text.endswith("\r\x1b[2K")


def test_live_status_shows_one_compile_line_for_a_burst() -> None:
    stream = io.StringIO()
    compiles = ["compile: aten.mm.default", "recompile (shape changed): aten.mm.default", "compile: aten.add.Tensor"]

    def compiles_after(after: int) -> tuple[list[str], int]:
        return compiles[after:], len(compiles)

    status = LiveStatus(lambda: {"steps": 1}, stream, compiles_after, interval_s=3600)
    status.start()
    status.stop()
    lines = [line.replace("\x1b[2K", "").strip("\r") for line in stream.getvalue().split("\n")]
    assert lines == ["tputrace: compile: aten.mm.default (+2 more)", ""]
