"""Scripts that run `torch.compile(backend="tpu")` as users write them, read wrong before: a compiled forward that
reads numbers from its tensors (`.item()`, numpy of `.tolist()`) and goes on with them, breaking its graph and tracing
the part after the break again for every new number; a sequence length that grows; a compiled `optimizer.step()`
beside an LR scheduler; a `fullgraph=True` router that loops over the experts its tokens chose."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_problems import ROOT, record

import tputrace
from tputrace.analysis import analyze_path, host_bound
from tputrace.analysis.chips import chip
from tputrace.analysis.context import AnalysisContext
from tputrace.summary import render_text as render_summary
from tputrace.summary import summarize

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

READ_IN_FORWARD = '''
    import numpy as np
    import torch
    from torch import nn

    torch.manual_seed(0)


    class Shifted(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            h = self.proj(x)
            scale = h.abs().max().item()
            rows = h[:, 0].tolist()
            shift = float(np.mean(rows))
            return h / scale + shift


    model = torch.compile(Shifted().to("tpu"), backend="tpu")
    with torch.no_grad():
        for step in range(5):
            out = model(torch.randn(4, 8, device="tpu"))
    print(out.sum().item())
'''


def _line(script: Path, text: str) -> int:
    return next(number for number, source in enumerate(script.read_text().splitlines(), 1) if text in source)


@pytest.fixture(scope="module")
def read_in_forward(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("read_in_forward")
    script = folder / "shifted.py"
    script.write_text(textwrap.dedent(READ_IN_FORWARD))
    trace = folder / "shifted.tptrace"
    record(script, trace, [])
    return script, trace


def test_a_number_read_at_a_graph_break_is_named_by_its_line_not_by_dynamos_stack_slot(read_in_forward) -> None:
    """The part of forward after the `.tolist()` break is traced again for each `float(np.mean(rows))`: Dynamo's
    guard is on `___stack0[0]`, a slot of the resumed frame; the finding names the function, the line that read
    the number and how to keep it a tensor, not KV-cache advice about passing `___stack0[0]` as a tensor."""
    script, trace = read_in_forward
    report = analyze_path(trace)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "guard_recompiles"]
    read_line = _line(script, "shift = float(")
    break_line = _line(script, "rows = h[:, 0].tolist()")
    assert storm.title.startswith(f"torch.compile traced Shifted.forward after its graph break at line {break_line} "
                                  "again for each number read from a tensor at `shift = float(np.mean(rows))` "
                                  f"({script.name}:{read_line}): "), storm.title
    assert "___stack0" not in storm.title and "___stack0" not in storm.suggestion, storm.suggestion
    assert storm.suggestion.startswith("Keep the value a tensor"), storm.suggestion
    assert "index_copy_" not in storm.suggestion


def test_an_item_in_a_compiled_forward_is_not_told_to_accumulate_the_loss(read_in_forward) -> None:
    """`.item()` inside a compiled forward is read at every call: the break's advice is to use the 0-d tensor, not the
    training loop's advice to accumulate `loss.detach()` and add it before `optimizer.step()`."""
    script, trace = read_in_forward
    report = analyze_path(trace)
    item_line = _line(script, "scale = h.abs().max().item()")
    (item_break,) = [finding for finding in report.findings
                     if finding.analyzer == "graph_breaks" and finding.line == item_line]
    assert "use the 0-d tensor itself in the ops after it" in item_break.suggestion, item_break.suggestion
    assert "loss.detach()" not in item_break.suggestion and "optimizer.step()" not in item_break.suggestion


