"""More distributed scripts as a user porting from GPUs writes them, run on two virtual chips under
`tputrace run --nproc 2`: a problem planted at a marked line is named there, with figures and a fix that fit
what the script does."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_distributed import HEADER, _report, _run

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

# Rank 0 broadcasts its running statistics at step 2 where rank 1 all-reduces them: the group pairs the two calls, and
# both wait for the group's timeout.
MISMATCHED_KINDS = HEADER.replace('dist.init_process_group("tpu")', 'dist.init_process_group("tpu", timeout=__import__("datetime").timedelta(seconds=20))') + '''
    stats = torch.ones(128, device="tpu")
    for step in range(4):
        stats = stats * 1.01
        if step == 2 and rank == 0:
            dist.broadcast(stats, src=0)  {marker}
        else:
            dist.all_reduce(stats)
        print(rank, step, stats.sum().item(), flush=True)
    dist.destroy_process_group()
'''

# Gradients synchronised by hand, one all_reduce per parameter, where DDP would bucket them.
PER_PARAMETER_REDUCE = HEADER + '''
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)).to("tpu")
    for parameter in model.parameters():
        dist.broadcast(parameter.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    for step in range(6):
        x = torch.randn(32, 64, generator=generator).to("tpu")
        y = torch.randint(0, 10, (32,), generator=generator).to("tpu")
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)  {marker}
            parameter.grad /= world
        optimizer.step()
    dist.destroy_process_group()
'''

# A wrap policy by layer type, written out: fully_shard on every Linear and LayerNorm, none on the blocks (--clean
# wraps each block once).
LEAF_WRAPPED_FSDP = HEADER + '''
    from torch.distributed.fsdp import fully_shard
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(128)
            self.fc1, self.fc2 = nn.Linear(128, 256), nn.Linear(256, 128)
        def forward(self, x):
            return x + self.fc2(torch.relu(self.fc1(self.norm(x))))
    model = nn.Sequential(*[Block() for _ in range(4)], nn.Linear(128, 10)).to("tpu")
    for module in model.modules():
        if isinstance(module, Block if CLEAN else (nn.Linear, nn.LayerNorm)):
            fully_shard(module)  {marker}
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    for step in range(5):
        x = torch.randn(32, 128, generator=generator).to("tpu")
        y = torch.randint(0, 10, (32,), generator=generator).to("tpu")
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''

# Every rank's metrics gathered as Python objects, one call each, and rank 0's stopping decision broadcast as one, every
# step, as logging code for GPUs often does: 10 small collectives a step.
OBJECT_METRICS = HEADER + '''
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to("tpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    history = []
    for step in range(8):
        x = torch.randn(32, 64, generator=generator).to("tpu")
        y = torch.randint(0, 10, (32,), generator=generator).to("tpu")
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        metrics = {{"loss": loss, "acc": (logits.argmax(1) == y).float().mean(), "top": logits.max(), "norm": logits.norm()}}
        means = {{}}
        for name, value in metrics.items():
            gathered = [None] * world
            dist.all_gather_object(gathered, value.item())  {marker}
            means[name] = sum(gathered) / world
        history.append(means)
        stop = [history[-1]["loss"] < 0.01] if rank == 0 else [None]
        dist.broadcast_object_list(stop, src=0)
        if stop[0]:
            break
    dist.destroy_process_group()
'''

# An auxiliary head used on even steps only, under DDP without find_unused_parameters (refused on tpu anyway): DDP raises
# at the forward after the first step that skipped it, as it does on CUDA.
SKIPPED_HEAD = HEADER + '''
    from torch.nn.parallel import DistributedDataParallel
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head, self.aux = nn.Linear(64, 64), nn.Linear(64, 10), nn.Linear(64, 10)
        def forward(self, x, with_aux):
            h = torch.relu(self.body(x))
            return self.head(h) + self.aux(h) if with_aux else self.head(h)
    model = DistributedDataParallel(Net().to("tpu"))  {marker}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(4):
        loss = model(torch.randn(16, 64, device="tpu"), with_aux=step % 2 == 0).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()
'''


def test_a_broadcast_one_rank_issues_for_the_others_all_reduce_is_out_of_step_not_a_broadcast_to_remove(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "mismatched_kinds", MISMATCHED_KINDS, expect_ok=False)
    report = _report(trace)
    order = [finding for finding in report.findings if finding.title.startswith("Ranks issue collectives out of step")]
    assert len(order) == 1, [finding.title for finding in report.findings]
    assert order[0].line == line and Path(order[0].file or "").name == script.name
    assert f"call 3 on process group 0 is broadcast at {script.name}:{line} on rank 0, but rank 1: all_reduce of 512 B at {script.name}:{line + 2}" in order[0].title
    # the calls that waited for the group's timeout are the mismatch's: no share of collectives asks to broadcast less
    share = [finding for finding in report.findings if finding.title.startswith("Collectives") and " take " in finding.title]
    assert not share, [(finding.title, finding.suggestion) for finding in share]


def test_gradients_reduced_one_parameter_at_a_time_are_named_with_ddp_or_one_flat_call(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "per_parameter", PER_PARAMETER_REDUCE)
    report = _report(trace)
    share = [finding for finding in report.findings if finding.title.startswith("Collectives take")]
    assert len(share) == 1, [finding.title for finding in report.findings]
    finding = share[0]
    assert finding.line == line and Path(finding.file or "").name == script.name
    # 6 parameters (3 weights, 3 biases): 26,122 floats a step
    assert any("all_reduce, 6 calls a step: 102 KiB a step" in item.text and item.line == line for item in finding.evidence), finding.evidence
    suggestion = finding.suggestion or ""
    assert suggestion.startswith(f"all_reduce at {script.name}:{line} runs 6 times a step, one call per tensor"), suggestion
    assert "DistributedDataParallel" in suggestion and "_flatten_dense_tensors" in suggestion


def test_fsdp_groups_of_one_layer_each_are_named_with_the_blocks_to_wrap(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "leaf_wrapped", LEAF_WRAPPED_FSDP)
    report = _report(trace)
    found = [finding for finding in report.findings if finding.title.startswith("FSDP2 wraps single layers")]
    assert len(found) == 1, [finding.title for finding in report.findings]
    finding = found[0]
    assert finding.line == line and Path(finding.file or "").name == script.name
    # 4 blocks of a LayerNorm (1 KiB) and two Linears (129 KiB, 128.5 KiB); each group gathered twice and reduced once a step
    assert finding.title == ("FSDP2 wraps single layers: 12 fully_shard groups of 86.2 KiB on average in 4 modules that have none of "
                             "their own, 36 calls per step"), finding.title
    assert "FSDPSequential.0 (3 layers)" in finding.explanation and "about 12" in finding.explanation
    assert finding.cost_per_step_ns and finding.cost_per_step_ns > 0
    _, clean_trace, _ = _run(tmp_path, "leaf_wrapped", LEAF_WRAPPED_FSDP, "--clean")
    assert not [finding.title for finding in _report(clean_trace).findings if finding.title.startswith("FSDP2 wraps single layers")]


def test_metrics_gathered_as_objects_every_step_are_told_to_go_as_one_tensor(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "object_metrics", OBJECT_METRICS)
    report = _report(trace)
    small = [finding for finding in report.findings if finding.title.startswith("Many small collectives")]
    assert len(small) == 1, [finding.title for finding in report.findings]
    assert small[0].title.startswith("Many small collectives: 10 messages under 1.00 MiB per step"), small[0].title
    # all_gather_object: the pickled lengths (int64), then the bytes, for each of 4 metrics; the same fix where the share says one
    share = [finding for finding in report.findings if finding.title.startswith("Collectives") and " take " in finding.title]
    assert all(finding.line == line for finding in share), [(finding.title, finding.line) for finding in share]  # not DDP's backward
    for finding in small + share:
        suggestion = finding.suggestion or ""
        assert suggestion.startswith(f"The all_gather calls at {script.name}:{line} carry pickled Python objects (`all_gather_object`: "
                                     "the lengths as int64, then the bytes, 8 calls a step)"), suggestion
        assert "one tensor on the chip" in suggestion


def test_parameters_a_ddp_step_left_without_gradients_are_named(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "skipped_head", SKIPPED_HEAD, expect_ok=False)
    report = _report(trace)
    found = [finding for finding in report.findings if finding.title.startswith("DDP: ")]
    assert len(found) == 1, [finding.title for finding in report.findings]
    finding = found[0]
    assert finding.title == "DDP: module.aux.weight, module.aux.bias got no gradient in a step, so rank 0 stopped at the next forward"
    assert finding.severity == "critical" and finding.line == line and Path(finding.file or "").name == script.name
    assert [item.text for item in finding.evidence] == ["module.aux.weight: index 4, (10,64)", "module.aux.bias: index 5, (10)"]
    assert "0.0 *" in (finding.suggestion or "")
