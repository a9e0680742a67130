"""`tputrace run`'s live output on real runs: compile lines with their reasons and the progress line
with `--live` (as on a terminal), nothing extra when stderr is not a terminal or with `--quiet`."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CONSOLE_SCRIPT = Path(sys.executable).parent / "tputrace"

# The pause lets the live output show the first compiles before the recompiles (it prints at most one
# compile line a second, counting the others).
RECOMPILING = """
import time
import torch
model = torch.nn.Linear(8, 4).to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step, batch in enumerate((16, 16, 24, 24)):
    if step == 2:
        time.sleep(1.5)
    loss = model(torch.randn(batch, 8, device="tpu")).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("done")
"""

pytestmark = pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="the tputrace console script is not installed")


def _run(tmp_path: Path, *options: str) -> str:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    script = tmp_path / "recompiling.py"
    script.write_text(textwrap.dedent(RECOMPILING))
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), "run", *options, "-o", str(tmp_path / "run.tptrace"), "--force", str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout
    return result.stderr


def test_live_output_shows_compiles_with_reasons_and_progress(tmp_path: Path) -> None:
    lines = re.split(r"[\r\n]", _run(tmp_path, "--live").replace("\x1b[2K", ""))
    compile_lines = [line for line in lines if line.startswith("tputrace: compile") or line.startswith("tputrace: recompile")]
    assert compile_lines and compile_lines[0].startswith("tputrace: compile: ")
    recompiles = [line for line in compile_lines if line.startswith("tputrace: recompile: ")]
    assert recompiles and all("24" in line for line in recompiles), compile_lines
    assert any(re.match(r"tputrace: step [1-9]\d* \(last .+\) · .* ops · .* compiles · .* syncs?$", line) for line in lines)


def test_no_live_output_off_a_terminal_or_when_quiet(tmp_path: Path) -> None:
    for options in ((), ("--live", "--quiet")):
        stderr = _run(tmp_path, *options)
        assert "tputrace: compile" not in stderr and "tputrace: recompile" not in stderr
        assert "tputrace: step" not in stderr and "\x1b[2K" not in stderr
