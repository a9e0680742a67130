"""`tputrace run --nproc N`: the launcher of the ranks, their merge, and how a run of ranks ends.

The ranks run under torch.distributed's elastic agent, each as `tputrace run` recording its own trace
into `<trace>.ranks/`; their traces are merged into `<trace>` however the run ends:

- a rank fails (raises, exits non-zero, is killed): the agent stops the others (SIGTERM, then SIGKILL
  after `RANK_SHUTDOWN_TIMEOUT_S`); the ranks still in a collective with it get a Python error from
  that collective; the launcher names the rank that failed first and where, and exits with its status.
  Each rank notes how its script ended (`tputrace.recording.exits.note_script_end`), with a trace or
  without: a rank whose error came from a collective with a dead peer, or that the launcher stopped,
  followed another one, whichever process exited first;
- the launcher gets SIGINT (Ctrl-C) or SIGTERM: it sends that signal to every rank, which finishes its
  trace and exits; ranks still running `RANK_SHUTDOWN_TIMEOUT_S` later (or at a second signal) are
  killed; the traces are merged and the launcher exits 128 + the signal (130, 143);
- the launcher is killed (SIGKILL): each rank gets SIGTERM from Linux (`stop_with_the_launcher`) and
  finishes its trace; nothing is merged.

The agent runs on a thread of its own, so that it installs no signal handlers of its own (its
handlers raise in the middle of its shutdown and leave ranks running).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from tputrace.recording.exits import EXIT_TERMINATED, LAUNCHER_PID_VARIABLE, SCRIPT_ENDS_VARIABLE, ScriptEnd, read_script_end
from tputrace.recording.recording_window import spec_of_options
from tputrace.store.errors import TputraceError

RANK_SHUTDOWN_TIMEOUT_S = 10
_PR_SET_PDEATHSIG = 1  # prctl(2)
_POLL_S = 0.02  # how often the launcher looks at its ranks: an exit is timed to within this
_SCAN_S = 0.5  # how often it looks for ranks it does not know yet
# Words in a rank's error that say a peer's failure caused it, not the rank itself.
_PEER_FAILURE_MARKS = ("on the tpu process group failed", "Connection closed by peer", "Connection reset by peer")


@dataclass(frozen=True)
class RankFailure:
    """How a rank ended, as the launcher saw it."""

    exit_status: int
    reason: str
    timestamp: float


@dataclass(frozen=True)
class FirstFailure:
    """The rank whose failure the others followed: who, why, where in the script when known, the exit
    status the launcher passes on (its script's; when that script ended cleanly, the earliest failed
    script's), and how its process ended when that differs."""

    rank: int
    reason: str
    where: str | None
    exit_status: int
    then: str | None = None

    def text(self) -> str:
        where = f" at {self.where}" if self.where else ""
        then = f"; then it was {self.then}" if self.then else ""
        return f"rank {self.rank} failed first ({self.reason}{where}{then})"


def run_ranks(target: Any, args: argparse.Namespace, merged_path: Path | None, show_summary: Callable[[Path], None]) -> int:
    """Run `args.nproc` ranks of `tputrace run` (one chip each, each recording into `<trace>.ranks/`),
    then merge their traces into `merged_path` (None: `--no-trace`) and show its summary. Exit status: 0;
    128 + a signal that stopped the launcher; else that of the rank that failed first."""
    from tputrace.cli.outputs import TRACE, check_output

    if args.nproc < 1:
        raise TputraceError(f"--nproc must be at least 1, not {args.nproc}")
    worker_args = ["-m", "tputrace.cli.main", "run", "--no-summary", "--mode", args.mode]
    if getattr(args, "as_cuda", False):
        worker_args.append("--as-cuda")
    window = spec_of_options(getattr(args, "steps", None), getattr(args, "schedule", None), getattr(args, "from_code", False))
    worker_args += window.arguments if window is not None else []
    rank_paths: list[Path] = []
    if merged_path is None:
        worker_args.append("--no-trace")
    else:
        inputs = [] if target.is_module else [Path(target.name)]
        check_output(merged_path, TRACE, inputs=inputs, force=getattr(args, "force", False), option="-o")
        rank_dir = rank_trace_dir(merged_path)
        rank_dir.mkdir(exist_ok=True)
        for stale in rank_dir.glob("rank*.tptrace*"):
            stale.unlink()
        rank_paths = [rank_dir / f"rank{rank}.tptrace" for rank in range(args.nproc)]
        worker_args += ["-o", str(rank_dir / "rank{rank}.tptrace")]
    if args.chips is None:
        os.environ["TPUTRACE_CHIPS"] = "1"
    os.environ[LAUNCHER_PID_VARIABLE] = str(os.getpid())
    worker_args += (["-m", target.name] if target.is_module else [target.name]) + list(args.target_args)
    with tempfile.TemporaryDirectory(prefix="tputrace-ends-") as ends_dir:
        os.environ[SCRIPT_ENDS_VARIABLE] = ends_dir
        try:
            failures, stop_signal = launch_ranks(worker_args, args.nproc)
        finally:
            os.environ.pop(SCRIPT_ENDS_VARIABLE, None)
        ends = {rank: end for rank in failures if (end := read_script_end(Path(ends_dir), rank)) is not None}
    first = None if stop_signal else first_failure(failures, rank_paths, ends)
    if merged_path is not None:
        merged = merge_rank_traces(rank_paths, merged_path, args.nproc, failures, first, show_summary)
        if merged and getattr(args, "tui", False) and not stop_signal:
            from tputrace.cli.tui import open_ui_after_run

            open_ui_after_run(merged_path)
    if stop_signal:
        print(f"tputrace: stopped by {signal.Signals(stop_signal).name}; every rank was stopped", file=sys.stderr)
        return 128 + stop_signal
    if first is None:
        return 0
    stopped = "; the launcher stopped the other ranks" if args.nproc > 1 else ""
    print(f"tputrace: {first.text()}{stopped}", file=sys.stderr)
    return first.exit_status


def stop_with_the_launcher() -> None:
    """In a rank: ask Linux to send this process SIGTERM when the launcher that started it dies (killed
    with SIGKILL, it cannot stop its ranks itself), so that the rank still finishes its trace. Does
    nothing in a process the launcher did not start itself, or off Linux."""
    launcher = os.environ.get(LAUNCHER_PID_VARIABLE)
    if not launcher or not sys.platform.startswith("linux") or str(os.getppid()) != launcher:
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != launcher:  # it died before the request was in place
        raise SystemExit(128 + signal.SIGTERM)


def rank_trace_dir(merged_path: Path) -> Path:
    """Where `--nproc` keeps each rank's own trace: `<trace>.ranks/rank<N>.tptrace`."""
    return merged_path.with_name(merged_path.name.removesuffix(".tptrace") + ".ranks")


def launch_ranks(worker_args: list[str], nproc: int) -> tuple[dict[int, RankFailure], int | None]:
    """Run `python <worker_args>` as `nproc` ranks on this host. Returns the failed ranks, and the
    signal (SIGINT, SIGTERM) that stopped the launcher, or None."""
    import uuid

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"tputrace-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        shutdown_timeout=RANK_SHUTDOWN_TIMEOUT_S,
    )
    failures: dict[int, RankFailure] = {}
    launcher_errors: list[BaseException] = []
    exits = ExitTimes(os.getpid(), nproc)

    def run_agent() -> None:
        try:
            elastic_launch(config, sys.executable)(*worker_args)
        except ChildFailedError as error:
            failures.update({rank: rank_failure(failure.exitcode, failure.timestamp) for rank, failure in error.failures.items()})
        except BaseException as error:  # noqa: BLE001 - raised again on the main thread
            launcher_errors.append(error)

    agent = threading.Thread(target=run_agent, name="tputrace-launcher", daemon=True)
    stopper = RankStopper(os.getpid())
    with stopper.handling_signals():
        agent.start()
        while agent.is_alive():
            agent.join(_POLL_S)
            exits.look()
            stopper.kill_when_overdue()
    if launcher_errors:
        raise launcher_errors[0]
    exited = exits.times()
    timed = {rank: RankFailure(failure.exit_status, failure.reason, exited.get(rank, failure.timestamp)) for rank, failure in failures.items()}
    return timed, stopper.signal_number


