"""torch.profiler's module ranges (`with_stack=True`, with `with_modules=True`): each imported op's module column holds the path of the
nn.Module calls it ran in, so that the per-module views of a recording work on a capture; and the capture's wall, which
ends with the window's last event, not with Kineto's `Record Window End` marker written after it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

import tputrace
from tputrace.cli.main import main

MODULES_SCRIPT = textwrap.dedent("""
    import sys, torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, record_function

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(self.fc(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = Block()
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            return self.head(self.enc(x))

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], with_modules=True, with_stack=True) as prof:
        for _ in range(3):
            x = torch.randn(8, 16)
            with record_function("train_step"):
                net(x).sum().backward()
                opt.step()
                opt.zero_grad()
    prof.export_chrome_trace(sys.argv[1])
""")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The capture of `MODULES_SCRIPT` and its import."""
    folder = tmp_path_factory.mktemp("modules")
    script = folder / "modules.py"
    script.write_text(MODULES_SCRIPT)
    capture = folder / "modules.json"
    subprocess.run([sys.executable, str(script), str(capture)], check=True, capture_output=True, timeout=300)
    output = folder / "modules.tptrace"
    assert main(["import", str(capture), "-o", str(output)]) == 0
    return capture, output


# As torch.profiler wrote it for a module imported while it profiled (`torch/_inductor/debug.py`).
UNESCAPED_NAME = '"name": "torch/_inductor/debug.py(0):         ' + '"' * 3 + '"'


def test_ops_take_the_path_of_the_modules_they_ran_in(imported: tuple[Path, Path]) -> None:
    with tputrace.open(imported[1]) as trace:
        ops = list(trace.records("ops"))
        annotations = list(trace.records("annotations"))
        stats = {stat.label: stat.count for stat in trace.op_stats(group_by="module")}
    by_op = Counter((op.op, op.module) for op in ops)
    # The forward's matmuls: the block's layer and the head (torch.profiler names each module by its class and the
    # instance's number among that class's: `Linear_0`, `Linear_1`), and the block's ReLU, each once a step.
    assert by_op[("aten::addmm", "Net_0.Block_0.Linear_0")] == 3
    assert by_op[("aten::addmm", "Net_0.Linear_1")] == 3
    assert by_op[("aten::relu", "Net_0.Block_0.ReLU_0")] == 3
    # Ops nested in a module's op (`aten::linear` holds `aten::t` and `aten::addmm`) share its module.
    assert {op.module for op in ops if op.op == "aten::t" and op.module}.issubset(
        {"Net_0.Block_0.Linear_0", "Net_0.Linear_1"})
    # The backward runs outside any module's call: its ops take the module of the forward op that made them.
    assert by_op[("autograd::engine::evaluate_function: AddmmBackward0", "Net_0.Block_0.Linear_0")] == 3
    assert by_op[("autograd::engine::evaluate_function: AddmmBackward0", "Net_0.Linear_1")] == 3
    assert by_op[("autograd::engine::evaluate_function: ReluBackward0", "Net_0.Block_0.ReLU_0")] == 3
    # The loss's sum and the optimizer's update ran in no module.
    updates = [(row.start_ns, row.start_ns + row.dur_ns) for row in annotations if row.name.startswith("Optimizer.step#")]
    losses = {step: min((op for op in ops if op.op == "aten::sum" and op.step == step), key=lambda op: op.start_ns)
              for step in (1, 2, 3)}  # each step's first sum is the loss's (the backward's sum a bias's gradient)
    assert len(updates) == 3 and {op.module for op in losses.values()} == {None}
    assert {op.module for op in ops if any(start <= op.start_ns < end for start, end in updates)} == {None}
    # The per-module view groups the ops by those paths.
    assert {"Net_0.Block_0.Linear_0", "Net_0.Block_0.ReLU_0", "Net_0.Linear_1"} <= set(stats)


def test_the_wall_ends_with_the_windows_last_event(imported: tuple[Path, Path]) -> None:
    """Kineto writes a global `Record Window End` instant once it has processed the window, after its last event (by
    as long as processing took: seconds for a window of many Python events); the wall ended there."""
    capture, output = imported
    events = json.loads(capture.read_text())["traceEvents"]
    spans = [event for event in events if event.get("ph") == "X"]
    first = min(event["ts"] for event in spans)
    last_end = max(event["ts"] + event["dur"] for event in spans)
    (marker,) = [event["ts"] for event in events if event.get("name") == "Record Window End"]
    assert marker > last_end
    with tputrace.open(output) as trace:
        assert abs(trace.wall_ns() - (last_end - first) * 1000) <= 1


def test_an_event_torch_wrote_without_escaping_is_skipped(imported: tuple[Path, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """torch.profiler writes a Python frame's name as it is, quotes and all: a module imported while it profiles
    gave a name of a file's first line, a docstring's opening quotes (`UNESCAPED_NAME`), which is no JSON. The import skips that event, says so, and reads the rest (it stopped: 'damaged inside traceEvents')."""
    capture, output = imported
    text = capture.read_text()
    frame = next(match for match in re.finditer(r'"name": "([^"]*)"', text) if "(" in match.group(1)
                 and '"cat": "python_function"' in text[text.rfind("{", 0, match.start()):match.start()])
    broken = tmp_path / "broken.json"
    broken.write_text(text[:frame.start()] + UNESCAPED_NAME + text[frame.end():])
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken.read_text())
    capsys.readouterr()
    assert main(["import", str(broken), "-o", str(tmp_path / "broken.tptrace")]) == 0
    assert "skipped 1 event(s) that do not decode" in capsys.readouterr().err
    with tputrace.open(tmp_path / "broken.tptrace") as trace, tputrace.open(output) as whole:
        (source,) = json.loads(trace.meta["imported"])
        assert source["skipped_events"] == 1
        assert len(list(trace.records("ops"))) == len(list(whole.records("ops")))
        assert len(list(trace.records("annotations"))) == len(list(whole.records("annotations"))) - 1
