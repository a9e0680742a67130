"""`tputrace diff` and `tputrace check` on the committed fixture traces (no torch needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tputrace.cli.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SMALL = str(FIXTURES / "tui_small.tptrace")
MARKUP = str(FIXTURES / "tui_markup.tptrace")


def test_diff_names_the_new_recompile_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", SMALL, MARKUP]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("regression: new recompile at ")
    assert "train[bold].py:7" in lines[0] and "input 0 dim 1" in lines[0]
    assert any(line.startswith("  fixed recompile at /home/user/proj/train.py:35") for line in lines)


def test_diff_of_a_trace_with_itself_has_no_regression(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", SMALL, SMALL, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["headline"] == "no regression"
    assert result["recompiles"] == [] and result["findings"] == []


def test_check_lists_violations_with_their_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    budget = tmp_path / "budget.toml"
    budget.write_text("max_recompiles = 0\nmax_syncs_per_step = 0\nmax_cpu_fallbacks = 100\n")
    assert main(["check", SMALL, "--budget", str(budget)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("max_recompiles = 0 exceeded: 2 recompile(s)")
    assert "in step 4 (input 0 dim 1: 128 -> 192) at /home/user/proj/train.py:35;" in out[0]
    assert out[0].endswith("in step 6 (tensor 'x' size mismatch at index 1: expected 128, actual 192) at /home/user/proj/model.py:77")
    assert out[1].startswith("max_syncs_per_step = 0 exceeded") and "train.py:35" in out[1]
    assert len(out) == 2


def test_check_within_budget_exits_0(tmp_path: Path) -> None:
    budget = tmp_path / "budget.toml"
    budget.write_text("max_recompiles = 5\nmax_step_time_ratio = 1.5\n")
    assert main(["check", SMALL, "--budget", str(budget), "--baseline", SMALL]) == 0


@pytest.mark.parametrize(("text", "message"), [
    ("max_recompile = 0\n", "unknown budget key 'max_recompile'"),
    ("max_recompiles = 1.5\n", "max_recompiles must be a whole number"),
    ("max_syncs_per_step = -1\n", "must not be negative"),
    ("max_recompiles = \n", "not valid TOML"),
])
def test_bad_budget_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    budget = tmp_path / "budget.toml"
    budget.write_text(text)
    assert main(["check", SMALL, "--budget", str(budget)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
