"""Training scripts written as a user porting a GPU model would, each with a problem planted at a known line,
run under `tputrace run` in a subprocess: the report's findings are the planted problem at its line, and
no finding blames work that the loop does every step on set-up or on the warm-up step."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from test_problems import record

import tputrace
from tputrace.analysis import Report
from tputrace.analysis.chips import chip
from tputrace.analysis.context import AnalysisContext

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

CLIPPED_LOSS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 300), nn.GELU(), nn.Linear(300, 100)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(100, 300).to("tpu"), torch.randn(100, 100).to("tpu")
    for step in range(6):
        loss = nn.functional.mse_loss(model(x), y)
        if loss > 10.0:  {marker}
            loss = loss * 0.1
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

CTC = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 12)).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctc = nn.CTCLoss(blank=0)
    feats, targets = torch.randn(50, 4, 40).to("tpu"), torch.randint(1, 12, (4, 10)).to("tpu")
    lengths, target_lengths = torch.full((4,), 50), torch.full((4,), 10)
    for step in range(5):
        loss = ctc(model(feats).log_softmax(-1), targets, lengths, target_lengths)  {marker}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

GUARDED_BLOCK = '''
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.fc, self.norm = nn.Linear(width, width), nn.LayerNorm(width)

        def forward(self, x):
            h = self.fc(x)
            if h.abs().max() > 1e3:  {marker}
                h = h.clamp(-1e3, 1e3)
            return self.norm(h + x)

    torch.manual_seed(0)
    model = nn.Sequential(Block(64), nn.Linear(64, 3)).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(5):
        loss = nn.functional.cross_entropy(model(torch.randn(16, 64, device="tpu")), torch.arange(16, device="tpu") % 3)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''

GRAD_SCALER = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 128)).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("tpu")
    x = torch.randn(32, 128, device="tpu")
    for step in range(5):
        with torch.autocast("tpu", dtype=torch.float16):
            loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)  {marker}
        scaler.update()
    print(loss.item())
'''

CUDA_TIMING = '''
    import time
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(5):
        start = time.perf_counter()
        x = torch.randn(64, 128, device="cuda")
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()  {marker}
        print(f"step {{step}}: {{(time.perf_counter() - start) * 1e3:.1f}} ms")
'''

SET_UP_THEN_TWO_STEPS = '''
    import torch
    from torch import nn

    model = nn.Linear(32, 8).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32, device="tpu")
    torch.tpu.synchronize()  {marker}
    for step in range(2):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''

PRINTED_SHAPE = '''
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 128), nn.Linear(128, 16)

        def forward(self, x):
            h = torch.relu(self.a(x))
            print("hidden", h.shape)  {marker}
            return self.b(h)

    torch.manual_seed(0)
    net = Net().to("tpu")
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    compiled = torch.compile(net, backend="tpu")
    x = torch.randn(32, 64, device="tpu")
    for step in range(4):
        loss = compiled(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
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


POLICY_GRADIENT = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4)).to("tpu")
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    for episode in range(4):
        state, log_probs = torch.randn(8, device="tpu"), []
        for t in range(6):
            dist = torch.distributions.Categorical(logits=policy(state))  {marker}
            action = dist.sample()
            log_probs.append(dist.log_prob(action))
            state = state * 0.9 + 0.1 * torch.randn_like(state)
        loss = -torch.stack(log_probs).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''

CAUSAL_ENCODER = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    encoder, head = nn.TransformerEncoder(layer, 1).to("tpu"), nn.Linear(64, 8).to("tpu")
    optimizer = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.01)
    mask = nn.Transformer.generate_square_subsequent_mask(16, device="tpu")
    x = torch.randn(4, 16, 64, device="tpu")
    for step in range(5):
        loss = head(encoder(x, mask=mask)).pow(2).mean()  {marker}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''

FLATTENED_ROWS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(4):
        x = torch.randn(10, 32, 256, device="tpu")  {marker}
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''

TABLE_MADE_ONCE = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device="tpu")
    torch.tpu.synchronize()
    for step in range(10):
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 5:
            print("loss", loss.item())  {marker}
            table = torch.randn(512, 512).to("tpu")
'''

RANDOM_TEACHER_FORCING = '''
    import random
    import torch
    from torch import nn

    random.seed(0)
    torch.manual_seed(0)
    cell, out = nn.GRUCell(16, 16).to("tpu"), nn.Linear(16, 16).to("tpu")
    optimizer = torch.optim.SGD([*cell.parameters(), *out.parameters()], lr=0.01)
    for step in range(5):
        h, x = torch.zeros(4, 16, device="tpu"), torch.randn(4, 16, device="tpu")
        for t in range(5):
            h = cell(x, h)
            if random.random() < 0.5:  {marker}
                x = out(h)
            else:
                x = torch.tanh(h)
        loss = h.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''

READ_BEFORE_THE_LOOP = '''
    import torch
    from torch import nn

    model = nn.Linear(32, 8).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32, device="tpu")
    print("initial output", model(x).sum().item())  {marker}
    for step in range(5):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''

ALTERNATING_COMPILED_BATCH = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        batch = 16 if step % 2 == 0 else 12
        x = torch.randn(batch, 32, device="tpu")
        loss = compiled(x).pow(2).mean()  {marker}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
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
    assert sync.title.startswith(f"Host sync 4 times per step at {script.name}:{line} (item)"), sync.title
    analyzers = {finding.analyzer for finding in report.findings}
    assert "host_bound" not in analyzers and "recompiles" not in analyzers
    model_line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "model = " in text)
    assert not [f for f in report.findings if f.analyzer == "transfers" and f.line == model_line]


def test_a_python_if_on_the_loss_is_a_sync_whose_stall_each_is_the_titles(tmp_path: Path) -> None:
    """One bool sync a step: the evidence's stall per sync is the steady steps' like the title's per-step
    stall, not an average with the warm-up step's first, slower runs; the 300-wide layers are padding."""
    report, script, line = _run(tmp_path, "clipped_loss", CLIPPED_LOSS)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert sync.title.startswith(f"Host sync every step at {script.name}:{line} (bool): "), sync.title
    per_step = sync.title.rsplit(": ", 1)[1].removesuffix(" stalled per step")
    assert f"1 time per step, {per_step} stall each in the steady steps" in sync.evidence[0].text, sync.evidence[0].text
    assert any(finding.analyzer == "padding" and "dim 300" in finding.title for finding in report.findings)