def test_a_guard_failures_change_is_one_line_without_tputraces_own_frames(read_in_forward) -> None:
    """Dynamo's guard failure goes on with the guard's user stack and, through `np.mean`, names the wrapper tputrace
    puts around torch's tensor makers: the trace keeps neither the wrapper's frame, and the summary shows one line."""
    _, trace = read_in_forward
    with tputrace.open(trace) as opened:
        diffs = [diff for (diff,) in opened.sql(
            "SELECT d.text FROM compiles c JOIN strings d ON d.id = c.diff_sid "
            "WHERE c.kind = 'dynamo_frame' AND c.reason = 'guard_failure'")]
        summary = summarize(opened)
    assert diffs and not [diff for diff in diffs if "tputrace host origins" in diff], diffs
    lines = render_summary(summary).splitlines()
    changed = [number for number, line in enumerate(lines) if line.strip().startswith("changed:")]
    assert changed and all("User stack trace" not in lines[number + 1] for number in changed), lines


GROWING_LENGTH = '''
    import torch
    import tputrace
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 4)).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    with torch.no_grad():
        for step in range(6):
            ids = torch.randint(0, 50, (2, 8 + 3 * step), device="tpu")
            out = compiled(ids).mean(1)
            tputrace.step()
    print(out.sum().item())
'''


def test_a_size_guard_on_a_sequence_length_is_told_to_pad_the_length_with_its_own_sizes(tmp_path: Path) -> None:
    """Token ids one step longer each call: Dynamo's size guard fails on dim 1 at the second call; the storm explains
    the dynamic graph's later sizes, so the guard's finding counts and lists its own (8 and 11, not every length), and
    being no batch dim, it is told to pad the length, not `drop_last=True`."""
    script = tmp_path / "growing.py"
    script.write_text(textwrap.dedent(GROWING_LENGTH))
    report = record(script, tmp_path / "growing.tptrace", [])
    (guard,) = [finding for finding in report.findings if finding.title.startswith("torch.compile traced Sequential")]
    assert "dim 1 changed (8 -> 11)" in guard.title, guard.title
    assert "1 recompile for the sizes 8, 11," in guard.explanation, guard.explanation
    assert "drop_last" not in guard.suggestion and "pad dim 1 of `args[0]` to one length" in guard.suggestion
    assert any(finding.title.startswith("Recompilation storm") for finding in report.findings)


COMPILED_OPTIMIZER_STEP = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


    @torch.compile(backend="tpu")
    def opt_step():
        opt.step()


    for step in range(4):
        loss = model(torch.randn(16, 32, device="tpu")).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt_step()
        sched.step()
    print(loss.item())
'''


def test_a_compiled_optimizer_step_is_no_fullgraph_error_in_tputraces_own_hook(tmp_path: Path) -> None:
    """Dynamo traces torch's step wrapper into the hook tputrace adds after each optimizer step, cannot trace it, and
    runs that frame uncompiled by itself: nothing the script raised or caught, and no line of the script's to change."""
    script = tmp_path / "compiled_step.py"
    script.write_text(textwrap.dedent(COMPILED_OPTIMIZER_STEP))
    report = record(script, tmp_path / "compiled_step.tptrace", [])
    assert not [finding for finding in report.findings if "fullgraph=True" in finding.title or "tputrace" in
                (finding.file or "").replace(str(tmp_path), "")], [finding.title for finding in report.findings]
    # the scheduler's wrapper of `opt.step` is skipped, a break at the call, but Adam.step compiles as a frame of its own
    (skipped,) = [finding for finding in report.findings if finding.title.startswith(f"Graph break at {script.name}:")]
    assert "(Adam.step(), called there, compiles as a graph of its own)" in skipped.title, skipped.title
    # the compiled Adam step returns its step counts to the CPU: those waits are told `capturable=True`
    for finding in report.findings:
        if "(host_outputs)" in finding.explanation:
            assert "capturable=True" in finding.suggestion, finding.suggestion


ROUTER = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class Router(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(16, 4)
            self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

        def forward(self, x):
            choice = self.gate(x).argmax(-1)
            out = torch.zeros_like(x)
            for index in choice.unique().tolist():
                out[choice == index] = self.experts[index](x[choice == index])
            return out


    model = torch.compile(Router().to("tpu"), backend="tpu", fullgraph=True)
    print(model(torch.randn(8, 16, device="tpu")).sum().item())
'''


