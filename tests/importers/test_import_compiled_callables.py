"""A library function compiled whole (`torch.compile(F.silu)`): Dynamo compiles torch's wrapper `inner`, and the
`dynamo_start` stacks of its TORCH_TRACE log hold that wrapper alone. Its place is the user's line that called it,
from another record of the log with the process's stack (`create_symbol` of the recompile that made the size
dynamic), for every compile of the callable."""

from __future__ import annotations

import textwrap
from pathlib import Path

import tputrace
from tputrace.cli.main import main

SILU = textwrap.dedent("""\
    import torch
    import torch.nn.functional as F

    act = torch.compile(F.silu, backend="eager")
    for n in (16, 32, 64):
        y = act(torch.randn(n))
""")


def test_a_compiled_library_function_is_placed_at_the_calling_line(tmp_path: Path) -> None:
    from captures import _torch_trace

    log_dir, script = _torch_trace(tmp_path, "silu.py", SILU, "torch_trace")
    output = tmp_path / "silu.tptrace"
    assert main(["import", str(log_dir), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        compiles = sorted(trace.records("compiles"), key=lambda row: row.start_ns)
    # 16 compiles, 32 recompiles with a dynamic size, which 64 reuses.
    assert [row.reason for row in compiles] == ["first", "recompile"]
    assert [(row.name, row.source.file, row.source.line) if row.source else None for row in compiles] == [
        ("act", str(script), 6)] * 2
