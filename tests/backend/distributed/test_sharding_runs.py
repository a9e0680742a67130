"""Sharding diagnosis on real ranks: small scripts written here (not the examples), each with a planted
sharding mistake, run with `tputrace run --nproc 2`; `tputrace report --json` must put the finding that
names the line to change and the fix first, and no finding may show a share above 100%.

Each script runs once per module (the runs are slow on shared cores) and every assertion reads that run.
"""

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

TENSOR_PARALLEL = '''
import torch, torch.distributed as dist
from torch import nn
import tputrace.backend  # noqa: F401
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.expand = nn.Linear(48, 192)
        self.project = nn.Linear(192, 48)

    def forward(self, x):
        return self.project(torch.tanh(self.expand(x)))


dist.init_process_group("tpu")
mesh = init_device_mesh("tpu", (2,))
model = Gate().to("tpu")
plan = {
    "expand": ColwiseParallel(output_layouts=Replicate()),  # PLAN-FIRST
    "project": ColwiseParallel(output_layouts=Replicate()),  # PLAN-SECOND
}
parallelize_module(model, mesh, plan)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    loss = model(torch.randn(6, 48, device="tpu")).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(loss.item())
dist.destroy_process_group()
'''

DATA_PARALLEL = '''
import torch, torch.distributed as dist
from torch import nn
import tputrace.backend  # noqa: F401

dist.init_process_group("tpu")
torch.manual_seed(0)
net = nn.Sequential(*[nn.Sequential(nn.Linear(112, 112), nn.Tanh()) for _ in range(7)], nn.Linear(112, 4)).to("tpu")
wrapped = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.04)  # DDP-LINE
optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01)
for _ in range(5):
    loss = wrapped(torch.randn(12, 112, device="tpu")).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(loss.item())
dist.destroy_process_group()
'''


def _marked(source: str, marker: str) -> int:
    return next(number for number, text in enumerate(source.splitlines(), 1) if marker in text)


def _run(tmp_path: Path, name: str, source: str) -> tuple[dict[str, Any], Path]:
    """Run `source` on 2 ranks and return `tputrace report --json` of its trace, with the script's path."""
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    trace = tmp_path / f"{name}.tptrace"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--nproc", "2", "-o", str(trace), str(script)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        pytest.fail(f"{name} did not finish:\n{stderr[-4000:]}")
    assert process.returncode == 0, stderr[-6000:]
    report = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "report", "--json", str(trace)], capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    return json.loads(report.stdout), script


@pytest.fixture(scope="module")
def tensor_parallel(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    return _run(tmp_path_factory.mktemp("tp"), "gate_tp", TENSOR_PARALLEL)


@pytest.fixture(scope="module")
def data_parallel(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    return _run(tmp_path_factory.mktemp("ddp"), "tiny_buckets", DATA_PARALLEL)


def _shares(report: dict[str, Any]) -> list[float]:
    """Every percentage a finding's title or explanation shows as a share of a step or of the run."""
    texts = " ".join(f"{finding['title']} {finding['explanation']}" for finding in report["findings"])
    return [float(value) for value in re.findall(r"(\d+(?:\.\d+)?)% of (?:each|a) step", texts)]


def test_the_top_finding_of_a_column_column_plan_names_the_plan_entry_and_the_rowwise_fix(tensor_parallel: tuple[dict[str, Any], Path]) -> None:
    report, script = tensor_parallel
    top = report["findings"][0]
    assert top["analyzer"] == "sharding", top["title"]
    assert Path(top["file"]).name == script.name and top["line"] == _marked(TENSOR_PARALLEL, "PLAN-FIRST")
    assert "RowwiseParallel()" in top["suggestion"] and "project" in top["suggestion"]
    assert top["module"].endswith("expand")


def test_tensor_parallel_causes_and_placements_are_in_the_trace(tensor_parallel: tuple[dict[str, Any], Path]) -> None:
    report, _ = tensor_parallel
    data = report["results"]["sharding"]
    assert data["parameters"] == 4  # expand and project, weight and bias
    causes = {(row["kind"], row["op"], row["phase"]) for row in data["by_cause"]}
    assert ("redistribute", "ColwiseParallel output_layouts", "forward") in causes
    assert any(phase == "backward" for _, _, phase in causes)


def test_no_share_above_a_whole_step(tensor_parallel: tuple[dict[str, Any], Path], data_parallel: tuple[dict[str, Any], Path]) -> None:
    for report, _ in (tensor_parallel, data_parallel):
        assert all(share <= 100 for share in _shares(report)), _shares(report)
        assert report["results"]["collectives"]["collective_share_of_step"] <= 1.0


def test_tiny_ddp_buckets_are_named_at_the_constructor_with_a_size(data_parallel: tuple[dict[str, Any], Path]) -> None:
    report, script = data_parallel
    findings = [finding for finding in report["findings"] if finding["analyzer"] == "sharding" and "DDP buckets" in finding["title"]]
    assert findings, [finding["title"] for finding in report["findings"]]
    buckets = findings[0]
    assert Path(buckets["file"]).name == script.name and buckets["line"] == _marked(DATA_PARALLEL, "DDP-LINE")
    assert re.search(r"bucket_cap_mb=\d+", buckets["suggestion"])
    # each bucket with its size and parameters: the first reduced holds the last layer's gradients
    listed = [item["text"] for item in buckets["evidence"] if item["text"].startswith("bucket ")]
    assert listed and listed[0].startswith("bucket 0: ") and "module.7.weight" in listed[0], listed
    communication = [finding for finding in report["findings"] if finding["analyzer"] in ("sharding", "collectives")]
    assert communication[0] is buckets  # the first finding about communication is the one with the fix


def test_waits_between_virtual_chips_of_one_host_are_not_called_a_straggler(data_parallel: tuple[dict[str, Any], Path]) -> None:
    report, _ = data_parallel
    for finding in report["findings"]:
        if finding["analyzer"] == "collectives" and "wait" in finding["title"]:
            assert finding["severity"] == "info" and "cannot be told" in finding["title"]
