"""Single-chip scripts of kinds that read wrong before: a `torch.compile`d function whose failed recompile stopped the
run (told to fix it lest the run stop there, not that the function gains nothing from compiling, with Dynamo's
pointer to more logs out of the title)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tputrace.analysis import analyze_path
from tputrace.cli.main import main

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

MARKED_DYNAMIC = '''
    import torch

    def step(x):
        if x.shape[0] == 4:
            return x.sum()
        return (x * 2).sum()

    compiled = torch.compile(step, backend="aot_eager")
    compiled(torch.randn(8, 16))
    y = torch.randn(4, 16)
    torch._dynamo.mark_dynamic(y, 0)
    compiled(y)
'''


def test_a_failed_recompile_that_stopped_the_run_is_told_as_a_stop(tmp_path: Path) -> None:
    """The recompile's ConstraintViolationError ended the run: the title quotes the error without Dynamo's `For more
    information, run with TORCH_LOGS=...` tail, and the suggestion says the run stops at the call until it is fixed,
    not that the function gains nothing from `torch.compile` (it ran compiled before)."""
    script = tmp_path / "marked_dynamic.py"
    script.write_text(textwrap.dedent(MARKED_DYNAMIC))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TORCH_TRACE": str(tmp_path / "logs")})
    assert result.returncode != 0 and "ConstraintViolationError" in result.stderr, result.stderr[-2000:]
    assert main(["import", str(tmp_path / "logs"), "-o", str(tmp_path / "md.tptrace")]) == 0
    (finding,) = [finding for finding in analyze_path(tmp_path / "md.tptrace").findings
                  if "ConstraintViolationError" in finding.explanation]
    assert finding.title.endswith("Constraints violated (L['x'].size()[0]); the error stopped the run"), finding.title
    assert "For more information" not in finding.title + finding.explanation, finding.explanation
    assert "gains nothing" not in finding.suggestion, finding.suggestion
    assert "Until that is fixed, the run stops at this call (the calls before it ran step's compiled code)." \
        in finding.suggestion, finding.suggestion
    assert finding.suggestion.count("TORCHDYNAMO_VERBOSE") == 1, finding.suggestion
