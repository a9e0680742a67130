"""Distributed scripts of kinds the other fresh-script files do not cover, each with a problem planted at a marked line
(or none), run under `tputrace run --nproc N`: DTensor data parallelism, a 2-D mesh whose weight is split on the wrong
dim, a batch distributed inside the loop, parameters broadcast every step, and a rank slowed by host work."""

from __future__ import annotations

from pathlib import Path

import pytest

import tputrace
from test_fresh_distributed import HEADER, _report, _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

# Data parallelism written with DTensor: replicated weights, each rank's batch Shard(0). The backward leaves each gradient
# Partial(sum), and the optimizer step's all-reduce sums it over the ranks, as DDP's would: nothing to change.
DTENSOR_DATA_PARALLEL = HEADER + '''
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("tpu", (world,))
    first = nn.Parameter(distribute_tensor(torch.randn(128, 512, device="tpu") / 11, mesh, [Replicate()]))
    second = nn.Parameter(distribute_tensor(torch.randn(512, 128, device="tpu") / 22, mesh, [Replicate()]))
    optimizer = torch.optim.SGD([first, second], lr=0.01)
    for step in range(6):
        x = DTensor.from_local(torch.randn(32, 128, device="tpu"), mesh, [Shard(0)], run_check=False)
        loss = (torch.relu(x @ first) @ second).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  {marker}
    dist.destroy_process_group()
'''

