"""`tputrace run script.py [args...]` / `tputrace run -m module [args...]`: record a run.

The target runs as `__main__` (via runpy, with `sys.argv` and `sys.path[0]` set as Python sets them)
inside `tputrace.recording.lifecycle.start(...)` / `stop(...)`. `stop` runs however the script ends: normally,
by an exception, `sys.exit`, Ctrl-C or SIGTERM (turned into `SystemExit(143)`). Afterwards the
summary of the saved trace goes to stderr. Processes the script forks or starts are recorded as ranks
of their own (`tputrace.recording.forking`, `tputrace.recording.spawning`: the recording describes
itself to them in the environment).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from tputrace import settings
from tputrace.recording.recording_window import WindowSpec, WindowSpecError, spec_of_options
from tputrace.recording.exits import (
    EXIT_INTERRUPTED,
    EXIT_SCRIPT_RAISED,
    EXIT_TERMINATED,
    sigterm_deferred,
    sigterm_raises_system_exit,
    system_exit_status,
)
from tputrace.store.errors import TputraceError, TraceWriteError
from tputrace.wording import format_ns, plural

MODES = ("defer", "strict", "blocking", "compile")
STATUS_INTERVAL_S = 0.25
COMPILE_LINE_INTERVAL_S = 1.0  # at most one live compile line per second; the others are counted in it


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "run",
        help="run a script on the tpu device and record a trace",
        description="Run a Python script (or module) on the tpu device, record a trace, and summarise it.",
        usage="tputrace run [-o PATH] [--chips N] [--nproc N] [--mode {defer,strict,blocking,compile}] [--compile-cache DIR] [--no-trace] [--force] [--tui] [--as-cuda] [--quiet] [--live] "
        "[--steps N | --schedule wait=W,warmup=U,active=A[,repeat=R][,skip_first=S] | --from-code] (script.py | -m module) [args ...]",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="trace file (default: ./tputrace-<script>-<time>.tptrace); '{rank}' in it becomes the distributed rank",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="launch N ranks with torch.distributed's elastic launcher, one chip each (with --chips M, M each); their "
             "traces are merged into one",
    )
    parser.add_argument("--no-summary", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--chips", type=int, metavar="N", help="number of tpu chips to expose (sets TPUTRACE_CHIPS)")
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="defer",
        help="defer: fuse ops into programs (default); strict: one program per op; blocking: strict, each op waits "
        "for the chip and indices and probabilities are checked as torch's CPU kernels check them (a sync per such op; "
        "for finding the line of an out-of-range index); compile: labels a torch.compile run COMPILE and keeps "
        "the default eager mode, strict, for the ops outside its graphs (compiled graphs are recorded in every mode)",
    )
    parser.add_argument(
        "--compile-cache",
        metavar="DIR",
        help="keep compiled programs in DIR and load them from there in later runs instead of compiling again "
        "(sets TPUTRACE_COMPILE_CACHE; the trace marks each program loaded so)",
    )
    parser.add_argument("--no-trace", action="store_true", help="run on the tpu backend but record nothing")
    window = parser.add_mutually_exclusive_group()
    window.add_argument("--steps", type=int, metavar="N", help="record the first N steps only; the script runs on unrecorded")
    window.add_argument(
        "--schedule",
        metavar="wait=W,warmup=U,active=A[,repeat=R][,skip_first=S]",
        help="record the steps torch.profiler.schedule would: skip S steps, then cycles of W steps not recorded, U run but "
        "not kept and A recorded; R cycles (0, the default: no end)",
    )
    window.add_argument(
        "--from-code", action="store_true", help="record only between the script's tputrace.start() and tputrace.stop() (or inside `with tputrace.record():`)"
    )
    parser.add_argument("--force", action="store_true", help="write the trace over an existing file that is not a trace")
    parser.add_argument("--tui", action="store_true", help="open the trace in the terminal UI when the run ends")
    parser.add_argument(
        "--as-cuda",
        action="store_true",
        help="run a script written for CUDA unchanged on tpu: torch.cuda.is_available() is true, and 'cuda' devices, "
        ".cuda() and torch.cuda's device functions mean tpu (see docs/recording.md for what is mapped)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no live output (compile lines and the progress line) while the script runs"
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="live output even when stderr is not a terminal (by default it is shown on a terminal only)",
    )
    parser.add_argument("-m", dest="run_module", action="store_true", help="run a module as a script, like python -m")
    parser.add_argument("target", metavar="script.py | module", help="the script (or, with -m, the module) to run")
    script_args = parser.add_argument("target_args", nargs=argparse.REMAINDER, metavar="args", help="arguments for the script")
    script_args.required = False  # argparse counts a REMAINDER as required (3.10-3.13 say "required: ..., args")
    return parser


@dataclass(frozen=True)
class Target:
    """What to run: a script path or a module name."""

    name: str
    is_module: bool

    @property
    def stem(self) -> str:
        return self.name.rsplit(".", 1)[-1] if self.is_module else Path(self.name).stem

    @property
    def description(self) -> str:
        """The `runs.script` value: the script's absolute path, or `-m module`."""
        return f"-m {self.name}" if self.is_module else str(Path(self.name).resolve())


