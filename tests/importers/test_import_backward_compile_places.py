"""A torch.profiler capture recorded with `with_stack` beside its process's TORCH_TRACE log: the profile's backward
compile takes its forward's place from the log (the line that called the compiled model), not the function that
called `backward()`, the only place the profile's Python stack gives it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import tputrace
from tputrace.cli.main import main

STACK_AND_LOG = textwrap.dedent("""
    import sys, torch
    from torch.profiler import ProfilerActivity, profile

    def train(compiled, opt):
        for size in (8, 8):
            out = compiled(torch.randn(size, 16))
            out.sum().backward()
            opt.step()
            opt.zero_grad()

    # A compile before the profile imports what torch.compile imports on first use, which the profiler's Python tracer
    # would otherwise record (hundreds of MB of JSON).
    warm = torch.compile(lambda t: (t * 2).sum(), backend="aot_eager")
    warm(torch.ones(2, requires_grad=True)).backward()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        train(torch.compile(model, backend="aot_eager"), torch.optim.SGD(model.parameters(), lr=0.1))
    prof.export_chrome_trace(sys.argv[1])
""")


def test_a_backward_compile_is_placed_at_its_forwards_call(tmp_path: Path) -> None:
    script = tmp_path / "stack_and_log.py"
    script.write_text(STACK_AND_LOG)
    run = tmp_path / "run"
    run.mkdir()
    subprocess.run([sys.executable, str(script), str(run / "profile.json")], check=True, capture_output=True,
                   timeout=300, env={**os.environ, "TORCH_TRACE": str(run / "torch_trace")})
    output = tmp_path / "stack_and_log.tptrace"
    assert main(["import", str(run), "-o", str(output)]) == 0
    call_line = next(number for number, text in enumerate(STACK_AND_LOG.splitlines(), 1) if "compiled(" in text)
    with tputrace.open(output) as trace:
        compiles = list(trace.records("compiles"))
    (forward,) = [row for row in compiles if row.kind == "dynamo_frame" and row.name == "compiled"]
    (backward,) = [row for row in compiles if row.kind == "aot"]
    assert forward.source is not None and forward.source.line == call_line
    assert backward.name == f"backward of {forward.name}"
    assert backward.source is not None and (backward.source.file, backward.source.line) == (forward.source.file,
                                                                                            call_line)
