"""A `TORCH_TRACE` log of a function that reached Dynamo's recompile limit: the compile that failed with "Dynamo
recompile limit exceeded" is the limit's warning, as a recording keeps it, so the `recompile_limit` finding names
the function, the limit and the last guard that failed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import tputrace
from tputrace.analysis import analyze_path
from tputrace.cli.main import main

RANKS = textwrap.dedent("""
    import torch

    torch._dynamo.config.cache_size_limit = 2
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 2

    @torch.compile(backend="eager")
    def scale(x):
        return x * 2

    for rank in range(1, 6):
        scale(torch.randn(*([2] * rank)))
""")


def test_a_recompile_limit_hit_in_a_torch_trace_log_is_a_finding(tmp_path: Path) -> None:
    from captures import _torch_trace

    folder, script = _torch_trace(tmp_path, "ranks.py", RANKS, "ranks_trace")
    # The code object's first line (`co_firstlineno`): its decorator's.
    def_line = next(index for index, text in enumerate(RANKS.splitlines(), 1) if text.startswith("@torch.compile"))
    output = tmp_path / "imported.tptrace"
    assert main(["import", str(folder), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        (warning,) = trace.sql("SELECT s.text FROM annotations a JOIN strings s ON s.id = a.name_sid "
                               "WHERE a.source = 'recompile_limit'")
    assert warning[0].startswith("torch._dynamo hit config.recompile_limit (2)\n   function: 'scale' (")
    (finding,) = [finding for finding in analyze_path(output).findings if finding.analyzer == "recompile_limit"]
    assert (finding.file, finding.line) == (str(script), def_line)
    assert "Dynamo hit its recompile_limit (2)" in finding.title
    assert "rank mismatch. expected 2, actual 3" in finding.explanation
    assert "no ops to time" in finding.explanation
