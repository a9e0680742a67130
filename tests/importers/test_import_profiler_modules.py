"""torch.profiler's module ranges (`with_modules=True`): each imported op's module column holds the path of the
nn.Module calls it ran in, so that the per-module views of a recording work on a capture."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

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


def test_ops_take_the_path_of_the_modules_they_ran_in(tmp_path: Path) -> None:
    script = tmp_path / "modules.py"
    script.write_text(MODULES_SCRIPT)
    capture = tmp_path / "modules.json"
    subprocess.run([sys.executable, str(script), str(capture)], check=True, capture_output=True, timeout=300)
    output = tmp_path / "modules.tptrace"
    assert main(["import", str(capture), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
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
