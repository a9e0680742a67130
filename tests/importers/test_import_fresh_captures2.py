"""Captures made by other tools on this machine and read as a new user would read them: a compiled function whose
graph breaks on a value, a jitted step whose script shares its file's name with JAX's own module, two gloo ranks'
torch.profiler files."""

from __future__ import annotations

import textwrap
from pathlib import Path

import tputrace
from tputrace.cli.main import main

# A branch on a tensor's value: the graph breaks at line 5, and the code resumed after it is compiled again for each
# new value (Dynamo guards on it), the last guard failing with the place in torch that evaluated it.
TORCH_VALUE_BRANCH = textwrap.dedent("""\
    import torch

    def normalize(x):
        m = x.mean()
        if m.item() > 0:  # a branch on a value
            x = x - m
        return x.relu()

    g = torch.compile(normalize, backend="eager")
    for value in (1.0, 2.0, -1.0):
        g(torch.full((4,), value))
""")


def _import(paths: list[Path], output: Path) -> tputrace.Trace:
    assert main(["import", *map(str, paths), "-o", str(output)]) == 0
    return tputrace.open(output)


def test_recompile_reason_on_a_value_names_its_guard_and_line(tmp_path: Path) -> None:
    from captures import _torch_trace

    folder, script = _torch_trace(tmp_path, "value_branch.py", TORCH_VALUE_BRANCH, "trace")
    trace = _import([folder], tmp_path / "branch.tptrace")
    diffs = [row.diff for row in trace.records("compiles") if row.diff]
    assert len(diffs) == 2, diffs
    # Each failed guard, then the code it guards and where: the log's comment, not its raw text with Dynamo's
    # shortened path and the place in torch that evaluated the guard.
    for diff in diffs:
        guard, _, place = diff.partition(" (if m.item() > 0:")
        assert guard.startswith(("1/0: ___stack0", "1/1: ___stack0")) and "#" not in guard, diff
        assert f"{script.name}:5 in torch_dynamo_resume_in_normalize_at_5)" in place, diff
        assert "evaluate_expr" not in diff, diff
