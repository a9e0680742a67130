"""Distributed scripts of kinds the other fresh-distributed files do not cover, run under `tputrace run --nproc N`: ranks
given several chips each with `--chips`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_fresh_distributed import HEADER

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

# Each rank's process has two chips: it sums on its second chip and all-reduces the sum.
TWO_CHIPS_A_RANK = HEADER + '''
    assert torch.tpu.device_count() == 2
    total = torch.ones(8, device="tpu:1")
    for step in range(2):
        dist.all_reduce(total)
    print(rank, total.sum().item())
    dist.destroy_process_group()
'''


def test_ranks_given_two_chips_each_are_said_to_have_two_chips_per_rank(tmp_path: Path) -> None:
    script = tmp_path / "two_chips_a_rank.py"
    script.write_text(textwrap.dedent(TWO_CHIPS_A_RANK))
    trace = tmp_path / "two_chips_a_rank.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--nproc", "2", "--chips", "2", "--quiet", "-o", str(trace), str(script)]
    process = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                             env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert process.returncode == 0, process.stderr[-4000:]
    summary = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "summary", str(trace)], capture_output=True,
                             text=True, timeout=120)
    first = summary.stdout.splitlines()[0]
    assert "rank 0 of 2 · cpu, 2 chips per rank (4 in all), " in first, first
