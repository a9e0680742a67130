"""Distributed scripts of kinds the other fresh-distributed files do not cover, run under `tputrace run --nproc 2`: metrics
all-reduced every step beside DDP's compressed buckets, a mixture of experts dispatching its tokens with all_to_all_single
of split sizes counted each step, sequence parallelism whose norm weights reach the optimizer as Partial gradients, a
column-parallel layer given its predecessor's split output as whole on a named mesh, a rank out of batches inside DDP's
`Join`, and a device mesh made in one process run with `--chips`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
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

# Sequence parallelism: the norm runs on Shard(1) activations, so its replicated weight's gradient is Partial, and AdamW's
# foreach ops each reduce it (--clean reduces the Partial gradients once before the step).
SEQUENCE_PARALLEL = HEADER + '''
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(32)
            self.up = nn.Linear(32, 64)
            self.down = nn.Linear(64, 32)
        def forward(self, x):
            return x + self.down(torch.relu(self.up(self.norm(x))))
    mesh = init_device_mesh("tpu", (world,))
    plan = dict(norm=SequenceParallel(), up=ColwiseParallel(input_layouts=Shard(1)), down=RowwiseParallel(output_layouts=Shard(1)))
    model = parallelize_module(Block().to("tpu"), mesh, plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(5):
        x = torch.randn(4, 8, 32, device="tpu")  # this rank's part of the sequence
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        if CLEAN:
            for p in model.parameters():
                if isinstance(p.grad, DTensor) and any(placement.is_partial() for placement in p.grad.placements):
                    p.grad = p.grad.redistribute(p.grad.device_mesh, p.placements)
        optimizer.step()  {marker}
    dist.destroy_process_group()
'''


# A named mesh ("tp") whose block makes both layers column-parallel, the second reading its input as whole: it gets each
# rank's piece of the first layer's split output, and DTensor finds no sharding for the product.
PIECE_READ_AS_WHOLE = HEADER + '''
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(32, 64)
            self.down = nn.Linear(64, 32)
        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))  {marker}
    mesh = init_device_mesh("tpu", (world,), mesh_dim_names=("tp",))
    plan = dict(up=ColwiseParallel(), down=ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()))
    model = parallelize_module(Block().to("tpu"), mesh["tp"], plan)
    loss = model(torch.randn(8, 32, device="tpu")).square().mean()
    dist.destroy_process_group()
'''


# Rank 1 has two more batches than rank 0; DDP's Join shadows its collectives from the `with` line on rank 0.
JOINED = HEADER + '''
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(nn.Linear(32, 4).to("tpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(8, 32) for _ in range(4 + 2 * rank)]
    with model.join():  {marker}
        for batch in batches:
            loss = model(batch.to("tpu")).square().mean()
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


def test_partial_gradients_reduced_by_each_optimizer_op_are_told_to_be_reduced_once_before_the_step(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "sequence_parallel", SEQUENCE_PARALLEL)
    report = _report(trace)
    found = [finding for finding in report.findings if "optimizer step" in finding.title and "Partial gradients" in finding.title]
    assert len(found) == 1, [finding.title for finding in report.findings]
    assert found[0].file is not None and Path(found[0].file).name == script.name and found[0].line == line
    assert "p.grad.redistribute(p.grad.device_mesh, p.placements)" in (found[0].suggestion or "")


def test_a_device_mesh_made_in_one_process_with_chips_is_told_to_run_one_process_per_chip(tmp_path: Path) -> None:
    script = tmp_path / "one_process_mesh.py"
    script.write_text(textwrap.dedent('''
        import torch
        import tputrace.backend  # noqa: F401
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        mesh = init_device_mesh("tpu", (2,))
        weight = distribute_tensor(torch.randn(64, 64, device="tpu"), mesh, [Shard(0)])
    '''))
    trace = tmp_path / "one_process_mesh.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--chips", "2", "--quiet", "-o", str(trace), str(script)]
    environment = {name: value for name, value in os.environ.items() if name not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    process = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=environment, timeout=120)
    assert process.returncode != 0
    report = _report(trace)
    assert report.findings and report.findings[0].title.startswith("The script raised before any op ran"), [f.title for f in report.findings]
    suggestion = report.findings[0].suggestion or ""
    assert "tputrace run --nproc N" in suggestion and "--as-cuda" not in suggestion


def test_a_split_input_read_as_whole_on_a_named_mesh_is_read_from_dtensors_error(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "piece_read_as_whole", PIECE_READ_AS_WHOLE, expect_ok=False)
    report = _report(trace)
    found = [finding for finding in report.findings if finding.title.startswith("DTensor found no sharding")]
    assert len(found) == 1, [finding.title for finding in report.findings]
    finding = found[0]
    assert finding.title == f"DTensor found no sharding for aten.addmm.default at {script.name}:{line}: a split input read as whole"
    assert finding.severity == "critical" and finding.line == line and Path(finding.file or "").name == script.name
    assert "32 wide, 1/2 of the 64 inputs of the weight" in finding.explanation, finding.explanation
    assert "RowwiseParallel()" in (finding.suggestion or "") and "output_layouts=Replicate()" in (finding.suggestion or "")


def test_a_rank_shadowing_the_others_inside_join_is_uneven_inputs_not_collectives_out_of_step(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "joined", JOINED)
    report = _report(trace)
    titles = [finding.title for finding in report.findings]
    assert not [title for title in titles if title.startswith("Ranks issue collectives out of step")], titles
    assert not [finding.title for finding in report.findings if finding.title.startswith("Host sync") and finding.line == line], titles
    found = [finding for finding in report.findings if finding.title.startswith("Uneven inputs under Join")]
    assert len(found) == 1, titles
    assert found[0].line == line and Path(found[0].file or "").name == script.name
    assert "rank 0 4, rank 1 6" in found[0].explanation and "DistributedSampler" in (found[0].suggestion or "")