def run(args: argparse.Namespace) -> int:
    import importlib

    target = Target(args.target, args.run_module)
    check_target(target)
    if args.chips is not None:
        if args.chips < 1:
            raise TputraceError(f"--chips must be at least 1, not {args.chips}")
        os.environ["TPUTRACE_CHIPS"] = str(args.chips)
    if args.compile_cache is not None:
        check_compile_cache(args.compile_cache)
        os.environ[settings.COMPILE_CACHE] = args.compile_cache
    try:
        settings.check()
    except settings.SettingError as error:
        raise TputraceError(str(error)) from None
    window = recording_window_spec(args)
    if args.nproc is None:
        from tputrace.cli.launch import stop_with_the_launcher

        stop_with_the_launcher()
    else:
        from tputrace.cli.launch import run_ranks

        merged_path = None if args.no_trace else Path(args.output or default_trace_path(target.stem)).resolve()
        return run_ranks(target, args, merged_path, report)
    output = args.output.replace("{rank}", os.environ.get("RANK", "0")) if args.output else None
    trace_path = None if args.no_trace else Path(output or default_trace_path(target.stem)).resolve()
    if trace_path is not None:
        check_trace_path(trace_path, target, force=args.force)
    recorder = importlib.import_module("tputrace.recording.lifecycle")
    launcher_pid = os.getpid()
    live = not args.quiet and (args.live or sys.stderr.isatty())
    exit_status = execute(target, list(args.target_args), recorder, trace_path, args.mode, as_cuda=args.as_cuda, live=live, window=window)
    if os.getpid() != launcher_pid:
        return exit_status  # a process the script forked: the parent reports, with this one merged in
    if trace_path is not None and exit_status == EXIT_TERMINATED:
        # A stop request: the trace is finished; the summary's analysis of a long run would outlast a grace period.
        print(f"tputrace: stopped by SIGTERM; trace saved to {trace_path} (`tputrace summary` and `tputrace report` read it)",
              file=sys.stderr)
    elif trace_path is not None and not args.no_summary:
        report(trace_path)
        if getattr(args, "tui", False):
            from tputrace.cli.tui import open_ui_after_run

            open_ui_after_run(trace_path)
    return exit_status


def recording_window_spec(args: argparse.Namespace) -> WindowSpec | None:
    """The window `--steps`, `--schedule` or `--from-code` asks for (None: record every step); raises
    `TputraceError` for a value that names none."""
    try:
        return spec_of_options(getattr(args, "steps", None), getattr(args, "schedule", None), getattr(args, "from_code", False))
    except WindowSpecError as error:
        raise TputraceError(str(error)) from None


def check_target(target: Target) -> None:
    """Raise `TputraceError` when the script does not exist or the module cannot be found."""
    if target.is_module:
        import importlib.util

        with _script_environment(target, []):
            try:
                spec = importlib.util.find_spec(target.name)
            except (ImportError, ValueError):
                spec = None
        if spec is None:
            raise TputraceError(f"no module named {target.name}")
        return
    path = Path(target.name)
    if not path.exists():
        raise TputraceError(f"no such script: {target.name}")
    if path.is_dir():
        raise TputraceError(f"{target.name} is a directory, not a script")


