"""Compiled code and the host makers' watching: Dynamo's table of torch functions is built at the first compile, which
in a run usually falls inside the recording, while `torch.tensor` and the other makers are wrapped. A function
compiled after the recording stops must still find them in that table (a fresh process: the table is built once)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

_SCRIPT = textwrap.dedent("""
    import torch
    import tputrace.backend  # noqa: F401
    from tputrace.recording import lifecycle

    def made_on_the_host(x):
        return x + torch.tensor([1.0, 2.0]) + torch.zeros(2) + x.new_ones(2)

    lifecycle.start({path!r}, script="compiled", argv=[], mode="defer")
    try:
        during = torch.compile(made_on_the_host, backend="eager", fullgraph=True)(torch.ones(2))
    finally:
        lifecycle.stop(0)
    torch._dynamo.reset()
    after = torch.compile(made_on_the_host, backend="eager", fullgraph=True)(torch.ones(2))
    print(during.tolist(), after.tolist())
""")


def test_a_compile_after_the_recording_stops_knows_the_makers(tmp_path: Path) -> None:
    script = tmp_path / "compiled.py"
    script.write_text(_SCRIPT.format(path=str(tmp_path / "compiled.tptrace")))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[-2] == "[3.0, 4.0] [3.0, 4.0]"