def test_a_data_dependent_guard_that_ends_the_run_is_not_told_the_script_caught_it(tmp_path: Path) -> None:
    """Tracing a loop over `unique().tolist()` raises GuardOnDataDependentSymNode (no `torch._dynamo.exc` class) and
    the run ends with it: the finding is critical, says the run stopped, and tells to loop over a fixed set."""
    script = tmp_path / "router.py"
    script.write_text(textwrap.dedent(ROUTER))
    trace = tmp_path / "router.tptrace"
    completed = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace), str(script)],
                               capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert completed.returncode == 1, completed.stderr[-3000:]
    report = analyze_path(trace)
    (failed,) = [finding for finding in report.findings if finding.title.startswith("torch.compile failed")]
    loop_line = _line(script, "for index in choice.unique().tolist():")
    assert (failed.severity, failed.line) == ("critical", loop_line), failed.title
    assert failed.title.endswith("; the run stopped"), failed.title
    assert "loop over a fixed set" in failed.suggestion, failed.suggestion


INT_TEMPERATURE = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(8, 8).to("tpu")


    @torch.compile(backend="tpu")
    def sample(x, temperature: int):
        return torch.softmax(model(x) / temperature, -1)


    with torch.no_grad():
        for step in range(6):
            probs = sample(torch.randn(2, 8, device="tpu"), step + 1)
    print(probs.sum().item())
'''


def test_a_compiled_graph_recompiled_per_value_of_a_dynamic_int_is_a_finding(tmp_path: Path) -> None:
    """After one guard failure Dynamo takes the int temperature as an input, but the tpu backend compiles the graph's
    XLA program per value: those recompiles, with no shape changed, are a finding naming the int by its guard."""
    script = tmp_path / "temperature.py"
    script.write_text(textwrap.dedent(INT_TEMPERATURE))
    report = record(script, tmp_path / "temperature.tptrace", [])
    (finding,) = [finding for finding in report.findings if "for each value of the int" in finding.title]
    assert finding.title.startswith("sample graph 1 inference compiled again for each value of the int `temperature`")
    assert finding.line == _line(script, "@torch.compile")  # the compiled function's code begins there
    assert "took 5 values (2, 3, 4, 5, 6)" in finding.explanation, finding.explanation
    assert finding.suggestion.startswith("Pass `temperature` to the compiled function as a 0-d tensor")


COMPILED_MODEL_EAGER_STEP = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.SiLU(), nn.Linear(64, 16)).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(4):
        x = torch.randn(8, 16, device="tpu")
        loss = (compiled(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_host_bound_advice_in_a_compiled_run_is_about_the_ops_outside_the_graphs(tmp_path: Path) -> None:
    """Under `--mode compile` the model runs as torch.compile graphs and the loss and AdamW's update op by op: where
    the steps are host-bound, the advice is to bring those ops into the compiled function or fuse them in DeferAndFuse,
    not to compile the model it has compiled."""
    script = tmp_path / "compiled_model.py"
    script.write_text(textwrap.dedent(COMPILED_MODEL_EAGER_STEP))
    trace = tmp_path / "compiled_model.tptrace"
    report = record(script, trace, [], ("--mode", "compile"))
    with tputrace.open(trace) as opened:
        advice = host_bound._outside_compiled_graphs(AnalysisContext.build(opened, chip(None), True))
    assert advice is not None and advice.startswith("The model is compiled already"), advice
    assert "`tputrace run --mode defer`" in advice
    for finding in report.findings:  # a host-bound finding, where the host was slow enough for one, says so
        if finding.analyzer == "host_bound":
            assert finding.suggestion == advice, finding.suggestion


FLOAT_TEMPERATURE = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(16, 1).to("tpu")


    @torch.compile(backend="tpu")
    def scaled_loss(out, target, temperature):
        return ((out / temperature - target) ** 2).mean()


    for step in range(5):
        loss = scaled_loss(model(torch.randn(8, 16, device="tpu")), torch.randn(8, 1, device="tpu"), 1.0 + 0.5 * step)
        loss.backward()
    print(loss.item())
'''


