"""Captures in which nothing ran: a torch.profiler window around no work (Kineto still writes its header and its
own spans), and a `jax.profiler.trace` session around no work, import as empty traces, not as errors; a Chrome
trace of another tool without torch.profiler's events is still an error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import tputrace
from tputrace.cli.main import main

EMPTY_TORCH = textwrap.dedent("""
    import sys, torch
    from torch.profiler import profile, ProfilerActivity

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        pass
    prof.export_chrome_trace(sys.argv[1])
""")

EMPTY_JAX = textwrap.dedent("""
    import sys, jax

    with jax.profiler.trace(sys.argv[1]):
        pass
""")


@pytest.mark.parametrize(("script", "output"), [(EMPTY_TORCH, "empty.json"), (EMPTY_JAX, "empty_logdir")])
def test_a_capture_of_nothing_imports_as_an_empty_trace(tmp_path: Path, script: str, output: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from captures import _capture

    capture = _capture(tmp_path, "empty.py", script, output)
    trace_path = tmp_path / "imported.tptrace"
    assert main(["import", str(capture), "-o", str(trace_path)]) == 0
    if output.endswith(".json"):
        assert "torch.profiler recorded no events in this window" in capsys.readouterr().err
    with tputrace.open(trace_path) as trace:
        assert trace.count("ops") == 0 and trace.count("steps") == 0
    assert main(["report", str(trace_path)]) == 0
    assert "no findings" in capsys.readouterr().out
