"""`tputrace import` on captures as other tools leave them on disk: a log dir that several runs of a script
wrote to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tputrace
from captures import jax_capture, torch_schedule_capture
from tputrace.cli.main import main

_CAPTURES = (".xplane.pb", ".pt.trace.json.gz")


def _import(capsys: pytest.CaptureFixture[str], output: Path, *paths: Path) -> tuple[tputrace.Trace, str]:
    capsys.readouterr()
    assert main(["import", *map(str, paths), "-o", str(output)]) == 0
    return tputrace.open(output), capsys.readouterr().err


@pytest.mark.parametrize("make", [jax_capture, torch_schedule_capture], ids=["xprof", "torch_profiler"])
def test_a_folder_two_runs_wrote_to_imports_the_latest_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           make: object) -> None:
    assert callable(make)
    make(tmp_path)
    first = {path for path in tmp_path.rglob("*") if path.is_file()}
    folder = make(tmp_path)  # the same script run again, into the same folder
    second = sorted(path for path in folder.rglob("*") if path not in first and path.name.endswith(_CAPTURES))
    trace, err = _import(capsys, tmp_path / "latest.tptrace", folder)
    # The two processes did not run together: the latest run is the trace, not a second rank beside the first.
    sources = json.loads(trace.meta["imported"])
    assert len(sources) == 1
    imported = sources[0].get("windows") or [sources[0]["path"]]
    assert sorted(map(Path, imported)) == second
    assert f"{folder}: holds 2 runs whose captures do not overlap in time; imported the latest" in err
    # Named file by file, every capture is imported: two ranks.
    earlier = sorted(path for path in first if path.name.endswith(_CAPTURES))
    named, err = _import(capsys, tmp_path / "named.tptrace", *earlier, *second)
    assert len(json.loads(named.meta["imported"])) == 2 and "runs whose captures" not in err