# A ("dp", "tp") mesh: the first weight column-parallel over "tp", the second split on its columns too where its rows
# (Shard(0)) pair with the first's output. The product gathers the hidden activation, and the optimizer step moves the
# second gradient from Shard(0) to Shard(1) over "tp" besides summing it over "dp".
MESH_2D = HEADER + '''
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("tpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    first = nn.Parameter(distribute_tensor(torch.randn(128, 512, device="tpu") / 11, mesh, [Replicate(), Shard(1)]))
    second = nn.Parameter(distribute_tensor(torch.randn(512, 128, device="tpu") / 22, mesh, [Replicate(), Shard(1)]))
    optimizer = torch.optim.SGD([first, second], lr=0.01)
    for step in range(6):
        x = DTensor.from_local(torch.randn(16, 128, device="tpu"), mesh, [Shard(0), Replicate()], run_check=False)
        out = torch.relu(x @ first) @ second  {marker}
        loss = out.square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''

# Each step's batch made whole on every rank and handed to distribute_tensor, which scatters rank 0's to the ranks
# (--clean wraps each rank's own piece with DTensor.from_local).
DISTRIBUTED_BATCH = HEADER + '''
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("tpu", (world,))
    weight = nn.Parameter(distribute_tensor(torch.randn(256, 64, device="tpu") / 16, mesh, [Replicate()]))
    optimizer = torch.optim.SGD([weight], lr=0.01)
    for step in range(6):
        if CLEAN:
            x = DTensor.from_local(torch.randn(1024 // world, 256, device="tpu"), mesh, [Shard(0)], run_check=False)
        else:
            x = distribute_tensor(torch.randn(1024, 256, device="tpu"), mesh, [Shard(0)])  {marker}
        loss = (x @ weight).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''

# Gradients averaged by hand, one call per parameter, then every parameter broadcast from rank 0 after each update,
# although the averaged updates keep the replicas equal: two lines of collectives, each with its own fix.
PARAMETER_BROADCAST = HEADER + '''
    model = nn.Sequential(nn.Embedding(16384, 64), nn.Flatten(), nn.Linear(64 * 8, 10)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        tokens = torch.randint(0, 16384, (16, 8), device="tpu")
        loss = nn.functional.cross_entropy(model(tokens), torch.randint(0, 10, (16,), device="tpu"))
        optimizer.zero_grad()
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.AVG)
        optimizer.step()
        for parameter in model.parameters():
            dist.broadcast(parameter.data, src=0)  {marker}
    dist.destroy_process_group()
'''

# The blocks of a language model each in a fully_shard group, and no fully_shard on the model: the embedding and the
# head stay plain tensors that the optimizer updates from each rank's own batch (--clean wraps the model too).
BLOCKS_ONLY_FSDP = HEADER + '''
    from torch.distributed.fsdp import fully_shard
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc = nn.LayerNorm(64), nn.Linear(64, 64)
        def forward(self, x):
            return x + self.fc(torch.relu(self.norm(x)))
    class LanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(1024, 64)
            self.blocks = nn.ModuleList([Block() for _ in range(2)])
            self.head = nn.Linear(64, 1024)
        def forward(self, tokens):
            h = self.embed(tokens)
            for block in self.blocks:
                h = block(h)
            return self.head(h)
    model = LanguageModel().to("tpu")
    for block in model.blocks:
        fully_shard(block)  {marker}
    if CLEAN:
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    for step in range(4):
        tokens = torch.randint(0, 1024, (4, 16), generator=generator).to("tpu")
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''

# Rank 1's shard of the data needs decoding on the host (a slow path standing in for image resizing) before each step,
# which the trace does not record: the other rank waits for it in DDP's all-reduce (--clean: no rank decodes).
HOST_DECODING_RANK = HEADER + '''
    import time
    import numpy as np
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to("tpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    samples = np.random.default_rng(rank)
    def decode(batch):
        if rank == 1 and not CLEAN:
            time.sleep(0.2)
        return batch.astype(np.float32)
    for step in range(6):
        x = torch.from_numpy(decode(samples.standard_normal((32, 64)))).to("tpu")  {marker}
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''

# An MLP's tensor-parallel plan with the two styles swapped: the up projection row-parallel, so its whole input is read
# as each rank's piece of one twice as wide, and DTensor stops at the first forward (--clean: column then row).
SWAPPED_PLAN = HEADER + '''
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("tpu", (world,))
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.up, self.down = nn.LayerNorm(64), nn.Linear(64, 256), nn.Linear(256, 64)
        def forward(self, x):
            return x + self.down(nn.functional.gelu(self.up(self.norm(x))))  {marker}
    model = nn.Sequential(MLP(), nn.Linear(64, 8)).to("tpu")
    if CLEAN:
        plan = {{"up": ColwiseParallel(), "down": RowwiseParallel()}}
    else:
        plan = {{"up": RowwiseParallel(), "down": ColwiseParallel(output_layouts=Replicate())}}
    parallelize_module(model[0], mesh, plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        loss = model(torch.randn(16, 64, device="tpu")).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''

# Two pipeline stages by hand: rank 0 runs the first layer and sends each micro-batch's activation, rank 1 the head,
# sending the activation's gradient back; each stage waits while the other computes.
TWO_STAGES = HEADER + '''
    stage = (nn.Sequential(nn.Linear(128, 256), nn.ReLU()) if rank == 0 else nn.Sequential(nn.Linear(256, 10))).to("tpu")
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.01)
    for step in range(6):
        optimizer.zero_grad()
        for micro in range(4):
            if rank == 0:
                hidden = stage(torch.randn(16, 128, device="tpu"))
                dist.send(hidden.detach(), dst=1)  {marker}
                grad = torch.empty_like(hidden)
                dist.recv(grad, src=1)
                hidden.backward(grad)
            else:
                hidden = torch.empty(16, 256, device="tpu")
                dist.recv(hidden, src=0)
                hidden.requires_grad_(True)
                stage(hidden).square().mean().backward()
                dist.send(hidden.grad, dst=0)
        optimizer.step()
    dist.destroy_process_group()
'''

# The batch split over the ranks (Shard(0)) and the weight split on its rows (Shard(0)) on the same mesh dim: the
# product cannot pair them, so every step moves the batch to Shard(1) (an all_to_all) before multiplying.
BATCH_AND_ROWS_SPLIT = HEADER + '''
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    mesh = init_device_mesh("tpu", (world,))
    weight = nn.Parameter(distribute_tensor(torch.randn(256, 512, device="tpu") / 16, mesh, [Shard(0)]))
    optimizer = torch.optim.SGD([weight], lr=0.01)
    for step in range(6):
        x = DTensor.from_local(torch.randn(32, 256, device="tpu"), mesh, [Shard(0)], run_check=False)
        hidden = x @ weight  {marker}
        loss = hidden.square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''

# Each rank counts its batch's labels with bincount, whose length is the largest label present plus one, and sums the
# counts over the ranks: at step 2 rank 1's batch has no label 9, so its tensor is shorter and the all-reduce hangs.
LABEL_COUNTS = HEADER.replace('dist.init_process_group("tpu")', 'dist.init_process_group("tpu", timeout=__import__("datetime").timedelta(seconds=15))') + '''
    model = nn.Linear(32, 10).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    for step in range(4):
        labels = torch.randint(0, 9 if rank == 1 and step == 2 else 10, (64,), generator=generator).to("tpu")
        loss = nn.functional.cross_entropy(model(torch.randn(64, 32, device="tpu")), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        counts = torch.bincount(labels)
        dist.all_reduce(counts)  {marker}
        print(rank, step, counts.tolist(), flush=True)
    dist.destroy_process_group()
'''

# FSDP1 (FullyShardedDataParallel), each rank on its own batches: its post-backward hook calls record_stream with the
# Python key excluded. The script checks the trained weights against the same training on the CPU of both ranks' batches.
FSDP1_TRAINING = HEADER + '''
    import copy
    from torch.distributed.fsdp import FullyShardedDataParallel
    reference = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    model = FullyShardedDataParallel(copy.deepcopy(reference).to("tpu"), device_id=torch.device("tpu", 0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    generators = [torch.Generator().manual_seed(member) for member in range(world)]
    for step in range(3):
        batches = [torch.randn(8, 32, generator=generator) for generator in generators]
        loss = model(batches[rank].to("tpu")).square().mean()  {marker}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        reference_loss = sum(reference(batch).square().mean() for batch in batches) / world
        reference_optimizer.zero_grad()
        reference_loss.backward()
        reference_optimizer.step()
    with FullyShardedDataParallel.summon_full_params(model):
        trained = [parameter.detach().cpu() for parameter in model.parameters()]
    expected = torch.cat([parameter.detach().flatten() for parameter in reference.parameters()])
    assert torch.allclose(torch.cat([parameter.flatten() for parameter in trained]), expected, atol=1e-5), "FSDP1 trained other weights"
    dist.destroy_process_group()
'''


def test_dtensor_data_parallel_gradients_summed_by_the_optimizer_step_are_no_finding(tmp_path: Path) -> None:
    _, trace, _ = _run(tmp_path, "dtensor_dp", DTENSOR_DATA_PARALLEL)
    report = _report(trace)
    with tputrace.open(trace) as opened:  # the sums ran: one all-reduce per gradient a step
        assert opened.sql("SELECT COUNT(*) FROM collectives WHERE kind = 'all_reduce' AND cause_id IS NOT NULL")[0][0] >= 10
    moves = [finding for finding in report.findings if finding.title.startswith("The optimizer step moves")]
    assert not moves, [(finding.title, finding.suggestion) for finding in moves]
    assert not [finding for finding in report.findings if "Partial(sum)" in (finding.suggestion or "")]


def test_a_2d_mesh_weight_split_on_the_wrong_dim_is_named_per_mesh_dim(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "mesh_2d", MESH_2D, nproc=4)
    report = _report(trace)
    moves = [finding for finding in report.findings if finding.title.startswith("The optimizer step moves")]
    # the first weight's gradient only needs its sum over "dp"; the second's is split on rows where its weight is on columns
    assert len(moves) == 1, [finding.title for finding in moves]
    assert moves[0].title.startswith("The optimizer step moves a (512,128) gradient from Partial(sum),Shard(0) to its parameter's "
                                     "Replicate(),Shard(1): an all_to_all"), moves[0].title
    suggestion = moves[0].suggestion or ""
    assert "Distribute that parameter as Replicate(),Shard(0)" in suggestion and "over mesh dim 0 stays" in suggestion, suggestion
    # the product on the marked line gathers the activation over "tp" (mesh dim 1): the other operand must pair with it
    gathers = [finding for finding in report.findings if finding.title.startswith("aten.mm.default needs") and finding.line == line]
    assert gathers and Path(gathers[0].file or "").name == script.name, [(finding.title, finding.line) for finding in report.findings]
    assert (gathers[0].suggestion or "").startswith("The other operand's placement does not pair"), gathers[0].suggestion


def test_a_batch_distributed_in_the_loop_is_told_to_go_from_local(tmp_path: Path) -> None:
    # The scatter's share of a step is near the 5% a share finding needs when the host is loaded (the ranks' waits for
    # one another then grow with the other work), so a run whose share fell under it is run once more.
    for attempt in range(2):
        (tmp_path / f"run{attempt}").mkdir()
        script, trace, line = _run(tmp_path / f"run{attempt}", "distributed_batch", DISTRIBUTED_BATCH)
        report = _report(trace)
        share = [finding for finding in report.findings if finding.title.startswith("Collectives") and " take " in finding.title]
        if share:
            break
    assert len(share) == 1 and share[0].line == line, [(finding.title, finding.line) for finding in report.findings]
    assert (share[0].suggestion or "").startswith(f"distribute_tensor at {script.name}:{line} scatters rank 0's tensor"), share[0].suggestion
    assert "DTensor.from_local" in (share[0].suggestion or "")
    _, clean_trace, _ = _run(tmp_path, "distributed_batch", DISTRIBUTED_BATCH, "--clean")
    assert not [finding for finding in _report(clean_trace).findings if "distribute_tensor at" in (finding.suggestion or "")]


def test_parameters_broadcast_after_reduced_gradients_get_their_own_fix(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "parameter_broadcast", PARAMETER_BROADCAST)
    report = _report(trace)
    share = [finding for finding in report.findings if finding.title.startswith("Collectives take")]
    assert len(share) == 1, [finding.title for finding in report.findings]
    suggestion = share[0].suggestion or ""
    # the per-parameter all-reduce three lines up, and the broadcasts at the marked line, in the order of their
    # measured time (which of the two costs more varies from run to run)
    assert f"all_reduce at {script.name}:{line - 3} runs 3 times a step, one call per tensor" in suggestion, suggestion
    assert f"Broadcast less at {script.name}:{line}: values that stay equal on every rank" in suggestion, suggestion


def test_modules_outside_every_fully_shard_group_are_named_as_never_reduced(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "blocks_only", BLOCKS_ONLY_FSDP)
    report = _report(trace)
    found = [finding for finding in report.findings if "in no fully_shard group" in finding.title]
    assert len(found) == 1, [finding.title for finding in report.findings]
    finding = found[0]
    # the embedding (1024x64) and the head's weight and bias: 516 KiB
    assert finding.title == ("3 parameters in LanguageModel.embed, LanguageModel.head (516 KiB) are in no fully_shard group: their "
                             "gradients are never summed over the ranks, so each rank's copy drifts apart"), finding.title
    assert finding.severity == "critical" and finding.line == line and Path(finding.file or "").name == script.name
    assert "fully_shard(model)" in (finding.suggestion or "")
    _, clean_trace, _ = _run(tmp_path, "blocks_only", BLOCKS_ONLY_FSDP, "--clean")
    assert not [finding.title for finding in _report(clean_trace).findings if "in no fully_shard group" in finding.title]


def test_a_rank_slowed_by_host_work_is_named_at_the_line_its_work_precedes(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "host_decoding", HOST_DECODING_RANK)
    report = _report(trace)
    late = [finding for finding in report.findings if finding.title.startswith("Straggler: rank 1 spends")]
    assert len(late) == 1, [finding.title for finding in report.findings]
    assert late[0].line == line and Path(late[0].file or "").name == script.name
    assert f"more than the others on the host before {script.name}:{line}" in late[0].title
    assert late[0].cost_total_ns > 0 and "DataLoader with workers" in (late[0].suggestion or "")
    _, clean_trace, _ = _run(tmp_path, "host_decoding", HOST_DECODING_RANK, "--clean")
    assert not [finding.title for finding in _report(clean_trace).findings if finding.title.startswith("Straggler: rank 1 spends")]


def test_a_row_parallel_layer_given_a_whole_input_is_read_from_dtensors_error(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "swapped_plan", SWAPPED_PLAN, expect_ok=False)
    report = _report(trace)
    found = [finding for finding in report.findings if finding.title.startswith("DTensor found no sharding")]
    assert len(found) == 1, [finding.title for finding in report.findings]
    finding = found[0]
    assert finding.title == (f"DTensor found no sharding for aten.addmm.default at {script.name}:{line}: a row-parallel layer got a "
                             "whole input read as split"), finding.title
    assert finding.severity == "critical" and finding.line == line and Path(finding.file or "").name == script.name
    assert "128 wide in all, 2 times the 64 inputs of the weight" in finding.explanation, finding.explanation
    assert "ColwiseParallel()" in (finding.suggestion or "") and "input_layouts=Replicate()" in (finding.suggestion or "")
    _, clean_trace, _ = _run(tmp_path, "swapped_plan", SWAPPED_PLAN, "--clean")
    assert not [finding.title for finding in _report(clean_trace).findings if finding.title.startswith("DTensor found no sharding")]


def test_pipeline_stages_waiting_for_each_other_are_no_one_rank_s_extra_work(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "two_stages", TWO_STAGES)
    report = _report(trace)
    titles = [finding.title for finding in report.findings]
    assert not [title for title in titles if title.startswith("Straggler: rank 0 runs work the other ranks do not")], titles
    roles = [finding for finding in report.findings if finding.title.startswith("Ranks run different work (rank 0 at")]
    assert len(roles) == 1 and "rank 1 at" in roles[0].title, titles
    assert "isend/irecv" in (roles[0].suggestion or "") and Path(roles[0].file or "").name == script.name
    # the send and the recv of rank 0 get one fix naming both lines, not the same sentence twice
    share = [finding for finding in report.findings if finding.title.startswith("Collectives take")]
    assert len(share) == 1, titles
    suggestion = share[0].suggestion or ""
    # which of rank 0's two lines holds more of the time (and so is named first, or alone) is the host's scheduling
    assert suggestion.count("Send fewer, larger messages") == 1, suggestion
    assert f"{script.name}:{line}" in suggestion or f"{script.name}:{line + 2}" in suggestion, suggestion


def test_a_batch_split_like_the_weight_s_rows_is_told_which_placements_pair(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "batch_and_rows", BATCH_AND_ROWS_SPLIT)
    report = _report(trace)
    moves = [finding for finding in report.findings if finding.title.startswith("aten.mm.default needs an operand as Shard(1), not Shard(0)")]
    assert len(moves) == 1 and moves[0].line == line, [(finding.title, finding.line) for finding in report.findings]
    suggestion = moves[0].suggestion or ""
    assert suggestion.startswith(f"mm at {script.name}:{line} cannot pair an operand split as Shard(0)"), suggestion
    assert "x split on its last dim" in suggestion and "w Replicate()" in suggestion


def test_a_collective_whose_size_each_rank_s_data_sets_is_named_as_sizes_not_a_branch(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "label_counts", LABEL_COUNTS, expect_ok=False)
    report = _report(trace)
    sizes = [finding for finding in report.findings if finding.title.startswith("Ranks pass tensors of different sizes")]
    assert len(sizes) == 1, [finding.title for finding in report.findings]
    # 10 int64 counts on rank 0, 9 on rank 1, at the third all-reduce (the labels of every rank reach 9 in steps 0 and 1)
    assert sizes[0].title.endswith(f"call 3 on process group 0 is all_reduce at {script.name}:{line} (rank 0 80 B, rank 1 72 B)"), sizes[0].title
    assert sizes[0].line == line and Path(sizes[0].file or "").name == script.name
    assert "minlength=num_classes" in (sizes[0].suggestion or "")
    assert not [finding.title for finding in report.findings if finding.title.startswith("Ranks issue collectives out of step")]


def test_fsdp1_trains_on_tpu_ranks_as_on_the_cpu(tmp_path: Path) -> None:
    _, trace, line = _run(tmp_path, "fsdp1", FSDP1_TRAINING)
    with tputrace.open(trace) as opened:  # the flat parameter's all-gathers and the gradients' reduce-scatters ran on the chips
        kinds = {kind for (kind,) in opened.sql("SELECT DISTINCT kind FROM collectives")}
    assert {"all_gather", "reduce_scatter"} <= kinds, kinds
