"""A stop request (SIGTERM to `tputrace run`) in the middle of a recorded DEFER_AND_FUSE run: the trace is
finished and holds every op of every graph that ran before the stop, with the writer's queue bound and
index budget in force. (Ops still pending in an unflushed graph at the stop never ran and are not
recorded.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tputrace

LOOP = textwrap.dedent(
    """
    import pathlib
    import torch
    import tputrace.backend  # noqa: F401

    x = torch.ones(4, device="tpu")
    dispatched = 0
    try:
        while True:
            x = x + 1
            dispatched += 1
            if dispatched % 100 == 0:
                x.sum().item()
            if dispatched == 3000:
                pathlib.Path("running").touch()
    finally:
        pathlib.Path("dispatched").write_text(str(dispatched))
    """
)


@pytest.mark.slow
def test_sigterm_mid_run_keeps_every_op_that_ran_before_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    (tmp_path / "loop.py").write_text(LOOP)
    trace_path = tmp_path / "loop.tptrace"
    run = subprocess.Popen(
        [sys.executable, "-m", "tputrace.cli.main", "run", "--mode", "defer", "-o", str(trace_path), "loop.py"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not (tmp_path / "running").exists():
            if run.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the script did not start:\n{run.communicate()[1][-4000:]}")
            time.sleep(0.1)
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 143, stderr[-4000:]
    dispatched = int((tmp_path / "dispatched").read_text())
    assert dispatched >= 3000
    with tputrace.open(trace_path) as trace:
        assert trace.run.finished and trace.run.exit_status == 143
        (adds,) = trace.sql("SELECT COUNT(*) FROM ops JOIN strings ON strings.id = ops.op_sid WHERE strings.text = 'aten.add.Tensor'")[0]
    # `item()` every 100 ops flushes the graph: every op up to the last flush ran.
    assert adds >= dispatched - dispatched % 100
