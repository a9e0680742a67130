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


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_to_the_launcher_stops_every_rank_and_merges_their_traces(tmp_path: Path, stop: signal.Signals) -> None:
    script = tmp_path / "long.py"
    script.write_text(LONG_SCRIPT)
    merged = tmp_path / "run.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--nproc", "2", "-o", str(merged), str(script)]
    launcher = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not all((tmp_path / f"running-{rank}").exists() for rank in (0, 1)):
            assert launcher.poll() is None, launcher.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.2)
        launcher.send_signal(stop)  # to the launcher alone, as `kill` sends it
        _, stderr = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
    assert launcher.returncode == 128 + stop, stderr[-4000:]
    assert "SignalException" not in stderr and f"tputrace: stopped by {stop.name}; every rank was stopped" in stderr
    for rank in (0, 1):
        with tputrace.open(tmp_path / "run.ranks" / f"rank{rank}.tptrace") as trace:
            run = trace.run
            assert run.finished and run.exit_status == 128 + stop, (rank, run.exit_status, run.error)
            assert trace.count("collectives") > 0
    with tputrace.open(merged) as trace:
        merge = json.loads(trace.meta["merge"])
        assert sorted(run.rank for run in trace.runs) == [0, 1] and all(run.finished for run in trace.runs)
    assert merge["died_ranks"] == {} and merge["missing_ranks"] == {} and "first_failure" not in merge
