"""A rank that fails under `tputrace run --nproc 2` with DDP (raises, or is killed with SIGKILL) does not
crash the other: the survivor's collective raises a Python error (as c10d's own backends raise), its
trace is finished, and the launcher and the merged trace name the rank that failed first and where.
Without a trace too: each rank notes how its script ended, so which process exited first does not decide.

Before, the survivor died of SIGSEGV in DDP's backward: `Future.set_exception` completed the bucket's
C++ future with the exception as its value, and DDP's reducer read it as the bucket's tensors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tputrace

FAILING_STEP = 3
DDP_SCRIPT = r'''
import atexit, datetime, os, signal, sys, time
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
import tputrace.backend  # noqa: F401

how = sys.argv[1]
dist.init_process_group("tpu")
rank = dist.get_rank()
slow_exit = how == "raise-slow-exit"
if slow_exit and rank == 1:
    atexit.register(time.sleep, 600)  # a slow teardown: its peer times out and exits first, then the launcher stops it
if rank == 0:
    # The launcher stops the other ranks (SIGTERM) once rank 1 has failed: rank 0 ignores it, so that
    # what ends it is the collective's own error, whenever the signal comes.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
torch.manual_seed(0)
group = dist.new_group(timeout=datetime.timedelta(seconds=20)) if slow_exit else None
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to("tpu"), process_group=group)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = model(torch.randn(4, 8).to("tpu")).sum()
    if step == FAILING_STEP and rank == 1:
        if how.startswith("raise"):
            raise RuntimeError("rank 1 gives up")  # MARK: the raise
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        loss.backward()
    except RuntimeError as error:
        open(f"survivor-error-{rank}", "w").write(f"{type(error).__name__}: {error}")
        raise
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
'''.replace("FAILING_STEP", str(FAILING_STEP))


def _raise_line() -> int:
    return next(number for number, line in enumerate(DDP_SCRIPT.splitlines(), 1) if "MARK: the raise" in line)


def _run_ranks(tmp_path: Path, how: str, *options: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "ddp_fail.py"
    script.write_text(DDP_SCRIPT)
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--nproc", "2", *options, str(script), how]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"tputrace run --nproc 2 did not finish:\n{stderr[-4000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.parametrize(("how", "exit_status", "first"), [
    ("raise", 1, f"rank 1 failed first (exited with status 1: RuntimeError: rank 1 gives up at ddp_fail.py:{_raise_line()})"),
    ("kill", 128 + signal.SIGKILL, "rank 1 failed first (killed by SIGKILL (signal 9)"),
])
def test_a_failed_rank_leaves_the_survivor_a_python_error_and_a_finished_trace(tmp_path: Path, how: str, exit_status: int, first: str) -> None:
    merged = tmp_path / "run.tptrace"
    result = _run_ranks(tmp_path, how, "-o", str(merged))
    assert "Segmentation fault" not in result.stderr and "SIGSEGV" not in result.stderr, result.stderr[-4000:]
    assert result.returncode == exit_status, result.stderr[-4000:]
    survivor_error = (tmp_path / "survivor-error-0").read_text()  # caught as a RuntimeError
    assert survivor_error.startswith("CollectiveError: all_reduce on the tpu process group failed: ") and "\n" not in survivor_error
    assert f"tputrace: {first}" in result.stderr
    with tputrace.open(tmp_path / "run.ranks" / "rank0.tptrace") as trace:
        survivor = trace.run
    assert survivor.finished and survivor.exit_status == 1
    assert "all_reduce on the tpu process group failed" in (survivor.error or "")
    with tputrace.open(merged) as trace:
        merge = json.loads(trace.meta["merge"])
        runs = {run.rank: run for run in trace.runs}
    assert merge["first_failure"].startswith(first)
    assert runs[0].finished
    if how == "kill":
        assert not runs[1].finished and "killed by SIGKILL" in (runs[1].error or "")
    else:
        assert runs[1].exit_status == 1 and "rank 1 gives up" in (runs[1].error or "")


def test_a_failed_rank_does_not_crash_the_other_without_a_trace(tmp_path: Path) -> None:
    result = _run_ranks(tmp_path, "raise", "--no-trace")
    assert "Segmentation fault" not in result.stderr and result.returncode == 1, result.stderr[-4000:]
    assert "all_reduce on the tpu process group failed" in (tmp_path / "survivor-error-0").read_text()
    assert f"tputrace: rank 1 failed first (exited with status 1: RuntimeError: rank 1 gives up at ddp_fail.py:{_raise_line()})" in result.stderr
    assert not list(tmp_path.glob("*.tptrace"))


@pytest.mark.parametrize("trace_options", [["--no-trace"], ["-o", "run.tptrace"]], ids=["no-trace", "trace"])
def test_the_rank_that_raised_is_named_first_though_the_survivor_exits_before_it(tmp_path: Path, trace_options: list[str]) -> None:
    """Rank 1 raises, then takes long to exit: rank 0's collective times out and rank 0 exits first, and
    the launcher stops rank 1 (SIGTERM) in its teardown. Rank 1 still failed first: its script ended
    with its own error, rank 0's with a peer's."""
    result = _run_ranks(tmp_path, "raise-slow-exit", *trace_options)
    assert result.returncode == 1, result.stderr[-4000:]
    assert "all_reduce on the tpu process group failed" in (tmp_path / "survivor-error-0").read_text()
    assert (f"tputrace: rank 1 failed first (its script ended with status 1: RuntimeError: rank 1 gives up at ddp_fail.py:{_raise_line()}; "
            "then it was killed by SIGTERM (signal 15))") in result.stderr, result.stderr[-4000:]
