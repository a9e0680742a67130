"""Strict mode's op times hold the chip's work (XLA:CPU runs small programs on the calling thread, behind the earlier
ones): the host-bound model counts only the ops' dispatch as host time and the rest as the chip's, and the padding
finding weighs its products' share of that chip time as in DeferAndFuse, where executions are measured."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

import tputrace

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

OFF_TILE_MLP = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 600), nn.ReLU(), nn.Linear(600, 300)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(512, 300, device="tpu")
    for step in range(5):
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''


def _op_time_by_step(trace_path: Path) -> dict[int, int]:
    with tputrace.open(trace_path) as trace:
        return {step: int(total) for step, total in trace.sql(
            "SELECT step, SUM(dur_ns) FROM ops WHERE rank = 0 GROUP BY step")}


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_strict_op_times_are_split_into_dispatch_and_the_chips_work(mode: str, tmp_path: Path) -> None:
    """In strict mode every step's recorded op time is split into dispatch and the chip's work, and the product off
    the MXU's tiles is a padding finding whose chip time is that work; in DeferAndFuse the ops' time is all
    dispatch and the chip time is the executions'."""
    script = tmp_path / "off_tile_mlp.py"
    script.write_text(textwrap.dedent(OFF_TILE_MLP))
    trace_path = tmp_path / f"{mode}.tptrace"
    report = record(script, trace_path, [], ("--mode", mode))
    op_time = _op_time_by_step(trace_path)
    host = report.results["host_bound"].data
    assert host.steps, host
    for step in host.steps:
        if mode == "strict":
            assert step.waited_ns > 0 and step.dispatch_ns + step.waited_ns == op_time[step.step], step
        else:
            assert step.waited_ns == 0 and step.dispatch_ns == op_time[step.step], step
    padding = report.results["padding"].data
    inferred = padding.chip_time.startswith("the chip's work inside strict mode's op times")
    assert inferred == (mode == "strict"), padding.chip_time
    (finding,) = [finding for finding in report.findings if finding.analyzer == "padding" and " 300 " in finding.title]
    assert ("strict mode's op times" in finding.explanation) == (mode == "strict"), finding.explanation
