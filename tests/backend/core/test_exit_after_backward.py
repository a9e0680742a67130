"""A script whose last line is a backward pass exits cleanly: the exit waits until autograd's worker
thread has released the pass's state, whose Python context it would otherwise release while the
interpreter finalizes (an abort: "terminate called without an active exception")."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tputrace.backend  # noqa: F401 - registers the tpu device
from tputrace.backend.core import exit_wait

REPO_ROOT = Path(__file__).resolve().parents[3]
# The switch interval keeps the GIL on the main thread from the backward's return to the exit, so
# the worker's release of the pass's state, which needs the GIL, waits until then.
ENDS_WITH_A_BACKWARD = """
    import sys
    import torch
    import tputrace.backend

    torch.tpu.set_eager_mode(sys.argv[1])
    model = torch.nn.Linear(8, 3).to("tpu")
    model(torch.randn(5, 8, device="tpu")).sum().backward()
    sys.setswitchinterval(1000.0)
    model(torch.randn(5, 8, device="tpu")).sum().backward()
"""


def test_the_wait_returns_once_the_worker_released_each_backward() -> None:
    model = torch.nn.Linear(4, 2).to("tpu")
    for _ in range(3):
        model(torch.randn(3, 4, device="tpu")).sum().backward()
    assert exit_wait.wait_for_autograd_worker(timeout_s=30.0)
    assert len(exit_wait._backward_contexts) == 0


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_a_script_ending_with_a_backward_exits_cleanly(mode: str) -> None:
    code = textwrap.dedent(ENDS_WITH_A_BACKWARD)
    runs = [
        subprocess.Popen([sys.executable, "-c", code, mode], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=600)
        assert run.returncode == 0, stderr[-2000:]
        assert "terminate called" not in stderr