def test_a_loss_with_no_lowering_is_one_fallback_finding_with_its_backward(tmp_path: Path) -> None:
    """CTC's forward and backward both run on the host: one finding at the loss's line, costing both (the
    backward's line is `loss.backward()`, where nothing can be changed), with the steady steps' time per call."""
    report, script, line = _run(tmp_path, "ctc", CTC)
    (fallback,) = [finding for finding in report.findings if finding.analyzer == "fallbacks"]
    assert (fallback.file, fallback.line) == (str(script), line), fallback.title
    assert fallback.title.startswith(f"CPU fallback: aten._ctc_loss.default runs on the host at {script.name}:{line}")
    assert "aten._ctc_loss_backward.default" in fallback.evidence[1].text and fallback.evidence[1].line == line + 2
    assert "each including transfers in the steady steps" in fallback.explanation
    assert fallback is report.findings[0]


def test_a_read_in_a_modules_forward_is_said_to_be_at_its_line(tmp_path: Path) -> None:
    """The `if` is in the user's own forward: the suggestion says the read is at that line, not that the
    line may only call a library module holding it."""
    report, script, line = _run(tmp_path, "guarded_block", GUARDED_BLOCK)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert sync.module == "Sequential.0"
    assert sync.suggestion.startswith(f"The read is in the forward of Sequential.0, at {script.name}:{line}: `if tensor:`"), sync.suggestion


def test_a_grad_scaler_read_is_named_and_bfloat16_suggested(tmp_path: Path) -> None:
    """GradScaler.step reads its overflow flag every step inside the call: the finding names that read and
    suggests bfloat16 autocast without a scaler, not the loss-logging advice for a `.item()` at the line. Its
    share is of the steady steps' time less their compiles, which the second step's recompile (AdamW's and
    the scaler's first updates) would dilute."""
    report, script, line = _run(tmp_path, "grad_scaler", GRAD_SCALER)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "`torch.amp.GradScaler.step` reading whether the float16 gradients overflowed" in sync.explanation
    assert sync.suggestion.startswith("On a TPU, autocast to `torch.bfloat16`"), sync.suggestion
    share = re.search(r"\((\d+)% of the steady steps' time\)", sync.explanation)
    assert share is not None, sync.explanation
    (sync_line,) = [read for read in report.results["syncs"].data.lines if read.where == f"{script.name}:{line}"]
    with tputrace.open(tmp_path / "grad_scaler.tptrace") as trace:
        context = AnalysisContext.build(trace, chip(None), True)
        with_compiles = context.share_of_steps((sync_line.stall_per_step_ns or 0) * context.steady_count)
        assert context.steady_compile_ns > 0 and int(share[1]) > 2 * 100 * with_compiles, (share[1], with_compiles)


