"""Reading a trace never imports torch or jax: every module outside the backend and the recording side imports,
and the trace commands run on a trace, in a fresh interpreter that then holds neither."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from product_modules import product_modules

HEAVY = ("torch", "jax", "jaxlib")
# The recording side imports the backend; the numerics hooks and CPU replay run inside the recorded process.
RECORDING_SIDE = ("tputrace.backend", "tputrace.recording",
                  "tputrace.numerics.recording", "tputrace.numerics.digests", "tputrace.numerics.ops", "tputrace.numerics.parameter_grads",
                  "tputrace.numerics.random_ops", "tputrace.numerics.full_precision")


def trace_side_modules() -> list[str]:
    return sorted(
        name for name in product_modules()
        if not any(name == side or name.startswith(f"{side}.") for side in RECORDING_SIDE)
    )


def test_the_trace_side_is_found() -> None:
    names = trace_side_modules()
    for expected in ("tputrace.store.reader", "tputrace.analysis", "tputrace.summary", "tputrace.cli.report",
                     "tputrace.tui.app", "tputrace.viewers"):
        assert expected in names


def test_trace_side_modules_and_commands_never_import_torch_or_jax(sample_trace_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("textual", reason="the TUI's modules need textual (pip install -e .[views])")
    pytest.importorskip("plotly", reason="the viewers' modules need plotly (pip install -e .[views])")
    code = textwrap.dedent(
        f"""
        import importlib, sys

        def heavy():
            return sorted({{name.partition(".")[0] for name in sys.modules}} & set({HEAVY!r}))

        for name in {trace_side_modules()!r}:
            importlib.import_module(name)
            assert not heavy(), f"importing {{name}} imported {{heavy()}}"
        from tputrace.cli.main import main
        for command in (["info"], ["summary"], ["report", "--json"], ["dump", "--kind", "ops", "--limit", "3"]):
            assert main([*command, {str(sample_trace_path)!r}]) == 0, command
            assert not heavy(), f"tputrace {{command[0]}} imported {{heavy()}}"
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
