"""No command writes its output over one of its inputs, or over a file that is not an earlier output of the
same kind unless `--force` (`tputrace.cli.outputs`): `run -o`, `run --nproc -o`, `plot -o`,
`export --perfetto`, `merge -o`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tputrace.cli.main import main

NOTES = "my notes, not a trace\n"


@pytest.fixture()
def trace(sample_trace_path: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "sample.tptrace"
    shutil.copyfile(sample_trace_path, copy)
    return copy


@pytest.fixture()
def notes(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text(NOTES)
    return path


def _refused(arguments: list[str], capsys: pytest.CaptureFixture[str], message: str) -> None:
    assert main(arguments) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("tputrace: error:") and message in error and "\n" not in error, error


@pytest.mark.parametrize("nproc", [[], ["--nproc", "2"]], ids=["one-process", "nproc"])
def test_run_refuses_to_write_the_trace_over_its_script(tmp_path: Path, capsys: pytest.CaptureFixture[str], nproc: list[str]) -> None:
    script = tmp_path / "tiny.py"
    script.write_text("print('tiny')\n")
    _refused(["run", *nproc, "-o", str(script), str(script)], capsys, "is the input")
    assert script.read_text() == "print('tiny')\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tiny.py"]  # no .ranks folder either


def test_run_refuses_to_overwrite_a_file_that_is_not_a_trace(tmp_path: Path, notes: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "tiny.py"
    script.write_text("print('tiny')\n")
    _refused(["run", "-o", str(notes), str(script)], capsys, "is not a tputrace trace; pass --force")
    assert notes.read_text() == NOTES


def test_plot_refuses_its_own_trace_under_any_spelling(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = trace.read_bytes()
    (trace.parent / "sub").mkdir()
    for output in (trace, trace.parent / "sub" / ".." / trace.name):
        _refused(["plot", str(trace), "-o", str(output)], capsys, "is the input")
    _refused(["plot", "--compare", str(trace), str(trace), "-o", str(trace)], capsys, "is the input")
    assert trace.read_bytes() == before


def test_plot_overwrites_an_earlier_report_and_other_files_only_with_force(trace: Path, notes: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused(["plot", str(trace), "-o", str(notes)], capsys, "is not a tputrace HTML report")
    assert notes.read_text() == NOTES
    report = trace.with_suffix(".html")
    assert main(["plot", str(trace), "-o", str(report)]) == 0
    assert main(["plot", str(trace), "-o", str(report)]) == 0  # an earlier report is replaced
    assert main(["plot", str(trace), "-o", str(notes), "--force"]) == 0
    assert notes.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("name", ["export.json", "export.json.gz"])
def test_export_perfetto_refuses_the_trace_and_foreign_files(trace: Path, notes: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    before = trace.read_bytes()
    _refused(["export", str(trace), "--perfetto", str(trace)], capsys, "is the input")
    assert trace.read_bytes() == before
    _refused(["export", str(trace), "--perfetto", str(notes)], capsys, "is not a tputrace Perfetto export")
    assert notes.read_text() == NOTES
    export = trace.parent / name
    assert main(["export", str(trace), "--perfetto", str(export)]) == 0
    assert main(["export", str(trace), "--perfetto", str(export)]) == 0  # an earlier export is replaced
    assert main(["export", str(trace), "--perfetto", str(notes), "--force"]) == 0


def test_merge_refuses_an_input_and_foreign_files(trace: Path, notes: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = trace.read_bytes()
    _refused(["merge", str(trace), "-o", str(trace)], capsys, "is the input")
    assert trace.read_bytes() == before
    _refused(["merge", str(trace), "-o", str(notes)], capsys, "is not a tputrace trace")
    assert notes.read_text() == NOTES
    merged = trace.parent / "merged.tptrace"
    assert main(["merge", str(trace), "-o", str(merged)]) == 0
    assert main(["merge", str(trace), "-o", str(merged)]) == 0  # an earlier trace is replaced
    capsys.readouterr()