def test_a_synchronize_per_step_for_timing_is_a_sync_at_its_line(tmp_path: Path) -> None:
    """A CUDA script timing its steps calls `torch.cuda.synchronize()` every step; under `--as-cuda` that
    waits for the chip like a read, so it is recorded and reported as a host sync at its line."""
    report, script, line = _run(tmp_path, "cuda_timing", CUDA_TIMING, ("--as-cuda",))
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert sync.title.startswith(f"Host sync every step at {script.name}:{line} (synchronize)"), sync.title
    assert "`tputrace run` records each step's time" in sync.suggestion


def test_a_synchronize_before_a_two_step_loop_is_set_up(tmp_path: Path) -> None:
    """The synchronize that the set-up-work finding suggests runs before the loop, in the warm-up step,
    which a loop of two steps counts as steady: it is not a sync in the loop."""
    report, _, _ = _run(tmp_path, "set_up_then_two_steps", SET_UP_THEN_TWO_STEPS)
    assert not [finding.title for finding in report.findings if finding.analyzer == "syncs"]


def test_a_graph_break_without_a_sync_costs_its_compiles_once(tmp_path: Path) -> None:
    """A print of a shape breaks the compiled graph but reads no value: the finding costs the resumed
    graph's compiles, once, with no per-step figure (not `0 ns per step`)."""
    report, script, line = _run(tmp_path, "printed_shape", PRINTED_SHAPE)
    (graph_break,) = [finding for finding in report.findings if finding.analyzer == "graph_breaks"]
    assert (graph_break.file, graph_break.line) == (str(script), line), graph_break.title
    assert graph_break.cost_total_ns > 0 and graph_break.cost_per_step_ns is None


def test_a_loop_line_flushed_apart_in_the_second_step_is_not_set_up_work(tmp_path: Path) -> None:
    """A sync in the second step runs that step's new batch as a graph of its own, so the step's graph
    compiles without it; the batch's line runs every step, so it is not set-up left pending before the loop.
    The read, made once, is not said to recur every 4 steps."""
    report, script, line = _run(tmp_path, "logged_once", LOGGED_ONCE)
    assert not [finding for finding in report.findings if finding.analyzer == "set_up_work"], report.findings[0].title
    top = report.findings[0]
    assert (top.analyzer, top.file, top.line) == ("syncs", str(script), line), top.title
    assert top.title.startswith(f"Host sync in one step at {script.name}:{line}"), top.title  # one read has no period


def test_ddp_second_forward_is_not_set_up_work(tmp_path: Path) -> None:
    """DDP's second forward makes a collective of its own, which flushes the batch made on the chip at the
    loop's top apart from the step's graph; the report blames no set-up line for the recompile. Those recompiles,
    and the bucket views' new offsets after DDP rebuilds its buckets, are one finding at the `DDP(...)` line that
    says they are paid once."""
    report, script, line = _run(tmp_path, "ddp", DDP, ("--nproc", "2"))
    assert not [finding for finding in report.findings if finding.analyzer == "set_up_work"], report.findings[0].title
    assert any(f.analyzer == "syncs" and (f.file, f.line) == (str(script), line) for f in report.findings)
    (rebuild,) = [finding for finding in report.findings if finding.title.startswith("DDP rebuilt its gradient buckets")]
    ddp_line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "DDP(" in text)
    assert (rebuild.analyzer, rebuild.line, rebuild.cost_total_ns) == ("recompiles", ddp_line, 0.0), rebuild.title
    data = report.results["recompiles"].data
    assert data.ddp_rebuilds[0].recompiles == data.recompiles, (data.ddp_rebuilds, data.recompiles)


def test_a_compiled_models_batch_alternating_two_sizes_is_explained_at_its_call(tmp_path: Path) -> None:
    """A compiled model called with batches of 16 and 12 fails Dynamo's size guard once, is traced again with a
    dynamic batch, and the tpu backend compiles the dynamic graph and the eager programs around it per size: one
    finding at the call explains every recompile, once, and names the ways to give the function one size."""
    report, script, line = _run(tmp_path, "alternating_compiled_batch", ALTERNATING_COMPILED_BATCH)
    (dynamic,) = [finding for finding in report.findings if finding.title.startswith("torch.compile traced")]
    assert (dynamic.analyzer, dynamic.file, dynamic.line) == ("recompiles", str(script), line), dynamic.title
    assert "dim 0 changed (16 -> 12)" in dynamic.title and dynamic.cost_per_step_ns is None
    assert "drop_last=True" in dynamic.suggestion and "dynamic=False" in dynamic.suggestion
    assert "mark_dynamic(x, 0)" in dynamic.suggestion
    data = report.results["recompiles"].data
    (record,) = data.dynamic_sizes
    assert record.recompiles == data.recompiles and record.sizes == (12, 16), (record, data.recompiles)  # ascending
    assert record.recompile_ns == data.recompile_ns  # the batch flushed while Dynamo traced is in the guard's time