def test_cpu_outputs_of_a_graph_taking_a_float_are_not_told_to_make_an_optimizer_capturable(tmp_path: Path) -> None:
    """A float temperature Dynamo made dynamic is a CPU scalar, and the forward returns what the backward keeps of it
    to the CPU at every call: no optimizer step is compiled, so the advice is to pass the number as a device tensor."""
    script = tmp_path / "float_temperature.py"
    script.write_text(textwrap.dedent(FLOAT_TEMPERATURE))
    report = record(script, tmp_path / "float_temperature.tptrace", [])
    waits = [finding for finding in report.findings if "(host_outputs)" in finding.title]
    assert waits, [finding.title for finding in report.findings]
    for finding in waits:
        assert "capturable" not in finding.suggestion, finding.suggestion
        assert "pass such a number as a tensor on the device" in finding.suggestion, finding.suggestion


GRU_CLASSIFIER = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(64, 16)
            self.rnn = nn.GRU(16, 16, batch_first=True)
            self.out = nn.Linear(16, 3)

        def forward(self, ids):
            h, _ = self.rnn(self.emb(ids))
            return self.out(h[:, -1])


    compiled = torch.compile(Classifier().to("tpu"), backend="tpu")
    with torch.no_grad():
        for step in range(2):
            logits = compiled(torch.randint(0, 64, (4, 6), device="tpu"))
    print(logits.sum().item())
'''


def test_a_frame_dynamo_skips_by_itself_is_not_told_the_script_caught_a_fullgraph_error(tmp_path: Path) -> None:
    """Dynamo cannot wrap a GRU and skips the forward's frame, which then runs uncompiled: the script used no
    `fullgraph=True` and caught nothing, so the finding says the function runs uncompiled, not that it raised."""
    script = tmp_path / "gru.py"
    script.write_text(textwrap.dedent(GRU_CLASSIFIER))
    report = record(script, tmp_path / "gru.tptrace", [])
    (skipped,) = [finding for finding in report.findings if "GRU" in finding.title]
    assert skipped.title == (f"torch.compile could not compile the function at {script.name}:"
                             f"{_line(script, 'h, _ = self.rnn(')}: Attempted to wrap RNN, GRU, or LSTM; it runs uncompiled")
    assert "caught it" not in skipped.title and "fullgraph=True) raised" not in skipped.title
    assert "Or compile it with `fullgraph=False`" not in skipped.suggestion, skipped.suggestion


COMPILED_TRAIN_STEP = '''
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


    @torch.compile(backend="tpu")
    def train_step(x, y):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss


    for step in range(4):
        loss = train_step(torch.randn(16, 32, device="tpu"), torch.randint(0, 8, (16,), device="tpu"))
    print(loss.item())
'''


def test_torch_optims_own_graph_break_is_not_told_to_be_removed(tmp_path: Path) -> None:
    """A compiled function calling `optimizer.step()` meets the `torch._dynamo.graph_break()` torch.optim puts around
    every step on purpose; Dynamo's hint to remove that call is for torch's authors, not the script's."""
    script = tmp_path / "train_step.py"
    script.write_text(textwrap.dedent(COMPILED_TRAIN_STEP))
    report = record(script, tmp_path / "train_step.tptrace", [])
    (torch_break,) = [finding for finding in report.findings if finding.analyzer == "graph_breaks"
                      and Path(finding.file or "").name == "optimizer.py"]
    assert torch_break.title.startswith("The optimizer step at train_step.py:13 compiles as a graph of its own"), \
        torch_break.title
    assert torch_break.suggestion.startswith("Nothing in the script causes the break"), torch_break.suggestion
    assert "Remove the" not in torch_break.suggestion
