"""Module paths of recorded ops (`ops.module_sid`): the innermost module whose forward ran the op, kept by the
wrapped `nn.Module.__call__` while a trace is recorded."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

import tputrace
from tputrace.cli.main import main
from tputrace.store.reader import Trace

SCRIPT = textwrap.dedent("""\
    import torch
    from torch import nn

    class Failing(nn.Module):
        def forward(self, x):
            x = x * 3  # op: Net.failing
            raise ValueError("no")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            self.failing = Failing()

        def forward(self, x):
            y = self.inner(x)
            try:
                self.failing(y)
            except ValueError:
                pass
            return y + 1  # op: Net

    net = Net().to("tpu")
    out = net(torch.ones(2, 4, device="tpu"))
    z = out - 2  # op: outside any module
    z.cpu()
""")


def _module_of_op(trace: Trace, op: str) -> list[str | None]:
    return [row[0] for row in trace.sql(
        "SELECT m.text FROM ops o JOIN strings n ON n.id = o.op_sid LEFT JOIN strings m ON m.id = o.module_sid "
        "WHERE n.text = ? ORDER BY o.seq", (op,))]


def test_ops_get_their_innermost_module_and_a_raising_forward_leaves_none_behind(tmp_path: Path) -> None:
    script = tmp_path / "modules.py"
    script.write_text(SCRIPT)
    trace_path = tmp_path / "modules.tptrace"
    assert main(["run", "-o", str(trace_path), str(script)]) == 0
    with tputrace.open(trace_path) as trace:
        assert _module_of_op(trace, "aten.addmm.default") == ["Net.inner.0"]
        assert _module_of_op(trace, "aten.relu.default") == ["Net.inner.1"]
        assert _module_of_op(trace, "aten.mul.Tensor") == ["Net.failing"]
        assert _module_of_op(trace, "aten.add.Tensor") == ["Net"]
        assert _module_of_op(trace, "aten.sub.Tensor") == [None]


def test_module_calls_are_plain_again_after_the_recording(tmp_path: Path) -> None:
    script = tmp_path / "modules.py"
    script.write_text(SCRIPT)
    call = torch.nn.Module.__call__
    assert main(["run", "-o", str(tmp_path / "modules.tptrace"), str(script)]) == 0
    assert torch.nn.Module.__call__ is call
