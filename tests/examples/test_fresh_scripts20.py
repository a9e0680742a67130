"""Single-chip scripts of kinds that read wrong before, run under `tputrace run` in a subprocess: element reads in loops
with tuple targets (`for x, y in pairs:`, `for i, (a, b) in enumerate(...)`, a value computed from the variables) got
no advice to read once, and a loop over `zip` with names no loop over the values read once; a frozen backbone's
backward on XLA:CPU read as more than 100% of a step; a compiled step of the script's own optimizer class read as a
generic break in torch's `wrapper()`."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from test_problems import record

from tputrace.analysis import Report
from tputrace.analysis.findings import Finding

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

TUPLE_LOOPS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    labels = ["first", "second", "third"]
    for step in range(4):
        batch = torch.randn(32, 64, device="tpu")
        logits = model(batch)
        loss = logits.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        weighted = [(loss.detach() * k, logits[0, k].detach()) for k in range(1, 4)]
        energy = 0.0
        for scale, value in weighted:
            energy += scale.item() * value.item()  # pairs
        kept = {}
        for label, part in zip(labels, [logits[1, k].detach() for k in range(3)]):
            kept[label] = part.item()  # zip
        spread = 0.0
        for index, (left, right) in enumerate(weighted):
            spread += float((left - right).abs()) * index  # nested
'''

FROZEN_BACKBONE = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 512)).to("tpu")
    classifier = nn.Linear(512, 10).to("tpu")
    optimizer = torch.optim.SGD(classifier.parameters(), lr=0.1)
    for step in range(5):
        x = torch.randn(256, 512, device="tpu")
        y = torch.randint(0, 10, (256,), device="tpu")
        loss = nn.functional.cross_entropy(classifier(encoder(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''

OWN_OPTIMIZER = '''
    import torch
    from torch import nn


    class Base(torch.optim.Optimizer):
        pass


    class NormCappedSGD(Base):
        def __init__(self, params, lr=0.1, cap=1.0):
            super().__init__(params, dict(lr=lr, cap=cap))

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    size = p.grad.norm().item()  # break
                    p.add_(p.grad, alpha=-group["lr"] * min(1.0, group["cap"] / (size + 1e-6)))


    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to("tpu")
    opt = NormCappedSGD(model.parameters())


    @torch.compile(backend="tpu")
    def train(x, y):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()  # step
        opt.zero_grad()
        return loss


    for i in range(3):
        train(torch.randn(16, 32, device="tpu"), torch.randint(0, 4, (16,), device="tpu"))
'''


def _run(tmp_path: Path, name: str, source: str) -> tuple[Report, dict[str, int]]:
    """The report of `source` run as `name`.py, and the line of each `# marker` comment by its text."""
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source))
    marks = {text.split("  # ", 1)[1]: number for number, text in enumerate(script.read_text().splitlines(), 1)
             if "  # " in text}
    return record(script, tmp_path / f"{name}.tptrace", []), marks


def _at(report: Report, analyzer: str, line: int) -> Finding:
    found = [finding for finding in report.findings if finding.analyzer == analyzer and finding.line == line]
    assert len(found) == 1, [f"{finding.analyzer}:{finding.line}: {finding.title}" for finding in report.findings]
    return found[0]


def test_element_reads_in_loops_with_tuple_targets_are_told_to_read_once(tmp_path: Path) -> None:
    """A product of two unpacked elements added up is stacked with its reads left out and summed on the chip; a loop
    over `zip` with names loops over the values read once; a value computed from a nested target is stacked too."""
    report, marks = _run(tmp_path, "tuple_loops", TUPLE_LOOPS)
    pairs = _at(report, "syncs", marks["pairs"]).suggestion
    assert "`torch.stack([scale * value for scale, value in weighted]).sum().item()`" in pairs, pairs
    zipped = _at(report, "syncs", marks["zip"]).suggestion
    assert "`for label, part in zip(labels, torch.stack([logits[1, k].detach() for k in range(3)]).tolist()):`" \
        in zipped, zipped
    nested = _at(report, "syncs", marks["nested"]).suggestion
    assert ("`torch.stack([(left - right).abs() * index for index, (left, right) in enumerate(weighted)]).sum()"
            ".item()`") in nested, nested


def test_a_frozen_backbones_backward_is_never_more_than_the_whole_step(tmp_path: Path) -> None:
    """On XLA:CPU the chip's busy time per step can pass the step's host time: the share is then of that busy time,
    which the products' FLOP share of it bounds."""
    report, _ = _run(tmp_path, "frozen_backbone", FROZEN_BACKBONE)
    (finding,) = [finding for finding in report.findings if finding.analyzer == "frozen_backward"]
    share = re.search(r"of chip time \((\d+\.\d)% of (a step|the chip's busy time in the loop);", finding.explanation)
    assert share is not None and float(share[1]) <= 100.0, finding.explanation


def test_a_compiled_step_of_the_scripts_own_optimizer_names_its_class(tmp_path: Path) -> None:
    """The break is in the class's step (a subclass through another class of the file): the title names the line
    that called the step, the class and the break's line, and the advice is to make that step traceable."""
    report, marks = _run(tmp_path, "own_optimizer", OWN_OPTIMIZER)
    finding = _at(report, "graph_breaks", marks["break"])
    assert finding.title.startswith(
        f"The optimizer step at own_optimizer.py:{marks['step']} runs eagerly: Dynamo cannot trace NormCappedSGD.step "
        f"at own_optimizer.py:{marks['break']} (Tensor.item())"), finding.title
    assert "the script's own `torch.optim.Optimizer` subclass" in finding.explanation, finding.explanation
    assert finding.suggestion.startswith(f"Make NormCappedSGD.step traceable at own_optimizer.py:{marks['break']}"), \
        finding.suggestion
