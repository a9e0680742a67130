"""Distributed scripts unlike the examples, each with a problem planted at a marked line, run on two virtual
chips under `tputrace run --nproc 2`: the report names the problem at that line with its fix, a variant without
the problem gets no such finding, and a run that fails keeps what every rank recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tputrace
from tputrace.analysis import Report, analyze

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

ROOT = Path(__file__).resolve().parents[2]
MARKER = "# the planted line"

HEADER = '''
    import sys
    import torch
    import torch.distributed as dist
    import tputrace.backend  # noqa: F401
    from torch import nn
    CLEAN = "--clean" in sys.argv
    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
'''

ACCUMULATION = HEADER + '''
    from torch.nn.parallel import DistributedDataParallel
    cap = 0.001 if "--small-buckets" in sys.argv else 25  # 1 KB: a bucket or two per layer
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to("tpu"), bucket_cap_mb=cap)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    for step in range(5):
        for micro in range(4):
            x = torch.randn(8, 32, generator=generator).to("tpu")
            y = torch.randint(0, 4, (8,), generator=generator).to("tpu")
            if CLEAN and micro < 3:
                with model.no_sync():
                    nn.functional.cross_entropy(model(x), y).backward()
            else:
                nn.functional.cross_entropy(model(x), y).backward()  {marker}
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
'''

# A row-parallel product left Partial: square() reduces it in the forward and its gradient again in the backward
# (--clean reduces it once, right after the product). After the loop, a Shard(0) -> Shard(1) redistribution.
ROW_PARALLEL = HEADER + '''
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("tpu", (world,))
    first = nn.Parameter(distribute_tensor(torch.randn(32, 64, device="tpu") / 8, mesh, [Shard(1)]))
    second = nn.Parameter(distribute_tensor(torch.randn(64, 32, device="tpu") / 8, mesh, [Shard(0)]))
    optimizer = torch.optim.SGD([first, second], lr=0.01)
    for step in range(5):
        x = DTensor.from_local(torch.randn(16, 32, device="tpu"), mesh, [Replicate()], run_check=False)
        out = torch.relu(x @ first) @ second
        if CLEAN:
            out = out.redistribute(mesh, [Replicate()])
        loss = out.square().mean()  {marker}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    moved = distribute_tensor(torch.arange(4.0 * world * 6 * world).reshape(4 * world, 6 * world).to("tpu"), mesh, [Shard(0)])
    local = moved.redistribute(mesh, [Shard(1)]).to_local().cpu()
    assert torch.equal(local, torch.arange(4.0 * world * 6 * world).reshape(4 * world, 6 * world).chunk(world, dim=1)[rank])
    dist.destroy_process_group()
'''

FULL_TENSOR = HEADER + '''
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("tpu", (world,))
    first = nn.Parameter(distribute_tensor(torch.randn(32, 256, device="tpu") / 8, mesh, [Shard(1)]))
    second = nn.Parameter(distribute_tensor(torch.randn(256, 32, device="tpu") / 16, mesh, [Shard(0)]))
    optimizer = torch.optim.SGD([first, second], lr=0.01)
    for step in range(5):
        x = DTensor.from_local(torch.randn(32, 32, device="tpu"), mesh, [Replicate()], run_check=False)
        hidden = torch.relu(x @ first)
        if CLEAN:
            out = (hidden @ second).redistribute(mesh, [Replicate()])
        else:
            out = hidden.full_tensor() @ second.full_tensor()  {marker}
        loss = out.square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''

OUT_OF_STEP = HEADER + '''
    total = torch.ones(256, device="tpu")
    for step in range(4):
        value = total * (step + 1)
        if not (rank == 1 and step == 2):
            dist.all_reduce(value)  {marker}
        dist.all_reduce(total)
        print(rank, step, value.sum().item())
    dist.destroy_process_group()
'''

UNEVEN_INPUTS = HEADER + '''
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(nn.Linear(16, 4).to("tpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [torch.randn(8, 16) for _ in range(4 - rank)]
    for batch in batches:
        loss = model(batch.to("tpu")).square().mean()
        optimizer.zero_grad()
        loss.backward()  {marker}
        optimizer.step()
    dist.destroy_process_group()
'''

RANK_ONLY_WORK = HEADER + '''
    from torch.nn.parallel import DistributedDataParallel
    net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).to("tpu")
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    held_out = torch.randn(2048, 256, device="tpu")
    for step in range(8):
        if rank == 0:
            with torch.no_grad():
                for _ in range(8):
                    score = net(held_out).square().mean()  {marker}
                print(step, score.item())
        loss = model(torch.randn(64, 256, device="tpu")).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''

BARRIERS = HEADER + '''
    model = nn.Linear(64, 64).to("tpu")  # each rank trains its own model; the barriers are the only collectives
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        loss = model(torch.randn(16, 64, device="tpu")).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        dist.barrier()  {marker}
        if rank == 0:
            print(step)
        dist.barrier()
    dist.destroy_process_group()
'''

REPLICATED_WEIGHT = HEADER + '''
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("tpu", (world,))
    first = nn.Parameter(distribute_tensor(torch.randn(64, 256, device="tpu") / 8, mesh, [Replicate()]))  # meant: Shard(1)
    second = nn.Parameter(distribute_tensor(torch.randn(256, 64, device="tpu") / 16, mesh, [Shard(0)]))
    optimizer = torch.optim.SGD([first, second], lr=0.01)
    for step in range(5):
        x = DTensor.from_local(torch.randn(32, 64, device="tpu"), mesh, [Replicate()], run_check=False)
        out = (torch.relu(x @ first) @ second).redistribute(mesh, [Replicate()])
        loss = out.square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  {marker}
    dist.destroy_process_group()
'''

VOCABULARY_HEAD = HEADER + '''
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module
    mesh = init_device_mesh("tpu", (world,))
    model = nn.Sequential(nn.Embedding(1024, 64), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1024)).to("tpu")
    head = ColwiseParallel(use_local_output=False) if CLEAN else ColwiseParallel(output_layouts=Replicate())  {marker}
    parallelize_module(model, mesh, {{"3": head}})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        tokens = torch.randint(0, 1024, (8, 16), device="tpu")
        logits = model(tokens).flatten(0, 1)
        if CLEAN:
            with loss_parallel():
                loss = nn.functional.cross_entropy(logits, tokens.flatten())
                loss.backward()
        else:
            loss = nn.functional.cross_entropy(logits, tokens.flatten())
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
'''

UNEVEN_GATHER = HEADER + '''
    weight = torch.randn(64, device="tpu", requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    for step in range(4):
        local = torch.randn(10 + 5 * rank, device="tpu")
        pieces = [torch.empty(10 + 5 * other, device="tpu") for other in range(world)]
        dist.all_gather(pieces, local)  {marker}
        loss = (weight * torch.cat(pieces).sum()).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''

STALLED_RANK = '''
    import datetime
    import time
    import torch
    import torch.distributed as dist
    import tputrace.backend  # noqa: F401
    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=4))
    rank = dist.get_rank()
    total = torch.ones(64, device="tpu")
    for step in range(3):
        if rank == 0 and step == 2:
            time.sleep(15)  # host work on one rank only
        dist.all_reduce(total)  {marker}
    dist.destroy_process_group()
'''


# Every block and the side branch have a fully_shard group of their own: groups of three sizes, each gathered and
# reduced every step. Nothing is wrong.
FSDP_GROUPS = HEADER + '''
    from torch.distributed.fsdp import fully_shard
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(128, 128), nn.Linear(128, 128)
        def forward(self, x):
            return x + self.b(torch.relu(self.a(x)))
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block() for _ in range(3)])
            self.side = nn.Sequential(nn.Linear(128, 1024), nn.ReLU(), nn.Linear(1024, 128))
            self.head = nn.Linear(128, 8)
        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x + self.side(x))
    model = Model().to("tpu")
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model.side)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    for step in range(5):
        x = torch.randn(16, 128, generator=generator).to("tpu")
        loss = model(x).square().mean()  {marker}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''

def _run(tmp_path: Path, name: str, source: str, *args: str, expect_ok: bool = True, nproc: int = 2) -> tuple[Path, Path, int]:
    """Write the script, run it on `nproc` ranks and return its path, the merged trace and the planted line."""
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source.format(marker=MARKER)))
    line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if MARKER in text)
    trace = tmp_path / f"{name}{'-'.join(args)}.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--nproc", str(nproc), "-o", str(trace), str(script), *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                               env=dict(os.environ, PYTHONWARNINGS="ignore"), start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        pytest.fail(f"{name} did not finish:\n{stderr[-4000:]}")
    assert (process.returncode == 0) == expect_ok, stderr[-4000:]
    return script, trace, line


def _report(trace: Path) -> Report:
    with tputrace.open(trace) as opened:
        return analyze(opened)


def test_gradient_accumulation_without_no_sync_is_named_at_the_backward_line(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "accumulate", ACCUMULATION)
    found = [finding for finding in _report(trace).findings if "no_sync" in finding.title]
    assert len(found) == 1, [finding.title for finding in _report(trace).findings]
    finding = found[0]
    assert finding.file is not None and Path(finding.file).name == script.name and finding.line == line
    assert "4 times per optimizer step" in finding.title and "model.no_sync()" in (finding.suggestion or "")
    assert finding.cost_per_step_ns and finding.cost_per_step_ns > 0
    # each bucket all-reduce ends the fused program: the fusion finding says so, and does not ask to move a host read
    cut = [finding for finding in _report(trace).findings if finding.title.startswith("Fragmented fusion") and "by collective" in finding.title]
    assert cut and all("host read" not in finding.suggestion and "no_sync()" in finding.suggestion for finding in cut)
    _, clean_trace, _ = _run(tmp_path, "accumulate", ACCUMULATION, "--clean")
    assert not [finding.title for finding in _report(clean_trace).findings if "no_sync" in finding.title]


def test_buckets_are_counted_per_backward_pass_when_gradients_accumulate_without_no_sync(tmp_path: Path) -> None:
    _, trace, _ = _run(tmp_path, "accumulate", ACCUMULATION, "--small-buckets")
    report = _report(trace)
    assert [finding for finding in report.findings if "no_sync" in finding.title], [finding.title for finding in report.findings]
    # a few buckets a backward pass, each reduced 4 times a step: the accumulation's finding, not small buckets
    assert not [finding.title for finding in report.findings if finding.title.startswith("DDP buckets of")]


def test_a_partial_sum_reduced_again_by_a_gradient_is_named_at_the_forward_line(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "row_parallel", ROW_PARALLEL)
    report = _report(trace)
    again = [finding for finding in report.findings if "again in the backward" in finding.title]
    assert len(again) == 1, [finding.title for finding in report.findings]
    assert again[0].file is not None and Path(again[0].file).name == script.name and again[0].line == line
    assert "redistribute(mesh, [Replicate()])" in (again[0].suggestion or "")
    # every sharding finding has a line (a DTensor loss's backward gets the backward() call's line)
    assert all(finding.line is not None for finding in report.findings if finding.analyzer == "sharding" and "exposed" not in finding.title)
    # DTensor's Shard(0) -> Shard(1) runs as an all_to_all on the chips, not as a CPU fallback
    assert not [finding.title for finding in report.findings if "shard_dim_alltoall" in finding.title]
    with tputrace.open(trace) as opened:
        assert opened.sql("SELECT COUNT(*) FROM collectives WHERE kind = 'all_to_all'")[0][0] > 0
        assert opened.sql("SELECT COUNT(*) FROM collectives WHERE frame_id IS NULL")[0][0] == 0
        assert not opened.sql("SELECT s.text FROM fallbacks f JOIN strings s ON s.id = f.op_sid WHERE s.text LIKE '%shard_dim_alltoall%'")
    _, clean_trace, _ = _run(tmp_path, "row_parallel", ROW_PARALLEL, "--clean")
    clean = _report(clean_trace)
    assert not [finding.title for finding in clean.findings if finding.analyzer == "sharding" and finding.severity != "info"]


def test_full_tensor_in_the_loop_is_named_at_its_line(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "full_tensor", FULL_TENSOR)
    report = _report(trace)
    gathers = [finding for finding in report.findings if finding.title.startswith("full_tensor() or redistribute()")]
    assert gathers and all(finding.line == line and Path(finding.file or "").name == script.name for finding in gathers), \
        [(finding.title, finding.line) for finding in report.findings]
    assert {"Shard(0)", "Shard(1)"} <= {placement for finding in gathers for placement in ("Shard(0)", "Shard(1)") if placement in finding.title}
    _, clean_trace, _ = _run(tmp_path, "full_tensor", FULL_TENSOR, "--clean")
    assert not [finding.title for finding in _report(clean_trace).findings if finding.title.startswith("full_tensor()")]


def test_a_collective_one_rank_skips_is_named_and_the_failed_call_is_kept(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "out_of_step", OUT_OF_STEP, expect_ok=False)
    with tputrace.open(trace) as opened:
        calls = dict(opened.sql("SELECT rank, COUNT(*) FROM collectives GROUP BY rank"))
        report = analyze(opened)
    # rank 0 issued 8 all-reduces, the last one failing when rank 1 (7 calls) had left: both are in the trace
    assert calls == {0: 8, 1: 7}, calls
    order = [finding for finding in report.findings if finding.title.startswith("Ranks issue collectives out of step")]
    assert len(order) == 1 and order[0].severity == "critical", [finding.title for finding in report.findings]
    assert order[0].file is not None and Path(order[0].file).name == script.name and order[0].line == line
    assert f"{script.name}:{line + 1}" in order[0].title


def test_a_rank_with_fewer_batches_is_named_as_uneven_inputs(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "uneven", UNEVEN_INPUTS, expect_ok=False)
    report = _report(trace)
    uneven = [finding for finding in report.findings if finding.title.startswith("Uneven inputs")]
    assert len(uneven) == 1 and uneven[0].severity == "critical", [finding.title for finding in report.findings]
    assert uneven[0].file is not None and Path(uneven[0].file).name == script.name and uneven[0].line == line
    assert "rank 1 finished" in uneven[0].title and "model.join()" in uneven[0].suggestion


def test_a_rank_that_runs_extra_ops_every_step_is_the_straggler_at_that_line(tmp_path: Path) -> None:
    # Who arrives last in a step is the host's scheduling as well as the program's: a heavily loaded host can reorder
    # the ranks in most steps of one run, so a run without the finding is run once more.
    for attempt in range(2):
        (tmp_path / f"run{attempt}").mkdir()
        script, trace, line = _run(tmp_path / f"run{attempt}", "rank_only", RANK_ONLY_WORK)
        report = _report(trace)
        late = [finding for finding in report.findings if finding.title.startswith("Straggler: rank 0 runs work")]
        if late:
            break
    assert len(late) == 1, "\n".join(f"{finding.title}: {finding.explanation}" for finding in report.findings)
    assert late[0].file is not None and Path(late[0].file).name == script.name and late[0].line == line
    assert late[0].cost_total_ns > 0


def test_barriers_every_step_are_listed_by_line_with_their_own_fix(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "barriers", BARRIERS)
    report = _report(trace)
    shares = [finding for finding in report.findings if finding.title.startswith("Collectives take")]
    assert len(shares) == 1, [finding.title for finding in report.findings]
    assert shares[0].suggestion.startswith(f"Remove the barrier at {script.name}:"), shares[0].suggestion
    by_line = {evidence.line: evidence.text for evidence in shares[0].evidence if evidence.line is not None}
    assert by_line.get(line, "").startswith("barrier, 1 call a step"), by_line


def test_a_parameter_placed_unlike_its_gradient_is_named_at_the_optimizer_step(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "replicated_weight", REPLICATED_WEIGHT)
    report = _report(trace)
    moves = [finding for finding in report.findings if finding.title.startswith("The optimizer step moves a (64,256) gradient from Shard(1)")]
    assert len(moves) == 1, [finding.title for finding in report.findings]
    assert moves[0].file is not None and Path(moves[0].file).name == script.name and moves[0].line == line
    assert "Distribute that parameter as Shard(1)" in moves[0].suggestion


def test_a_vocabulary_head_that_gathers_its_logits_is_named_at_its_plan_entry(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "head", VOCABULARY_HEAD)
    report = _report(trace)
    gathers = [finding for finding in report.findings if "all-gathers its whole output" in finding.title]
    assert len(gathers) == 1, [finding.title for finding in report.findings]
    assert gathers[0].file is not None and Path(gathers[0].file).name == script.name and gathers[0].line == line
    assert "loss_parallel()" in gathers[0].suggestion
    _, clean_trace, _ = _run(tmp_path, "head", VOCABULARY_HEAD, "--clean")
    assert not [finding.title for finding in _report(clean_trace).findings if "all-gathers its whole output" in finding.title]


def test_an_all_gather_of_pieces_the_ranks_sized_apart_is_not_called_indivisible(tmp_path: Path) -> None:
    _, trace, line = _run(tmp_path, "uneven_gather", UNEVEN_GATHER)
    with tputrace.open(trace) as opened:
        assert opened.sql("SELECT DISTINCT algorithm FROM collectives WHERE kind = 'all_gather'") == [("gloo:uneven",)]
        report = analyze(opened)
    assert not [finding.title for finding in report.findings if "not divisible" in finding.title]


def test_a_rank_timing_out_for_a_stalled_peer_names_the_peer_and_its_last_line(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "stalled", STALLED_RANK, expect_ok=False)
    report = _report(trace)
    timed_out = [finding for finding in report.findings if finding.title.startswith("Rank 1 timed out in all_reduce")]
    assert len(timed_out) == 1 and timed_out[0].severity == "critical", [finding.title for finding in report.findings]
    assert timed_out[0].file is not None and Path(timed_out[0].file).name == script.name and timed_out[0].line == line
    assert "waiting for rank 0" in timed_out[0].title and f"{script.name}:{line}" in timed_out[0].explanation


def test_fsdp_groups_of_several_sizes_are_no_storm_and_their_collective_cuts_no_warning(tmp_path: Path) -> None:
    """FSDP2 groups of three sizes: the copy-out slices take each group's length in the first step and reuse them
    (one compile per group, not a length that changes), and the collectives that cut each step's programs are the
    sharding's own: no recompile storm, and no warning for the cuts."""
    _, trace, _ = _run(tmp_path, "fsdp_groups", FSDP_GROUPS)
    report = _report(trace)
    titles = [finding.title for finding in report.findings]
    assert not [title for title in titles if title.startswith("Recompilation storm")], titles
    cuts = [finding for finding in report.findings if finding.title.startswith("Fragmented fusion")]
    assert all(finding.severity == "info" for finding in cuts), [(finding.severity, finding.title) for finding in cuts]
    assert not [finding for finding in report.findings if finding.severity != "info"], titles
