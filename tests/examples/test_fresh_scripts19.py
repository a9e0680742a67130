"""Single-chip scripts of kinds that read wrong before: a `torch.compile`d function whose failed recompile stopped the
run (told that the function gains nothing from compiling, Dynamo's pointer to more logs in the title); an early stop
on a validation loss read every step (told to make the decision `torch.where` arithmetic); a logged
`scaler.get_scale()` beside a loss's `.item()` (told of one read a step); a model split between the host and the chip
whose backward copies a gradient back (told to drop a `.cpu()`); an EMA update whose recompile on the host read as
the chip's pace, and its sampling loop after training, unrolled into one program, read as nothing; an ensemble's
members read one by one after the first optimizer step, compiled once each, read as a storm; and, in strict
mode, a language model's shifted tokens (one shorter than the padded batch) read as a second storm of unrelated
sizes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_fresh_scripts import _run

from tputrace.analysis import analyze_path
from tputrace.cli.main import main

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

MARKED_DYNAMIC = '''
    import torch

    def step(x):
        if x.shape[0] == 4:
            return x.sum()
        return (x * 2).sum()

    compiled = torch.compile(step, backend="aot_eager")
    compiled(torch.randn(8, 16))
    y = torch.randn(4, 16)
    torch._dynamo.mark_dynamic(y, 0)
    compiled(y)
'''


def test_a_failed_recompile_that_stopped_the_run_is_told_as_a_stop(tmp_path: Path) -> None:
    """The recompile's ConstraintViolationError ended the run: the title quotes the error without Dynamo's `For more
    information, run with TORCH_LOGS=...` tail, and the suggestion says the run stops at the call until it is fixed,
    not that the function gains nothing from `torch.compile` (it ran compiled before)."""
    script = tmp_path / "marked_dynamic.py"
    script.write_text(textwrap.dedent(MARKED_DYNAMIC))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TORCH_TRACE": str(tmp_path / "logs")})
    assert result.returncode != 0 and "ConstraintViolationError" in result.stderr, result.stderr[-2000:]
    assert main(["import", str(tmp_path / "logs"), "-o", str(tmp_path / "md.tptrace")]) == 0
    (finding,) = [finding for finding in analyze_path(tmp_path / "md.tptrace").findings
                  if "ConstraintViolationError" in finding.explanation]
    assert finding.title.endswith("Constraints violated (L['x'].size()[0]); the error stopped the run"), finding.title
    assert "For more information" not in finding.title + finding.explanation, finding.explanation
    assert "gains nothing" not in finding.suggestion, finding.suggestion
    assert "Until that is fixed, the run stops at this call (the calls before it ran step's compiled code)." \
        in finding.suggestion, finding.suggestion
    assert finding.suggestion.count("TORCHDYNAMO_VERBOSE") == 1, finding.suggestion

EARLY_STOP = '''
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Swish(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * torch.sigmoid(x)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            s = torch.sigmoid(x)
            return grad * (s + x * s * (1 - s))


    torch.manual_seed(0)
    lin, head = nn.Linear(16, 32).to("tpu"), nn.Linear(32, 4).to("tpu")
    opt = torch.optim.SGD([*lin.parameters(), *head.parameters()], lr=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=5)
    scaler = torch.amp.GradScaler("tpu")
    xv, yv = torch.randn(32, 16, device="tpu"), torch.randint(0, 4, (32,), device="tpu")
    best, bad = float("inf"), 0
    for step in range(5):
        x, y = torch.randn(32, 16, device="tpu"), torch.randint(0, 4, (32,), device="tpu")
        loss = F.cross_entropy(head(Swish.apply(lin(x))), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        print(step, loss.item(), scaler.get_scale())
        with torch.no_grad():
            val = F.cross_entropy(head(Swish.apply(lin(xv))), yv).item()  {marker}
        if val < best:
            best, bad = val, 0
        else:
            bad += 1
            if bad >= 3:
                break
    print(best)
'''


SPLIT = '''
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    table = nn.EmbeddingBag(2000, 32, mode="mean")  # left on the host
    tower = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")
    opt = torch.optim.Adam([*table.parameters(), *tower.parameters()], lr=1e-3)
    for step in range(4):
        ids = torch.randint(0, 2000, (16, 8))
        h = table(ids).to("tpu")
        loss = F.binary_cross_entropy_with_logits(tower(h), torch.rand(16, 1, device="tpu"))
        opt.zero_grad()
        loss.backward()  {marker}
        opt.step()
    print(loss.item())
'''


def test_reads_the_line_does_not_show_or_cannot_drop_are_told_the_change_that_removes_them(tmp_path: Path) -> None:
    """The validation loss read every step decides a branch whose `else` ends the loop: a decision only the host can
    take, told to compute and check it every N steps, not to become `torch.where` arithmetic; a logged loss beside
    `scaler.get_scale()`, two reads a step, is told of the scale's `.item()`. An embedding bag left
    on the host, its output copied to the chip: `loss.backward()` copies that output's gradient back for the host
    part's backward, a wait every step that the copy-in's line explains, not a `.cpu()` the backward's line could
    drop."""
    report, script, line = _run(tmp_path, "early_stop", EARLY_STOP)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert sync.suggestion.startswith(f"The value read into `val` decides at {script.name}:{line + 1} (`if val < best:`) "
                                      f"whether the loop ends (`break` at {script.name}:{line + 6})"), sync.suggestion
    assert "every N steps" in sync.suggestion and "torch.where" not in sync.suggestion, sync.suggestion
    (logged,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line - 2]
    assert logged.title.startswith(f"Host sync 2 times per step at {script.name}:{line - 2} (item)"), logged.title
    assert logged.suggestion.startswith("The line reads 2 values one after another, each a wait for the chip: 1 value by "
                                        "`.item()` and the loss scale by `scaler.get_scale()`"), logged.suggestion
    report, script, line = _run(tmp_path, "split", SPLIT)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]
    assert f"the gradient of what {script.name}:{line - 3} copied to the chip" in sync.explanation, sync.explanation
    assert sync.suggestion.startswith(f"Nothing at {script.name}:{line} can change: move the part of the model that runs "
                                      f"on the host before {script.name}:{line - 3} to the chip"), sync.suggestion

EMA = '''
    import copy
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 8)).to("tpu")
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(5):
        x, y = torch.randn(1024, 256, device="tpu"), torch.randint(0, 8, (1024,), device="tpu")
        loss = F.cross_entropy(checkpoint(model, x, use_reentrant=False), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for kept, trained in zip(ema.parameters(), model.parameters()):
                kept.lerp_(trained, 0.01)  {marker}
    print(loss.item())
    with torch.no_grad():
        z = torch.randn(4, 256, device="tpu")
        for t in range(8):
            z = z * 0.9 + ema(z).mean(1, keepdim=True) * 0.1
    print(z.abs().mean().item())
'''


ENSEMBLE = '''
    import copy
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.func import functional_call, stack_module_state, vmap

    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("tpu") for _ in range(4)]
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    opt = torch.optim.Adam(params.values(), lr=1e-3)
    for step in range(5):
        x, y = torch.randn(64, 16, device="tpu"), torch.randint(0, 4, (64,), device="tpu")
        logits = vmap(lambda p, b, x: functional_call(base, (p, b), (x,)), in_dims=(0, 0, None))(params, buffers, x)
        loss = sum(F.cross_entropy(member, y) for member in logits)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(step, [round(F.cross_entropy(member, y).item(), 3) for member in logits])  {marker}
'''


def test_compiles_in_the_first_iterations_tail_are_no_chip_pace_nor_storm(tmp_path: Path) -> None:
    """The EMA update after `optimizer.step()` runs in the next step's graph, which compiles again in step 1 on the
    host while the chip waits for it: the chip's time per step, where the host ran ahead of it, leaves that wait out
    (with it, the 4 steady steps' mean is at least a quarter of the recompile); the update's own finding stays. The
    EMA model's sampling loop after training reads nothing until it ends: one program of its 8 iterations. An
    ensemble's members read one by one after the first optimizer step compiled a program per row once, in that
    iteration's tail, and ran them from the cache after it: a fixed set of positions, no storm."""
    report, script, line = _run(tmp_path, "ema", EMA)
    (unrolled,) = [finding for finding in report.findings if finding.title.startswith("A loop ran unrolled")]
    assert unrolled.title.startswith(f"A loop ran unrolled: 8 iterations of {script.name}:{line + 5} fused into one "
                                     "program"), unrolled.title
    assert "after the training loop's last step" in unrolled.explanation, unrolled.explanation
    (after,) = [finding for finding in report.findings if finding.title.startswith(f"Work at {script.name}:{line} after")]
    assert "compiled again in step 1" in after.title, after.title
    assert report.chip_pace is None or report.chip_pace.mean_step_ns * 4 < after.cost_total_ns, (
        report.chip_pace, after.cost_total_ns)
    report, script, line = _run(tmp_path, "ensemble", ENSEMBLE)
    assert not [finding for finding in report.findings if finding.analyzer == "recompiles"], [
        finding.title for finding in report.findings]
    assert [finding for finding in report.findings if finding.analyzer == "syncs" and finding.line == line]


LM_SHIFT = '''
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    emb = nn.Embedding(100, 32).to("tpu")
    head = nn.Linear(32, 100).to("tpu")
    head.weight = emb.weight
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    for length in (12, 16, 14, 16, 10, 13):
        tokens = torch.randint(1, 100, (4, length)).to("tpu")  {marker}
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = head(torch.tanh(emb(inputs)))
        loss = F.cross_entropy(logits.reshape(-1, 100), targets.reshape(-1), label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_a_language_models_shifted_tokens_are_the_padded_batchs_storm_in_strict_mode(tmp_path: Path) -> None:
    """Batches padded each to their own length, shifted into inputs and targets one token shorter: in strict mode the
    programs whose dims are the batch times that shorter length are the copied batch's storm, one finding at the line
    that made it, its title counting every program it lists."""
    report, script, line = _run(tmp_path, "lm_shift", LM_SHIFT, ("--mode", "strict"))
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert (storm.file, storm.line) == (str(script), line), storm.title
    assert f"as the batches made at {script.name}:{line} change shape (5 sizes)" in storm.title, storm.title
    listed = storm.explanation.split("compiled once per size: ", 1)[1].split(". ", 1)[0]
    more = int(listed.rsplit(" and ", 1)[1].split(" ", 1)[0])
    assert storm.title.startswith(f"Recompilation storm: {listed.count('×') + more} programs compiled"), storm.title
