"""A program recompiled only because its inputs moved to another chip (`--chips 2`, the same ops and shapes on
`tpu:1` after `tpu:0`): a DeferAndFuse flush named the change by the reprs of its ops' non-tensor arguments, and a
torch.compile guard failure kept Dynamo's device indices as raw control bytes."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

ALTERNATING_CHIPS = textwrap.dedent("""\
    import torch


    @torch.compile(backend="tpu")
    def scored(x):
        return (x @ x).relu().sum()


    for step in range(4):
        chip = f"tpu:{step % 2}"
        x = torch.randn(32, 32, device=chip)
        y = (x @ x.T).tanh().mean()
        print(y.item(), scored(x).item())
""")


@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_a_recompile_for_another_chip_names_the_chips(mode: str, tmp_path: Path) -> None:
    """In strict mode an op's program for the same signature on the other chip said `same signature`."""
    script = tmp_path / "alternating.py"
    script.write_text(ALTERNATING_CHIPS)
    trace = tmp_path / "alternating.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main"]
    made = subprocess.run([*command, "run", "--quiet", "--mode", mode, "--chips", "2", "-o", str(trace), str(script)],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    summary = subprocess.run([*command, "summary", str(trace)], capture_output=True, text=True, timeout=300).stdout
    changes = [line.strip() for line in summary.splitlines() if line.strip().startswith("changed:")]
    assert any(re.fullmatch(r"changed: (op \d+ aten\.\w+\.\w+ \(alternating\.py:\d+\): )?chip: tpu:0 -> tpu:1 "
                            r"\(a program is compiled per chip\)", line) for line in changes), summary
    assert "changed: tensor 'x' Tensor device index mismatch. Expected device index to be 0, actual 1" in changes, summary
    assert not any("non-tensor arguments" in line or "same signature" in line for line in changes), summary
