"""Distributed scripts under `tputrace run --nproc 2` whose collectives were read wrong: an asynchronous call whose
Work is dropped (never waited), a tensor-parallel layer's differentiable all-reduce in the forward pass, and
asynchronous calls in flight together while a rank waits for a late one."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_fresh_distributed import HEADER, _report, _run

import tputrace
from tputrace.summary import sections, summarize

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

# Four lines of asynchronous calls a step: one whose Work is dropped (planted), one waited before its tensor is read,
# one polled until done, and one waited only in the next step; and a synchronous call.
ASYNC_CALLS = HEADER + '''
    model = nn.Linear(16, 16).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    metrics = torch.zeros(4, device="tpu")
    pending = None
    for step in range(4):
        loss = model(torch.randn(8, 16, device="tpu")).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(torch.ones(3, device="tpu"), async_op=True)  {marker}
        counts = torch.ones(5, device="tpu")
        work = dist.all_reduce(counts, async_op=True)  # waited
        other = model.weight.sum()
        work.wait()
        polled = dist.all_reduce(torch.ones(6, device="tpu"), async_op=True)  # polled
        while not polled.is_completed():
            pass
        if pending is not None:
            pending.wait()
        metrics += loss.detach()
        pending = dist.all_reduce(metrics, async_op=True)  # next step
        dist.all_reduce(counts)  # synchronous
    pending.wait()
    dist.destroy_process_group()
'''

# A tensor-parallel block: each rank holds half of a row-parallel layer's input features and reduces its partial
# product with the differentiable all-reduce, whose backward reduces the gradient in turn.
ROW_PARALLEL = HEADER + '''
    import torch.distributed.nn.functional as distributed_functional

    class RowParallel(nn.Module):
        def __init__(self, features):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(features, features // world, device="tpu") * 0.02)

        def forward(self, x):
            return distributed_functional.all_reduce(x.chunk(world, dim=-1)[rank] @ self.weight.t())  {marker}

    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64).to("tpu"), RowParallel(64)) for _ in range(6)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        loss = model(torch.randn(4, 64, device="tpu")).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
'''

# Rank 0 arrives late to eight calls that rank 1 has in flight together each step.
LATE_TO_MANY = HEADER + '''
    import time
    tensors = [torch.ones(1000 * (index + 1), device="tpu") for index in range(8)]
    for step in range(3):
        if rank == 0:
            time.sleep(0.3)
        works = [dist.all_reduce(tensor, async_op=True) for tensor in tensors]  {marker}
        for work in works:
            work.wait()
    dist.destroy_process_group()
'''

# The advice for gradient reductions (DDP's buckets, accumulation, flattening the gradients of a loop over parameters).
GRADIENT_ADVICE = ("bucket_cap_mb", "with `no_sync`", "DDP buckets overlap", "wrap the model in DistributedDataParallel", "larger DDP buckets")


def _line_of(script: Path, text: str) -> int:
    return next(number for number, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def test_an_asynchronous_call_never_waited_is_named_at_its_line_and_waited_calls_are_not(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "unwaited", ASYNC_CALLS)
    report = _report(trace)
    unwaited = [finding for finding in report.findings if "before it arrives" in finding.title]
    by_line = {finding.line: finding for finding in unwaited}
    assert set(by_line) == {line, _line_of(script, "# next step")}, [finding.title for finding in report.findings]
    dropped = by_line[line]
    assert dropped.severity == "warning" and "never waited on" in dropped.title and "work.wait()" in dropped.suggestion
    assert dropped.file is not None and Path(dropped.file).name == script.name
    late = by_line[_line_of(script, "# next step")]
    assert late.severity == "info" and "after the step" in late.explanation


def test_a_forward_tensor_parallel_all_reduce_gets_sharding_advice_not_gradient_advice(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "row_parallel", ROW_PARALLEL)
    report = _report(trace)
    collectives = [finding for finding in report.findings if finding.analyzer == "collectives"]
    if not collectives:
        # A loaded host stretches the ranks' other work until the calls' share of the steps falls below the
        # finding's threshold: the host's doing, not the advice's; the script runs once more.
        again = tmp_path / "again"
        again.mkdir()
        script, trace, line = _run(again, "row_parallel", ROW_PARALLEL)
        report = _report(trace)
        collectives = [finding for finding in report.findings if finding.analyzer == "collectives"]
    assert collectives, [finding.title for finding in report.findings]
    at_line = [finding for finding in collectives if finding.line == line]
    assert at_line and "forward pass" in at_line[0].suggestion and "RowwiseParallel" in at_line[0].suggestion
    cut = [finding for finding in report.findings if finding.title.startswith("Fragmented fusion")]
    for finding in collectives + cut:
        assert not [advice for advice in GRADIENT_ADVICE if advice in finding.suggestion], (finding.title, finding.suggestion)


def test_the_summary_counts_waits_in_flight_together_once(tmp_path: Path) -> None:
    _, trace, _ = _run(tmp_path, "late_to_many", LATE_TO_MANY)
    with tputrace.open(trace) as opened:
        summary = summarize(opened, rank=1)
    wall_ns = next(line.wall_ns for line in summary.rank_lines if line.rank == 1)
    (stat,) = summary.collectives
    assert stat.count == 24 and 0 < stat.wait_ns <= stat.total_ns <= wall_ns
    section = next(section for section in sections(summary) if section.title.startswith("collectives"))
    assert section.columns[-1] == "waiting for last rank" and "waiting for the last rank" in section.title
    # the straggler finding's waits count them once too
    waits = {wait.rank: wait for wait in _report(trace).results["collectives"].data.wait_by_rank}
    assert 0 < waits[1].wait_ns <= waits[1].dur_ns <= wall_ns
