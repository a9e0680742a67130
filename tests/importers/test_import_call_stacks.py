"""torch.profiler's `with_stack` as older torch (before its Python tracer) and TorchScript write it: each CPU op's
`Call stack` arg lists the frames it ran in, innermost first, each at the line it was at (the call's line), so an
op's frame is that line, not the first line of the function it ran in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tputrace
from tputrace.cli.main import main

SCRIPT = "/home/user/project/train.py"
LIBRARY = "/opt/conda/lib/python3.8/site-packages/torch/nn/modules/module.py"


def _op(name: str, ts: float, dur: float, stack: str) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 7, "tid": 7, "ts": ts, "dur": dur,
            "args": {"Input dims": [], "Call stack": stack}}


def _capture(folder: Path) -> Path:
    """Two steps, each a linear layer's matmul (called at line 14 of `train_step`, through `nn.Module`'s call) and a
    loss (line 15), and an op whose stack holds only library frames."""
    events: list[dict[str, Any]] = []
    for step in range(2):
        t0 = 1000.0 + step * 100.0
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 7, "tid": 7, "ts": t0,
             "dur": 90.0, "args": {}},
            _op("aten::addmm", t0 + 10, 20.0, f"{LIBRARY}(1102): _call_impl;{SCRIPT}(14): train_step;"
                                              f"{SCRIPT}(30): <module>;"),
            _op("aten::mse_loss", t0 + 40, 10.0, f"{SCRIPT}(15): train_step;{SCRIPT}(30): <module>;"),
            _op("aten::empty", t0 + 60, 1.0, f"{LIBRARY}(1102): _call_impl;"),
        ]
    path = folder / "old_torch.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_an_ops_frame_is_the_line_its_call_stack_was_at(tmp_path: Path) -> None:
    output = tmp_path / "imported.tptrace"
    assert main(["import", str(_capture(tmp_path)), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        rows = trace.sql("SELECT o.text, f.text, fr.line, fn.text FROM ops JOIN strings o ON o.id = ops.op_sid "
                         "LEFT JOIN frames fr ON fr.id = ops.frame_id LEFT JOIN strings f ON f.id = fr.file_sid "
                         "LEFT JOIN strings fn ON fn.id = fr.function_sid WHERE ops.step = 0 ORDER BY ops.start_ns")
    assert rows == [("aten::addmm", SCRIPT, 14, "train_step"), ("aten::mse_loss", SCRIPT, 15, "train_step"),
                    ("aten::empty", None, None, None)]
