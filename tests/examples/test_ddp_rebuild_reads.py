"""DDP's forward after the first backward rebuilds its gradient buckets: it copies the new bucket order to the chip,
broadcasts it and reads it back, once, at the user's forward line. Those are DDP's set-up, not the line's: no one-step
copy or sync is reported there, while the line's own per-step copy and the loop's per-step read still are, and the
communication per step counts the gradient all-reduces, not the rebuild's broadcasts."""

from __future__ import annotations

from pathlib import Path

import pytest

import tputrace
from test_fresh_distributed import HEADER, _report, _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

SCRIPT = HEADER + '''
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to("tpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    inputs = [torch.randn(8, 32, generator=generator) for _ in range(4)]
    losses = []
    for step in range(4):
        logits = model(inputs[step].to("tpu"))  {marker}
        loss = logits.square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    dist.destroy_process_group()
'''


def test_ddp_bucket_rebuild_copies_and_reads_are_not_the_forward_lines(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "rebuild", SCRIPT)
    report = _report(trace)
    findings = report.findings
    titles = [finding.title for finding in findings]
    at_forward = [finding for finding in findings if finding.file is not None and Path(finding.file).name == script.name
                  and finding.line == line and finding.analyzer in ("transfers", "syncs")]
    assert not [finding.title for finding in at_forward if "in one step" in finding.title], titles
    # the line's own copy of each step's batch is still the line's, without DDP's copies counted in
    copies = [finding for finding in at_forward if finding.analyzer == "transfers"]
    assert len(copies) == 1 and copies[0].title.endswith("1.00 KiB per step, 1 copy per step"), titles
    # the loop's per-step read stays reported, and DDP's rebuild is still told as DDP's
    assert any(finding.analyzer == "syncs" and finding.line == line + 5 for finding in findings), titles
    assert any(title.startswith("DDP rebuilt its gradient buckets") for title in titles), titles
    # the steady steps (1-3 of 4) communicate only their bucket all-reduces: the rebuild's broadcasts in step 1 are once
    with tputrace.open(trace) as opened:
        ((all_reduce_ns,),) = opened.sql("SELECT SUM(dur_ns) FROM collectives WHERE rank = ? AND kind = 'all_reduce' "
                                         "AND step BETWEEN 1 AND 3", (report.rank,))
    assert report.results["sharding"].data.communication_per_step_ns * 3 <= all_reduce_ns + 1
