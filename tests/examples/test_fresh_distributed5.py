"""Distributed scripts of kinds the other fresh-distributed files do not cover, run under `tputrace run --nproc N`: ranks
given several chips each with `--chips`, DDP asked for an option the backend refuses, gradients all-reduced with
`async_op=True` and waited for later, an optimizer sharded by hand (ZeRO: reduce_scatter_tensor, then
all_gather_into_tensor, no optimizer step), and SyncBatchNorm inside DDP."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_fresh_distributed import HEADER, _report, _run

import tputrace
from tputrace.summary import summarize
from tputrace.wording import format_ns

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

# Each gradient's all-reduce is started asynchronously and all are waited for after the last: the calls overlap, each
# one's duration holding its wait behind those before it.
ASYNC_GRADIENTS = HEADER + '''
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(4):
        loss = model(torch.randn(16, 32, device="tpu")).square().mean()
        optimizer.zero_grad()
        loss.backward()
        works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]  {marker}
        for work in works:
            work.wait()
        optimizer.step()
    dist.destroy_process_group()
'''

# ZeRO by hand: the gradients flattened into one buffer, reduce-scattered, each rank's shard updated, the parameters
# gathered back; one call of each a step, and no optimizer, so the run has no steps.
SHARDED_BY_HAND = HEADER + '''
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to("tpu")
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    padded = (total + world - 1) // world * world
    shard = padded // world
    master = torch.cat([p.detach().reshape(-1) for p in params] + [torch.zeros(padded - total, device="tpu")])[rank * shard:(rank + 1) * shard].clone()
    for step in range(5):
        loss = model(torch.randn(16, 32, device="tpu")).square().mean()
        for p in params:
            p.grad = None
        loss.backward()
        grads = torch.cat([p.grad.reshape(-1) for p in params] + [torch.zeros(padded - total, device="tpu")])
        grad_shard = torch.empty(shard, device="tpu")
        dist.reduce_scatter_tensor(grad_shard, grads, op=dist.ReduceOp.AVG)  {marker}
        master.add_(grad_shard, alpha=-0.01)
        full = torch.empty(padded, device="tpu")
        dist.all_gather_into_tensor(full, master)
        with torch.no_grad():
            for p, value in zip(params, torch._utils._unflatten_dense_tensors(full[:total], params)):
                p.copy_(value)
    dist.destroy_process_group()
'''

# DDP over a model converted to SyncBatchNorm (each layer all-gathers its statistics in the forward and all-reduces its
# gradient sums in the backward; DDP broadcasts its buffers, equal on every rank already, in each forward), and the loss read, made into a tensor on the chip again and all-reduced for logging.
SYNC_BATCH_NORM = HEADER + '''
    from torch.nn.parallel import DistributedDataParallel
    layers = [nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4)]
    model = DistributedDataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(*layers)).to("tpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        x, y = torch.randn(16, 32, device="tpu"), torch.randint(0, 4, (16,), device="tpu")
        loss = nn.functional.cross_entropy(model(x), y)  {marker}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        logged = torch.tensor([loss.item()], device="tpu")
        dist.all_reduce(logged)
    dist.destroy_process_group()
'''

# DDP asked to find unused parameters, an option the tpu backend refuses in the constructor, before any op.
UNUSED_PARAMETERS = HEADER + '''
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(nn.Linear(32, 4).to("tpu"), find_unused_parameters=True)  {marker}
    dist.destroy_process_group()
'''


def test_ranks_given_two_chips_each_say_so_and_a_ddp_option_the_backend_refuses_is_told_to_follow_its_refusal(tmp_path: Path) -> None:
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

    # a run that raised in set-up, on the backend's refusal of a DDP option: the refusal is the fix, in one line
    script, trace, line = _run(tmp_path, "unused_parameters", UNUSED_PARAMETERS, expect_ok=False)
    report = _report(trace)
    assert report.findings and report.findings[0].title.startswith("The script raised before any op ran"), [f.title for f in report.findings]
    finding = report.findings[0]
    assert finding.line == line and finding.explanation.startswith("The run ended with RuntimeError: DistributedDataParallel(")
    assert "Traceback" not in finding.explanation and "--as-cuda" not in (finding.suggestion or "")
    assert "the script raised before its first op" in finding.evidence[0].text


def test_asynchronous_all_reduces_are_timed_by_the_time_one_was_in_flight_not_the_sum_of_their_waits(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "async_gradients", ASYNC_GRADIENTS)
    report = _report(trace)
    share = [finding for finding in report.findings if finding.title.startswith("Collectives take")]
    assert len(share) == 1, [finding.title for finding in report.findings]
    finding = share[0]
    assert finding.line == line and Path(finding.file or "").name == script.name
    # one kind, all of it the finding's: its time is the calls' union, which the finding costs, not their durations' sum
    kinds = [item.text for item in finding.evidence if item.text.startswith("all_reduce: ")]
    assert kinds == [kinds[0]] and f", {format_ns(finding.cost_total_ns or 0)}, " in kinds[0], (kinds, finding.cost_total_ns)
    # so is the summary's: its time split and its rank line count each instant with a call in flight once
    with tputrace.open(trace) as opened:
        summary = summarize(opened)
    assert summary.time_split.collective_ns == finding.cost_total_ns, (summary.time_split.collective_ns, finding.cost_total_ns)
    assert summary.rank_lines[0].collective_ns == summary.rank_lines[0].top_collective_ns == finding.cost_total_ns


def test_an_optimizer_sharded_by_hand_with_one_flat_call_of_each_kind_an_iteration_is_no_storm_of_small_collectives(
        tmp_path: Path) -> None:
    _, trace, _ = _run(tmp_path, "sharded_by_hand", SHARDED_BY_HAND)
    report = _report(trace)
    titles = [finding.title for finding in report.findings]
    with tputrace.open(trace) as opened:
        calls = opened.sql("SELECT kind, COUNT(*) FROM collectives WHERE rank = 0 GROUP BY kind ORDER BY kind")
    assert calls == [("all_gather", 5), ("reduce_scatter", 5)], calls
    assert not [title for title in titles if title.startswith("Many small collectives")], titles


def test_sync_batch_norm_s_read_and_collectives_are_its_own_and_a_loss_read_and_copied_back_is_told_to_stay(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "sync_batch_norm", SYNC_BATCH_NORM)
    with tputrace.open(trace) as opened:
        buckets = opened.sql("SELECT DISTINCT k.bucket_index FROM collectives c JOIN collective_causes k ON k.id = c.cause_id "
                             "WHERE c.rank = 0 AND k.kind = 'ddp_bucket'")
        uncaused = opened.sql("SELECT COUNT(*) FROM collectives c JOIN frames f ON f.id = c.frame_id WHERE c.rank = 0 "
                              "AND c.kind = 'all_reduce' AND c.cause_id IS NULL AND f.line = ?", (line + 2,))[0][0]
    # one bucket a backward; the layers' all-reduces of their gradient sums are their own, two a step
    assert buckets == [(0,)] and uncaused == 2 * 5, (buckets, uncaused)
    report = _report(trace)
    titles = [finding.title for finding in report.findings]
    read = [finding for finding in report.findings if finding.title.startswith("Host sync") and finding.line == line]
    assert len(read) == 1 and "nn.SyncBatchNorm" in read[0].explanation, titles
    assert "nn.GroupNorm" in (read[0].suggestion or ""), read[0].suggestion
    broadcasts = [finding for finding in report.findings if finding.title.startswith("DDP broadcasts the model's buffers")]
    assert len(broadcasts) == 1 and broadcasts[0].line == line, titles
    assert "2 broadcasts a step" in broadcasts[0].title and "equal on every rank already" in broadcasts[0].explanation
    assert "broadcast_buffers=False" in (broadcasts[0].suggestion or "")
    cut = [finding for finding in report.findings if finding.title.endswith(f"by collective at {script.name}:{line}")]
    assert len(cut) == 1 and "broadcast_buffers=False" in (cut[0].suggestion or ""), titles  # not DDP buckets' advice
    copies = [finding for finding in report.findings if finding.title.startswith("Host-to-chip copies") and finding.line == line + 4]
    assert len(copies) == 1, titles
    assert "values the line read from the chip" in copies[0].explanation and "torch.stack" in (copies[0].suggestion or "")
