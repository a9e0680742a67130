"""Training scripts written as a user porting a GPU model would, each with a problem planted at a known line,
run under `tputrace run` in a subprocess: the report's findings are the planted problem at its line, and
no finding blames work that the loop does every step on set-up or on the warm-up step."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

from tputrace.analysis import Report

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

MARKER = "# the planted line"

GRAD_ACCUMULATION = '''
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(120, 64), torch.randint(0, 10, (120,)))
    loader = DataLoader(data, batch_size=16)  # 120 = 7 * 16 + 8: the last batch is smaller
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    running = 0.0
    for i, (x, y) in enumerate(loader):
        x, y = x.to("tpu"), y.to("tpu")
        loss = nn.functional.cross_entropy(model(x), y) / 4
        loss.backward()
        running += loss.item()  {marker}
        if (i + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()
    print(running)
'''

LOGGED_ONCE = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        x = torch.randn(16, 32, device="tpu")
        if step == 1:
            print("batch mean", x.mean().item())  {marker}
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

DDP = '''
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group()
    torch.manual_seed(dist.get_rank())
    model = DDP(nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10)).to("tpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        x = torch.randn(32, 128, device="tpu")
        y = torch.randint(0, 10, (32,), device="tpu")
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        average = loss.detach().clone()
        dist.all_reduce(average)
        if dist.get_rank() == 0:
            print(step, average.item() / dist.get_world_size())  {marker}
    dist.destroy_process_group()
'''


def _run(tmp_path: Path, name: str, source: str, run_options: tuple[str, ...] = ()) -> tuple[Report, Path, int]:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source.format(marker=MARKER)))
    line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if MARKER in text)
    return record(script, tmp_path / f"{name}.tptrace", [], run_options), script, line


def test_an_item_per_micro_batch_is_the_loops_finding_in_a_two_step_accumulation_loop(tmp_path: Path) -> None:
    """Two optimizer steps over eight micro-batches: the warm-up step counts as steady, but its first
    dispatch of every op is no host-bound step and the model's copy before the loop is no copy in the loop;
    the last, smaller batch compiles once more, which is no storm."""
    report, script, line = _run(tmp_path, "grad_accumulation", GRAD_ACCUMULATION)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs"]
    assert (sync.file, sync.line) == (str(script), line), sync.title
    assert "4 times per step" in sync.evidence[0].text
    analyzers = {finding.analyzer for finding in report.findings}
    assert "host_bound" not in analyzers and "recompiles" not in analyzers
    model_line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "model = " in text)
    assert not [f for f in report.findings if f.analyzer == "transfers" and f.line == model_line]


def test_a_loop_line_flushed_apart_in_the_second_step_is_not_set_up_work(tmp_path: Path) -> None:
    """A sync in the second step runs that step's new batch as a graph of its own, so the step's graph
    compiles without it; the batch's line runs every step, so it is not set-up left pending before the loop."""
    report, script, line = _run(tmp_path, "logged_once", LOGGED_ONCE)
    assert not [finding for finding in report.findings if finding.analyzer == "set_up_work"], report.findings[0].title
    top = report.findings[0]
    assert (top.analyzer, top.file, top.line) == ("syncs", str(script), line), top.title


def test_ddp_second_forward_is_not_set_up_work(tmp_path: Path) -> None:
    """DDP's second forward makes a collective of its own, which flushes the batch made on the chip at the
    loop's top apart from the step's graph; the report blames no set-up line for the recompile."""
    report, script, line = _run(tmp_path, "ddp", DDP, ("--nproc", "2"))
    assert not [finding for finding in report.findings if finding.analyzer == "set_up_work"], report.findings[0].title
    assert any(f.analyzer == "syncs" and (f.file, f.line) == (str(script), line) for f in report.findings)