class RankStopper:
    """Stops the ranks when the launcher gets SIGINT or SIGTERM: the first signal goes to every rank's
    process group (each rank finishes its trace and exits); ranks left `RANK_SHUTDOWN_TIMEOUT_S` later,
    or at a second signal, are killed."""

    def __init__(self, launcher_pid: int) -> None:
        self.launcher_pid = launcher_pid
        self.signal_number: int | None = None
        self._kill_at: float | None = None

    @contextlib.contextmanager
    def handling_signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM stop the ranks while this is entered (on the main thread: signals are
        handled there only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {number: signal.signal(number, self._on_signal) for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signal_number is None:
            self.signal_number = signum
            self._kill_at = time.monotonic() + RANK_SHUTDOWN_TIMEOUT_S
            os.write(2, f"\ntputrace: {signal.Signals(signum).name}: stopping the ranks; their traces are finished and merged\n".encode())
            signal_ranks(self.launcher_pid, signum)
        else:
            os.write(2, b"tputrace: a second signal: killing the ranks (their last records may be lost)\n")
            self._kill_at = time.monotonic()

    def kill_when_overdue(self) -> None:
        """Past the deadline, kill the ranks, again every `_SCAN_S` (a rank the agent started after the
        signal goes too)."""
        if self._kill_at is not None and time.monotonic() > self._kill_at:
            self._kill_at = time.monotonic() + _SCAN_S
            signal_ranks(self.launcher_pid, signal.SIGKILL)


class ExitTimes:
    """When each rank's process ended, to within `_POLL_S`: the agent's own record of a failure has
    whole seconds, too coarse to tell a rank that failed from the one that failed because of it.
    The launcher's children are looked up (a scan of /proc) until every rank is known; after that only
    their own entries are read."""

    def __init__(self, launcher_pid: int, nproc: int) -> None:
        self.launcher_pid = launcher_pid
        self.nproc = nproc
        self._rank_of_pid: dict[int, int] = {}
        self._ended: dict[int, float] = {}
        self._next_scan = 0.0

    def look(self) -> None:
        if len(self._rank_of_pid) < self.nproc and time.monotonic() >= self._next_scan:
            self._next_scan = time.monotonic() + _SCAN_S
            for pid in _children(self.launcher_pid):
                rank = None if pid in self._rank_of_pid else _rank_of(pid)
                if rank is not None:
                    self._rank_of_pid[pid] = rank
        now = time.time()
        for pid, rank in self._rank_of_pid.items():
            if rank not in self._ended and _process_state(pid) in (None, "Z"):
                self._ended[rank] = now

    def times(self) -> dict[int, float]:
        """The time (seconds since the epoch) each rank was first seen ended."""
        return dict(self._ended)


def _process_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()[0]


def _rank_of(pid: int) -> int | None:
    """The RANK the agent gave a rank's process (in its environment)."""
    try:
        environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in environment:
        if entry.startswith(b"RANK="):
            try:
                return int(entry[5:])
            except ValueError:
                return None
    return None


def signal_ranks(launcher_pid: int, signum: int) -> None:
    """Send `signum` to the process group of every rank: the launcher's children that lead a process
    group of their own (the elastic agent starts each rank in a new session)."""
    for pid in _children(launcher_pid):
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signum)
        except (ProcessLookupError, PermissionError):
            continue


def _children(parent_pid: int) -> list[int]:
    """The pids whose parent is `parent_pid` (from /proc)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(parent_pid):
            children.append(int(entry))
    return children


def rank_failure(exitcode: int, timestamp: float) -> RankFailure:
    """A launcher exit code as an exit status and a reason (negative codes are signals)."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return RankFailure(128 - exitcode, f"killed by {name} (signal {-exitcode})", timestamp)
    return RankFailure(exitcode, f"exited with status {exitcode}", timestamp)


def first_failure(failures: Mapping[int, RankFailure], rank_paths: list[Path], ends: Mapping[int, ScriptEnd] | None = None) -> FirstFailure | None:
    """The rank whose failure the others followed. A rank whose script's error came from a collective
    with a dead peer, or that the launcher stopped (SIGTERM), followed another one; what its script
    raised comes from its own note (`ends`), else its trace. Of the ranks that did not follow one, the
    earliest; else the earliest of all. A failed rank's time is when its script ended by its note, else
    its trace's end (its last record when it was killed), else when its process was seen to end."""
    if not failures:
        return None
    facts = {rank: _failure_facts(failure, rank_paths[rank] if rank < len(rank_paths) else None, (ends or {}).get(rank))
             for rank, failure in failures.items()}
    causes = [rank for rank, fact in facts.items() if not fact.followed] or list(facts)
    rank = min(causes, key=lambda candidate: (facts[candidate].when, candidate))
    fact = facts[rank]
    # A rank whose script ended cleanly but was stopped while exiting left its peers waiting on it; the
    # launcher's status is then that of the earliest rank whose script did fail.
    failed_statuses = [facts[other].exit_status for other in sorted(facts, key=lambda other: (facts[other].when, other)) if facts[other].exit_status]
    exit_status = fact.exit_status or (failed_statuses[0] if failed_statuses else 0)
    return FirstFailure(rank, fact.reason, fact.where, exit_status, fact.then)


@dataclass(frozen=True)
class _FailureFacts:
    when: float  # seconds since the epoch
    reason: str
    followed: bool  # it failed because another rank did
    where: str | None
    exit_status: int  # its script's, when it noted it; else its process's
    then: str | None  # how its process ended, when not as its script did


def _failure_facts(failure: RankFailure, trace_path: Path | None, end: ScriptEnd | None) -> _FailureFacts:
    """What one failed rank's note, trace and exit say of its failure."""
    from tputrace.store.reader import open_trace

    when, reason, where, error, then = failure.timestamp, failure.reason, None, None, None
    exit_status = failure.exit_status
    if end is not None:
        when, error, exit_status = end.unix_ns / 1e9, end.error, end.exit_status
        if end.exit_status != failure.exit_status:
            # The script ended, then the process was stopped while exiting (its teardown outlasted a peer's failure).
            reason, then = f"its script ended with status {end.exit_status}", failure.reason
    followed = exit_status == EXIT_TERMINATED
    if trace_path is not None and trace_path.exists():
        try:
            with open_trace(trace_path) as trace:
                run = trace.run
                if end is None and run.start_unix_ns is not None:
                    when = (run.start_unix_ns + trace.wall_ns()) / 1e9
                error = error or run.error
                if not error and run.end_ns is None:
                    where = _last_op_line(trace)
                    reason = f"{reason}; its last recorded op" if where else reason
        except TputraceError:
            pass
    if error:
        reason = f"{reason}: {_exception_line(error)}"
        where = _failing_line(error)
        followed = followed or any(mark in error for mark in _PEER_FAILURE_MARKS)
    return _FailureFacts(when, reason, followed, where, exit_status, then)


def _exception_line(error: str, limit: int = 160) -> str:
    """The `Type: message` line of a formatted exception (its first line after the traceback)."""
    lines = error.strip().splitlines()
    line = next((line for line in lines if re.match(r"^[A-Za-z_][\w.]*(: |$)", line) and not line.startswith("Traceback")), lines[-1] if lines else "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _failing_line(error: str) -> str | None:
    """Where a formatted traceback failed: its innermost user frame (not an installed library's, nor tputrace's own
    such as the backend's collective that raised), else its innermost frame, as `file:line`."""
    from tputrace.analysis.memory_oom import failing_frame, traceback_frames

    frame = failing_frame(error, None)
    if frame is None:
        frames = traceback_frames(error)
        frame = frames[-1] if frames else None
    return f"{os.path.basename(frame[0])}:{frame[1]}" if frame is not None else None


def _last_op_line(trace: Any) -> str | None:
    rows = trace.sql("SELECT frame_id FROM ops WHERE frame_id IS NOT NULL ORDER BY seq DESC LIMIT 1")
    location = trace.frame(rows[0][0]) if rows else None
    return location.short if location is not None else None


def merge_rank_traces(
    rank_paths: list[Path], merged_path: Path, nproc: int, failures: Mapping[int, RankFailure], first: FirstFailure | None, show_summary: Callable[[Path], None]
) -> bool:
    """Merge the ranks' traces that exist, then print what the merge found and the merged summary."""
    from tputrace.merge import merge_traces

    existing = [path for path in rank_paths if path.exists()]
    print(file=sys.stderr)
    if not existing:
        print("tputrace: error: no rank wrote a trace", file=sys.stderr)
        return False
    reasons = {rank: failure.reason for rank, failure in failures.items()}
    try:
        result = merge_traces(existing, merged_path, expected_ranks=range(nproc), failures=reasons, first_failure=None if first is None else first.text())
    except TputraceError as error:
        print(f"tputrace: error: cannot merge the ranks' traces: {error}", file=sys.stderr)
        return False
    for line in result.lines():
        print(f"tputrace: {line}", file=sys.stderr)
    print(f"tputrace: per-rank traces in {rank_trace_dir(merged_path)}", file=sys.stderr)
    show_summary(merged_path)
    return True