def test_a_distributions_argument_check_is_named_with_its_switch(tmp_path: Path) -> None:
    """`torch.distributions` checks its arguments with a bool read (`validate_args`, on by default) in each
    distribution made and each `log_prob`: the sync and the fragmented-fusion findings name that check and its
    switch, not an `if` at the user's line, which has none."""
    report, script, line = _run(tmp_path, "policy_gradient", POLICY_GRADIENT)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "`torch.distributions` checking a distribution's parameters" in sync.explanation, sync.explanation
    assert "set_default_validate_args(False)" in sync.suggestion and "torch.where" not in sync.suggestion
    (fusion,) = [finding for finding in report.findings if finding.analyzer == "fusion"]
    assert fusion.line in (line, line + 2), fusion.title
    assert "set_default_validate_args(False)" in fusion.suggestion, fusion.suggestion


def test_an_encoders_causal_mask_check_is_named_with_its_switch(tmp_path: Path) -> None:
    """`nn.TransformerEncoder` compares a mask given without `is_causal` with a causal one on the host every
    call: the finding names that comparison and `is_causal=True`, not an `if` in the user's line."""
    report, script, line = _run(tmp_path, "causal_encoder", CAUSAL_ENCODER)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert "`_detect_is_causal_mask`" in sync.explanation, sync.explanation
    assert sync.suggestion.startswith("Tell the encoder what the mask is"), sync.suggestion


def test_a_batch_times_length_contracted_in_the_weight_gradients_is_not_a_model_dim(tmp_path: Path) -> None:
    """A (10, 32, 256) batch is 320 rows for each linear layer, which the weights' gradients contract over: the
    padding finding calls 320 the layers' input rows and changes the batch, not a model dim of 320 (there is none),
    and it points at a layer taking those rows."""
    report, _, _ = _run(tmp_path, "flattened_rows", FLATTENED_ROWS)
    (padding,) = [finding for finding in report.findings if finding.analyzer == "padding"]
    assert padding.title.startswith("Tile padding: input rows 320 is off the MXU"), padding.title
    assert padding.suggestion.startswith("320 is the number of rows Sequential.0 takes"), padding.suggestion
    assert "choose a batch (and length) that make 256 (or 512) rows" in padding.suggestion
    assert padding.module == "Sequential.0"


def test_a_table_made_once_in_the_loop_is_no_memory_growth(tmp_path: Path) -> None:
    """A 1 MiB table made in one step and kept raises the live bytes once: that is no growth 'every step'."""
    report, _, _ = _run(tmp_path, "table_made_once", TABLE_MADE_ONCE)
    assert not [finding.title for finding in report.findings if finding.analyzer == "memory"]


def test_a_copy_and_a_read_made_in_one_step_are_costed_once(tmp_path: Path) -> None:
    """A table copied to the chip and a loss read in one step of ten: each costs its time once, with no per-step
    figure that a run of many steps would multiply, and the copy is not said to recur every step."""
    report, script, line = _run(tmp_path, "table_made_once", TABLE_MADE_ONCE)
    (copy,) = [finding for finding in report.findings if finding.analyzer == "transfers"]
    assert copy.title.startswith(f"Host-to-chip copy in one step at {script.name}:{line + 1}: 1.00 MiB"), copy.title
    assert copy.cost_per_step_ns is None and "every step" not in copy.suggestion.replace("not every step", "")
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert sync.cost_per_step_ns is None and sync.title.startswith(f"Host sync in one step at {script.name}:{line}")


def test_a_random_choice_per_time_step_is_a_structure_change_every_step(tmp_path: Path) -> None:
    """A Python `random` choice between two ops at each time step makes each step's graph another program, compiled
    again every step with no shape changed: one recompiles finding at a line of the loop body, costing those
    recompiles, that says to choose on the chip."""
    report, script, line = _run(tmp_path, "random_teacher_forcing", RANDOM_TEACHER_FORCING)
    (changes,) = [finding for finding in report.findings if finding.title.startswith("The step's ops change")]
    assert changes.analyzer == "recompiles" and changes.line in range(line - 1, line + 4), (changes.line, changes.title)
    assert "torch.where" in changes.suggestion and changes.cost_per_step_ns is not None
    data = report.results["recompiles"].data
    (storm,) = data.structure_storms
    assert storm.recompiles >= 2 and changes.cost_total_ns == storm.recompile_ns


def test_a_read_before_the_loop_is_set_up_not_a_one_off(tmp_path: Path) -> None:
    """A value read before the loop falls in the warm-up step: it is set-up, which no sync finding lists, not a one-off
    read of the loop costed once."""
    report, _, line = _run(tmp_path, "read_before_the_loop", READ_BEFORE_THE_LOOP)
    assert not [finding.title for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
