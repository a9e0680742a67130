"""Distributed scripts of kinds the other fresh-distributed files do not cover, run under `tputrace run --nproc 2`: metrics
all-reduced every step beside DDP's compressed buckets, and a mixture of experts dispatching its tokens with
all_to_all_single of split sizes counted each step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tputrace
from test_fresh_distributed import HEADER, _report, _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

# DDP whose buckets go through the fp16 compression hook, and each class's recall all-reduced one by one every step for
# logging.
METRICS = HEADER + '''
    from torch.nn.parallel import DistributedDataParallel
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to("tpu"))
    model.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        x = torch.randn(16, 32, device="tpu")
        y = torch.randint(0, 10, (16,), device="tpu")
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        predicted = logits.argmax(-1)
        for label in range(10):
            recall = ((predicted == label) & (y == label)).float().sum() / (y == label).float().sum().clamp(min=1)
            dist.all_reduce(recall)  {marker}
    dist.destroy_process_group()
'''

# Each rank routes its tokens to the experts of both ranks: the counts are exchanged, read, and passed as split sizes.
EXPERTS = HEADER + '''
    import torch.distributed.nn.functional as collectives
    expert = nn.Linear(32, 32).to("tpu")
    router = nn.Linear(32, world).to("tpu")
    optimizer = torch.optim.SGD(list(expert.parameters()) + list(router.parameters()), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    for step in range(5):
        x = torch.randn(32, 32, generator=generator).to("tpu")
        destination = router(x).argmax(-1)
        counts = torch.bincount(destination, minlength=world)
        received_counts = torch.empty_like(counts)
        dist.all_to_all_single(received_counts, counts)
        send, receive = counts.tolist(), received_counts.tolist()
        tokens = x[torch.argsort(destination)]
        arrived = collectives.all_to_all_single(torch.empty(sum(receive), 32, device="tpu"), tokens, receive, send)  {marker}
        back = collectives.all_to_all_single(torch.empty(32, 32, device="tpu"), expert(arrived), send, receive)
        loss = back.square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''

def test_metrics_all_reduced_every_step_are_told_to_reduce_a_running_sum_and_ddp_buckets_are_not_counted_as_uncaused(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "metrics", METRICS)
    report = _report(trace)
    small = [finding for finding in report.findings if finding.title.startswith("Many small collectives")]
    assert len(small) == 1, [finding.title for finding in report.findings]
    assert small[0].file is not None and Path(small[0].file).name == script.name and small[0].line == line
    suggestion = small[0].suggestion or ""
    assert f"{script.name}:{line}" in suggestion and "running sum" in suggestion and "torch.stack" in suggestion
    assert "DDP `bucket_cap_mb`" not in suggestion
    # the fp16 buckets' all-reduces have DDP's cause: the evidence of the uncaused calls holds only the 4-byte recalls
    kinds = [item.text for item in small[0].evidence if item.text.startswith("all_reduce:")]
    assert kinds and all(re.search(r", \d+ B, bus", text) for text in kinds), kinds


def test_tokens_dispatched_with_split_sizes_counted_each_step_are_told_to_use_a_fixed_capacity(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "experts", EXPERTS)
    with tputrace.open(trace) as opened:
        uneven = opened.sql("SELECT COUNT(*) FROM collectives c JOIN frames f ON f.id = c.frame_id "
                            "WHERE c.algorithm LIKE '%:uneven' AND f.line = ?", (line,))[0][0]
        counted = opened.sql("SELECT COUNT(*) FROM collectives c JOIN frames f ON f.id = c.frame_id "
                             "WHERE c.algorithm LIKE '%:uneven' AND f.line = ?", (line - 3,))[0][0]
    assert uneven >= 5 and counted == 0, (uneven, counted)  # the counts' exchange has equal splits
    report = _report(trace)
    share = [finding for finding in report.findings if finding.title.startswith("Collectives take")]
    assert share, [finding.title for finding in report.findings]
    suggestion = share[0].suggestion or ""
    assert "fixed capacity" in suggestion and "split sizes" in suggestion and "DDP buckets" not in suggestion
