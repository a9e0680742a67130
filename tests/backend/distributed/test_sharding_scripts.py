"""Sharding diagnosis on the scripts in `sharding_scripts/` (test data unlike the examples: other plans,
models and meshes), each run once with `tputrace run --nproc N` on 2 or 4 ranks, strict or
DEFER_AND_FUSE: the top finding of `tputrace report --json` names the marked line and the fix, and no
finding shows a share above 100%."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = Path(__file__).resolve().parent / "sharding_scripts"


def _line(script: str, marker: str) -> int:
    text = (SCRIPTS / script).read_text()
    return next(number for number, line in enumerate(text.splitlines(), 1) if line.rstrip().endswith(f"# {marker}"))


def _report(tmp_path: Path, script: str, ranks: int, *args: str) -> dict[str, Any]:
    trace = tmp_path / f"{script}.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--nproc", str(ranks), "-o", str(trace), str(SCRIPTS / script), *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                               env=dict(os.environ, PYTHONWARNINGS="ignore"), start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        pytest.fail(f"{script} did not finish:\n{stderr[-4000:]}")
    assert process.returncode == 0, stderr[-6000:]
    report = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "report", "--json", str(trace)], capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    result: dict[str, Any] = json.loads(report.stdout)
    texts = " ".join(f"{finding['title']} {finding['explanation']}" for finding in result["findings"])
    shares = [float(value) for value in re.findall(r"(\d+(?:\.\d+)?)% of (?:each|a) step", texts)]
    assert all(share <= 100 for share in shares), shares
    return result


def _top(report: dict[str, Any], script: str, marker: str) -> dict[str, Any]:
    top: dict[str, Any] = report["findings"][0]
    assert top["analyzer"] == "sharding", [finding["title"] for finding in report["findings"][:4]]
    assert Path(top["file"]).name == script and top["line"] == _line(script, marker), (top["file"], top["line"], top["title"])
    return top


def test_a_round_trip_is_named_at_the_gather_with_the_split_line_on_two_strict_ranks(tmp_path: Path) -> None:
    report = _report(tmp_path, "round_trip.py", 2)
    top = _top(report, "round_trip.py", "GATHER")
    assert top["title"].startswith("Round trip") and "Shard(0)" in top["title"]
    # the replicated weight's gradient summed over the ranks' batches at the optimizer step is data parallelism, no finding
    assert not [finding["title"] for finding in report["findings"] if finding["title"].startswith("The optimizer step moves")]
    assert f"round_trip.py:{_line('round_trip.py', 'SPLIT')}" in top["suggestion"] and "Keep it Shard(0)" in top["suggestion"]
    assert top["cost_total_ns"] > 0


def test_partial_sums_reduced_by_two_ops_are_named_at_the_second_on_four_fused_ranks(tmp_path: Path) -> None:
    report = _report(tmp_path, "reduce_twice.py", 4, "--fuse")
    top = _top(report, "reduce_twice.py", "TWICE")
    assert "again" in top["title"] and "tanh" in top["title"]
    assert "redistribute(mesh, [Replicate()])" in top["suggestion"]
    # the first reduction is part of this finding, not an op redistribution of its own
    assert not any(finding["title"].startswith("aten.sigmoid") for finding in report["findings"])


def test_an_all_reduce_of_a_reduced_output_and_a_head_left_out_of_the_plan_on_two_fused_ranks(tmp_path: Path) -> None:
    report = _report(tmp_path, "tp_block.py", 2, "--fuse")
    top = _top(report, "tp_block.py", "AGAIN")
    assert "already reduced" in top["title"] and "Remove the all_reduce" in top["suggestion"]
    unplanned = [finding for finding in report["findings"] if finding["analyzer"] == "sharding" and "replicated next to sharded" in finding["title"]]
    assert unplanned, [finding["title"] for finding in report["findings"]]
    assert "Block.head" in unplanned[0]["title"] and unplanned[0]["module"] == "Block.head"
    assert unplanned[0]["line"] == _line("tp_block.py", "PLAN") and '"head": ColwiseParallel' in unplanned[0]["suggestion"]
    assert "260 KiB per rank" in unplanned[0]["explanation"]  # 64x1024 weight and 1024 bias, float32, whole on each rank


def test_a_softmax_over_a_column_parallel_output_names_the_op_and_the_plan_entry_on_four_strict_ranks(tmp_path: Path) -> None:
    report = _report(tmp_path, "sharded_softmax.py", 4)
    top = _top(report, "sharded_softmax.py", "SOFTMAX")
    assert "softmax" in top["title"] and "all_gather" in top["title"]
    assert "plan entry for score" in top["suggestion"] and f"sharded_softmax.py:{_line('sharded_softmax.py', 'PLAN')}" in top["suggestion"]
    assert "Shard(0)" in top["suggestion"]


@pytest.mark.parametrize("example", ["ddp_train.py", "fsdp_train.py", "tp_train.py"])
def test_the_clean_distributed_examples_have_no_sharding_warning(tmp_path: Path, example: str) -> None:
    trace = tmp_path / f"{example}.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--nproc", "2", "-o", str(trace), str(ROOT / "examples" / example), "--steps", "6"]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=900)
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "report", "--json", str(trace)], capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    findings = json.loads(report.stdout)["findings"]
    assert not [finding["title"] for finding in findings if finding["analyzer"] == "sharding" and finding["severity"] != "info"]
