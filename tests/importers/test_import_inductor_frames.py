"""A torch.profiler capture (`with_stack`) of an Inductor-compiled function: the ops its compiled graph runs are
called from the Python code Inductor generated (`/tmp/torchinductor_<user>/7e/c7epy….py(147): call`), which is
torch's, not the user's: they are placed at the user's function that ran the compiled region."""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

import tputrace
from tputrace.cli.main import main

INDUCTOR_PROFILE = textwrap.dedent("""\
    import sys, torch
    from torch.profiler import profile

    w = torch.randn(64, 64)

    @torch.compile
    def layer(x):
        return torch.relu(x @ w).sum(0)

    def step(x):
        return layer(x) * 2

    x = torch.randn(32, 64)
    step(x)
    with profile(with_stack=True, record_shapes=True) as prof:
        for _ in range(3):
            step(x)
    prof.export_chrome_trace(sys.argv[1])
""")


def test_ops_of_inductor_code_are_placed_in_the_users_function(tmp_path: Path) -> None:
    from captures import _capture

    capture = _capture(tmp_path, "inductor_profile.py", INDUCTOR_PROFILE, "inductor.json")
    output = tmp_path / "inductor.tptrace"
    assert main(["import", str(capture), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        places = Counter((op.op, op.source.file, op.source.function) for op in trace.records("ops")
                         if op.source and op.op in ("aten::mm", "aten::addmm", "aten::relu", "aten::sum"))
    # torch.profiler names the script relative to its `sys.path` entry; only aten::mm is left outside Inductor's kernels
    assert set(places) == {("aten::mm", "inductor_profile.py", "layer")} and places["aten::mm", "inductor_profile.py", "layer"] == 3
