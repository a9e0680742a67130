"""The CLI around real recorded runs: `tputrace run` with the real recorder through the console script, and
`report`/`export` on a recorded trace. The stand-in-recorder tests of the same commands are in
tests/trace/test_cli_trace.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tputrace
from tputrace.cli.main import main

REPO_ROOT = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = Path(sys.executable).parent / "tputrace"


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.slow
@pytest.mark.skipif(
    not CONSOLE_SCRIPT.exists(), reason="the tputrace console script is not installed (pip install -e .)"
)
def test_run_with_the_real_recorder(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    script = _script(
        tmp_path,
        """
        import sys
        import torch
        x = torch.ones(4, 4, device="tpu")
        print("result", (x + 1).sum().item(), sys.argv[1:])
    """,
    )
    trace_path = tmp_path / "real.tptrace"
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), "run", "-o", str(trace_path), str(script), "a", "--b"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "result 32.0 ['a', '--b']" in result.stdout
    assert f"tputrace: trace saved to {trace_path}" in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["real.tptrace", "train.py"]
    with tputrace.open(trace_path) as trace:
        assert trace.run.exit_status == 0 and trace.run.argv == ("a", "--b")
        assert trace.count("ops") > 0


def test_report_export_and_tensorboard_share_one_default_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a real recorded run, `report` and `export` without --target use the same chip, the analysis's
    DEFAULT_TARGET, and every command's --help names it."""
    from tputrace.analysis.chips import DEFAULT_TARGET

    script = tmp_path / "tiny.py"
    script.write_text("import torch\nprint((torch.ones(4).to('tpu') * 2).sum().item())\n")
    trace_path = tmp_path / "tiny.tptrace"
    completed = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace_path), str(script)],
                               capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    capsys.readouterr()
    assert main(["report", "--json", str(trace_path)]) == 0
    target = json.loads(capsys.readouterr().out)["target"]
    assert (target["name"], target["is_default"]) == (DEFAULT_TARGET, True)
    assert main(["export", str(trace_path), "--perfetto", str(tmp_path / "trace.json.gz")]) == 0
    assert f"({DEFAULT_TARGET}); op times inside programs are estimates" in capsys.readouterr().err
    for command in ("report", "export", "tensorboard"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        help_text = " ".join(capsys.readouterr().out.split())
        assert f"(default: {DEFAULT_TARGET}" in help_text, (command, help_text)