def check_trace_path(trace_path: Path, target: Target, force: bool = False) -> None:
    """Raise `TputraceError` when the trace cannot be written there (before the backend loads): over the
    script, a folder, or a file that is not a trace (without `force`)."""
    from tputrace.cli.outputs import TRACE, check_output

    if trace_path.is_dir():
        raise TputraceError(f"cannot write the trace to {trace_path}: it is a directory")
    if not trace_path.parent.is_dir():
        raise TputraceError(f"cannot write the trace to {trace_path}: {trace_path.parent} does not exist")
    check_output(trace_path, TRACE, inputs=[] if target.is_module else [Path(target.name)], force=force)


def check_compile_cache(directory: str) -> None:
    """Raise `TputraceError` when `--compile-cache` cannot be a directory of compiled programs. The option's
    own words: the check of `TPUTRACE_COMPILE_CACHE`, which it sets, would name the variable and say to unset it."""
    path = Path(directory).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as failure:
        raise TputraceError(f"--compile-cache {directory} cannot be used as a directory ({failure.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise TputraceError(f"--compile-cache {directory} is not a directory tputrace can write")


def default_trace_path(stem: str) -> Path:
    return Path.cwd() / f"tputrace-{stem}-{time.strftime('%Y%m%d-%H%M%S')}.tptrace"


def execute(target: Target, script_args: list[str], recorder: Any, trace_path: Path | None, mode: str,
            *, as_cuda: bool = False, live: bool | None = None, window: WindowSpec | None = None) -> int:
    """Run the target between `recorder.start` and `recorder.stop` (with CUDA mapped to tpu when
    `as_cuda`; with live output on stderr when `live`, by default when stderr is a terminal; recording
    only the steps `window` keeps); return its exit status."""
    import runpy

    exit_status, error_text = 0, None
    show_live = sys.stderr.isatty() if live is None else live
    status_line = LiveStatus(recorder.live_counts, sys.stderr, recorder.live_compiles) if show_live else None
    recorder.start(
        None if trace_path is None else str(trace_path),
        script=target.description,
        argv=script_args,
        mode=mode,
        window=window,
    )
    if as_cuda:
        recorder.map_cuda_to_tpu()
    try:
        with sigterm_raises_system_exit(), _script_environment(target, script_args):
            if status_line is not None:
                status_line.start()
            try:
                if target.is_module:
                    runpy.run_module(target.name, run_name="__main__", alter_sys=True)
                else:
                    # An absolute `__file__` (and code file names), as `python script.py` gives.
                    runpy.run_path(os.path.abspath(target.name), run_name="__main__")
            except SystemExit as exit_request:
                exit_status, message = system_exit_status(exit_request.code)
                if message is not None:
                    _stop(status_line)
                    print(message, file=sys.stderr)
            except KeyboardInterrupt as interrupt:
                _stop(status_line)
                error_text = user_traceback(interrupt)
                sys.stderr.write(error_text)
                exit_status = EXIT_INTERRUPTED
            except BaseException as error:  # noqa: BLE001 - report whatever the script raised, as Python does
                exit_status = EXIT_SCRIPT_RAISED
                _stop(status_line)
                error_text = user_traceback(error)
                sys.stderr.write(error_text)
    except SystemExit as late_exit:  # a SIGTERM while the script's end was handled (a launcher stopping ranks)
        exit_status = system_exit_status(late_exit.code)[0]
    finally:
        _stop(status_line)
        with sigterm_deferred():
            try:
                recorder.stop(exit_status=exit_status, error=error_text)
            except TraceWriteError as write_error:  # a full disk: the script's own status stands
                print(f"tputrace: warning: the trace is incomplete: {write_error}", file=sys.stderr)
    return exit_status


def user_traceback(error: BaseException) -> str:
    """The exception formatted as Python would, without the frames of tputrace and runpy above the script and the
    backend's below the user's call (`tputrace.cli.tracebacks`)."""
    from tputrace.cli.tracebacks import user_traceback as formatted

    return formatted(error, __file__)


def report(trace_path: Path) -> None:
    """Print the saved trace's summary, the top findings (if the analysis exists) and the trace's path."""
    from tputrace.store.reader import open_trace
    from tputrace.summary import print_summary, summarize

    print(file=sys.stderr)
    try:
        with open_trace(trace_path) as trace:
            summary = summarize(trace)
        print_summary(summary, sys.stderr)
        _print_top_findings(trace_path)
    except TputraceError as error:
        print(f"tputrace: error: cannot summarise the trace: {error}", file=sys.stderr)
    print(f"tputrace: trace saved to {trace_path}", file=sys.stderr)


def _print_top_findings(trace_path: Path) -> None:
    """Hook for the analysis layer: print its top findings if `tputrace.analysis` is installed."""
    try:
        import tputrace.analysis as analysis
    except ImportError:
        return
    print_findings: Callable[..., None] | None = getattr(analysis, "print_top_findings", None)
    if print_findings is not None:
        print(file=sys.stderr)  # apart from the summary's last table, as its sections are from each other
        print_findings(trace_path, file=sys.stderr)


@contextmanager
def _script_environment(target: Target, script_args: list[str]) -> Iterator[None]:
    """Set `sys.argv` and `sys.path[0]` as `python script.py` / `python -m module` would; restore after."""
    saved_argv = sys.argv[:]
    saved_path = sys.path[:]
    if target.is_module:
        sys.argv = [target.name, *script_args]
        first_path = os.getcwd()
    else:
        sys.argv = [target.name, *script_args]
        first_path = str(Path(target.name).resolve().parent)
    if sys.path:
        sys.path[0] = first_path
    else:
        sys.path.append(first_path)
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


class LiveStatus:
    """Live output while the script runs: a line per compile with its reason (at most one a second, with
    the count of those it stands for) above a one-line status (step, last step's time, ops, compiles,
    syncs) redrawn a few times a second."""

    def __init__(
        self,
        counts: Callable[[], dict[str, int]],
        stream: TextIO,
        compiles: Callable[[int], tuple[list[str], int]] | None = None,
        interval_s: float = STATUS_INTERVAL_S,
    ) -> None:
        self._counts = counts
        self._compiles = compiles
        self._stream = stream
        self._interval_s = interval_s
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._compiles_seen = 0
        self._pending_compile: str | None = None
        self._pending_more = 0
        self._last_compile_line = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._redraw_loop, name="tputrace-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop redrawing and erase the line. Idempotent."""
        if self._thread is None:
            return
        self._stop_event.set()
        self._thread.join()
        self._thread = None
        self._collect_compiles()
        self._write("\r\x1b[2K" + self._compile_line(force=True))

    def _redraw_loop(self) -> None:
        while not self._stop_event.wait(self._interval_s):
            try:
                self._collect_compiles()
                counts = self._counts()
            except Exception:  # noqa: BLE001 - the live output must never break the run
                continue
            self._write(f"\r\x1b[2K{self._compile_line()}{format_status(counts)}")

    def _collect_compiles(self) -> None:
        """Take the compiles since the last look: the first waits to be shown, the others are counted."""
        if self._compiles is None:
            return
        texts, last = self._compiles(self._compiles_seen)
        new = last - self._compiles_seen
        self._compiles_seen = last
        if new <= 0:
            return
        if self._pending_compile is None:
            self._pending_compile = texts[0] if texts else "compile"
            self._pending_more += new - 1
        else:
            self._pending_more += new

    def _compile_line(self, force: bool = False) -> str:
        """The waiting compile's line (and a newline) when one may be shown now, else ''."""
        now = time.monotonic()
        if self._pending_compile is None or (not force and now - self._last_compile_line < COMPILE_LINE_INTERVAL_S):
            return ""
        more = f" (+{self._pending_more} more)" if self._pending_more else ""
        line = f"tputrace: {self._pending_compile}{more}\n\r\x1b[2K"
        self._pending_compile, self._pending_more, self._last_compile_line = None, 0, now
        return line

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            pass


def format_status(counts: dict[str, int]) -> str:
    step_ns = counts.get("step_ns", -1)
    step_time = f" (last {format_ns(step_ns)})" if step_ns >= 0 else ""
    outside = " · outside the recording window" if counts.get("recording", 1) == 0 else ""
    return (
        f"tputrace: step {counts.get('steps', 0):,}{step_time} · {plural(counts.get('ops', 0), 'op')} · "
        f"{plural(counts.get('compiles', 0), 'compile')} · {plural(counts.get('syncs', 0), 'sync')}{outside}"
    )


def _stop(status_line: LiveStatus | None) -> None:
    if status_line is not None:
        status_line.stop()
