"""`tputrace report` on imported captures whose findings were read wrong: a failed recompile that ended the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tputrace.cli.main import main

# A compiled function whose input is marked dynamic after it compiled for one size, while its code branches on that
# size: the recompile fails with a ConstraintViolationError, which is not caught, and the script dies there.
MARKED_DYNAMIC = textwrap.dedent("""\
    import torch

    def step(x):
        if x.shape[0] == 4:
            return x.sum()
        return (x * 2).sum()

    compiled = torch.compile(step)
    compiled(torch.randn(8, 16))
    y = torch.randn(4, 16)
    torch._dynamo.mark_dynamic(y, 0)
    compiled(y)
""")


def test_a_failed_recompile_that_ended_the_run_is_a_critical_finding_at_the_users_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "marked_dynamic.py"
    script.write_text(MARKED_DYNAMIC)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TORCH_TRACE": str(tmp_path / "trace")})
    assert result.returncode != 0 and "ConstraintViolationError" in result.stderr, result.stderr[-2000:]
    assert main(["import", str(tmp_path / "trace"), "-o", str(tmp_path / "md.tptrace")]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "md.tptrace"), "--json"]) == 0
    findings = [finding for finding in json.loads(capsys.readouterr().out)["findings"]
                if "ConstraintViolationError" in finding["explanation"]]
    assert len(findings) == 1, findings
    (finding,) = findings
    assert finding["severity"] == "critical"
    assert "stopped the run" in finding["title"]
    assert (os.path.basename(finding["file"] or ""), finding["line"]) == ("marked_dynamic.py", 4)
    assert "as dynamic but your code specialized it" in finding["explanation"]
