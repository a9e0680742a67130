"""SIGINT (Ctrl-C) or SIGTERM to `tputrace run --nproc 2` stops every rank cleanly: each rank finishes its
trace, the traces are merged, and the launcher exits 130 or 143 without a traceback of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tputrace
from tputrace.cli.launch import _children

LONG_SCRIPT = r'''
import time, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
import tputrace.backend  # noqa: F401

dist.init_process_group("tpu")
rank = dist.get_rank()
model = DistributedDataParallel(nn.Linear(8, 2).to("tpu"))
for step in range(100_000):
    model(torch.ones(2, 8, device="tpu")).sum().backward()
    if step == 1:
        open(f"running-{rank}", "w").close()
    time.sleep(0.05)
'''


def _start_ranks(tmp_path: Path) -> subprocess.Popen[str]:
    """`tputrace run --nproc 2 long.py -o run.tptrace`, returned once both ranks are training."""
    script = tmp_path / "long.py"
    script.write_text(LONG_SCRIPT)
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--nproc", "2", "-o", str(tmp_path / "run.tptrace"), str(script)]
    launcher = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    while not all((tmp_path / f"running-{rank}").exists() for rank in (0, 1)):
        if launcher.poll() is not None or time.monotonic() > deadline:
            _stop_all(launcher)
            pytest.fail(f"the ranks did not start:\n{launcher.communicate()[1][-4000:]}")
        time.sleep(0.2)
    return launcher


def _stop_all(launcher: subprocess.Popen[str]) -> None:
    """Kill whatever a test left running: the launcher's session, and the ranks' own sessions."""
    for pid in _children(launcher.pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if launcher.poll() is None:
        os.killpg(launcher.pid, signal.SIGKILL)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_to_the_launcher_stops_every_rank_and_merges_their_traces(tmp_path: Path, stop: signal.Signals) -> None:
    launcher = _start_ranks(tmp_path)
    try:
        launcher.send_signal(stop)  # to the launcher alone, as `kill` sends it
        _, stderr = launcher.communicate(timeout=300)
    finally:
        _stop_all(launcher)
    assert launcher.returncode == 128 + stop, stderr[-4000:]
    assert "SignalException" not in stderr and f"tputrace: stopped by {stop.name}; every rank was stopped" in stderr
    for rank in (0, 1):
        with tputrace.open(tmp_path / "run.ranks" / f"rank{rank}.tptrace") as trace:
            run = trace.run
            # A rank ends on the signal, or on the SIGTERM the agent sends once another rank has ended.
            assert run.finished and run.exit_status in (128 + stop, 128 + signal.SIGTERM), (rank, run.exit_status, run.error)
            assert trace.count("collectives") > 0
    with tputrace.open(tmp_path / "run.tptrace") as trace:
        merge = json.loads(trace.meta["merge"])
        assert sorted(run.rank for run in trace.runs) == [0, 1] and all(run.finished for run in trace.runs)
    assert merge["died_ranks"] == {} and merge["missing_ranks"] == {} and "first_failure" not in merge


def test_ranks_finish_their_traces_when_the_launcher_is_killed(tmp_path: Path) -> None:
    """SIGKILL to the launcher cannot be handled by it: Linux sends each rank SIGTERM (the parent-death
    signal each rank asked for), and each finishes its trace."""
    launcher = _start_ranks(tmp_path)
    try:
        ranks = _children(launcher.pid)
        launcher.send_signal(signal.SIGKILL)
        launcher.communicate(timeout=60)
        deadline = time.monotonic() + 300
        while any(Path(f"/proc/{pid}").exists() and _state(pid) != "Z" for pid in ranks):
            assert time.monotonic() < deadline, "the ranks outlived their launcher"
            time.sleep(0.2)
    finally:
        _stop_all(launcher)
    for rank in (0, 1):
        with tputrace.open(tmp_path / "run.ranks" / f"rank{rank}.tptrace") as trace:
            run = trace.run
            assert run.finished and run.exit_status == 128 + signal.SIGTERM, (rank, run.exit_status, run.error)


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "Z"
    return stat[stat.rfind(")") + 2 :].split()[0]
