"""`tputrace diff` on real runs: fused programs matched across runs by their flush's line, and every rank of
a distributed run compared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="recording needs torch (pip install -e .[backend])")

FUSED_LOOP = """import torch
import tputrace

x = torch.ones(8, 8, device="tpu")
for _ in range(4):
    y = x * 2{extra}
    print(float(y.sum()))
    tputrace.step()
"""

RANK_LOOP = """import os
import torch
import tputrace

rank = int(os.environ.get("RANK", "0"))
sizes = {sizes}
for step in range(4):
    size = sizes[step] if rank == 1 else 4
    x = torch.ones(size, device="tpu")
    (x * 2).sum()
    tputrace.step()
"""


def _tputrace(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tputrace.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def _record(cwd: Path, script: str, name: str, *run_args: str) -> None:
    (cwd / "run.py").write_text(script)
    result = _tputrace(cwd, "run", "--quiet", *run_args, "-o", name, "--force", "run.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_diff_names_the_fused_program_whose_ops_changed(tmp_path: Path) -> None:
    _record(tmp_path, FUSED_LOOP.format(extra=""), "before.tptrace", "--mode", "defer")
    _record(tmp_path, FUSED_LOOP.format(extra=" + 1"), "after.tptrace", "--mode", "defer")
    result = _tputrace(tmp_path, "diff", "before.tptrace", "after.tptrace", "--json")
    assert result.returncode == 0, result.stderr
    programs = json.loads(result.stdout)["programs"]
    changed = [program for program in programs if program["status"] == "changed"]
    assert len(changed) == 1, programs
    assert changed[0]["site"] == f"{tmp_path / 'run.py'}:7"
    assert "+add" in changed[0]["detail"]
    assert not [program for program in programs if program["status"] in ("new", "gone")]


def test_diff_of_the_same_script_matches_every_program(tmp_path: Path) -> None:
    _record(tmp_path, FUSED_LOOP.format(extra=""), "a.tptrace", "--mode", "defer")
    _record(tmp_path, FUSED_LOOP.format(extra=""), "b.tptrace", "--mode", "defer")
    result = _tputrace(tmp_path, "diff", "a.tptrace", "b.tptrace", "--json")
    assert json.loads(result.stdout)["programs"] == []


def test_diff_compares_every_rank_and_leads_with_the_one_that_regressed(tmp_path: Path) -> None:
    _record(tmp_path, RANK_LOOP.format(sizes="(4, 4, 4, 4)"), "before.tptrace", "--mode", "strict", "--nproc", "2")
    _record(tmp_path, RANK_LOOP.format(sizes="(4, 4, 8, 8)"), "after.tptrace", "--mode", "strict", "--nproc", "2")
    result = _tputrace(tmp_path, "diff", "before.tptrace", "after.tptrace")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"rank 1: regression: new recompile at {tmp_path / 'run.py'}:9")
    assert any(line.startswith("  rank 0: ") and line.endswith("no regression") for line in lines)
    assert "rank 1 in detail (--rank N for another):" in lines
    one_rank = _tputrace(tmp_path, "diff", "before.tptrace", "after.tptrace", "--rank", "0", "--json")
    assert json.loads(one_rank.stdout)["headline"] == "no regression"
