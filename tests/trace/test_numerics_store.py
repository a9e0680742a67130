"""The numerics recording file and its findings, from hand-written rows (no torch)."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from tputrace.numerics.findings import compare_report, render, replay_report
from tputrace.numerics.store import COMPARED, NOT_COMPARED, ModuleCall, NumericsWriter, TensorDigest, read_recording
from tputrace.numerics.tolerance import digest_difference, tolerance_for
from tputrace.store.errors import TputraceError


def _digest(norm: float, sample: list[float], nonfinite: int = 0, dtype: str = "float32") -> TensorDigest:
    return TensorDigest(dtype, (2, 2), norm, max(abs(v) for v in sample if math.isfinite(v)), nonfinite, sample)


def _write(path: Path, calls: list[ModuleCall]) -> None:
    writer = NumericsWriter(path, {"script": "train.py", "mode": "defer"}, batch=1)
    for call in calls:
        writer.add_call(call)
    writer.close()


def _call(event_id: int, module: str, **fields: object) -> ModuleCall:
    return ModuleCall(
        event_id,
        event_id,
        1,
        str(fields.pop("phase", "forward")),
        module,
        "Linear",
        "/src/train.py",
        10 + event_id,
        **fields,
    )  # type: ignore[arg-type]


def test_a_recording_round_trips_with_non_finite_samples(tmp_path: Path) -> None:
    call = _call(1, "Net.fc", outcome=COMPARED, divergence=0.5, tolerance=1e-4, reference_dtype="float32")
    call.tpu[0] = _digest(2.0, [1.0, math.nan, -math.inf, 0.5], nonfinite=2)
    call.cpu[0] = _digest(2.0, [1.0, 0.0, 0.0, 0.5])
    _write(tmp_path / "run.tpnum", [call])
    back = read_recording(tmp_path / "run.tpnum").calls[0]
    assert back.tpu[0].sample[:1] == [1.0] and math.isnan(back.tpu[0].sample[1]) and back.tpu[0].sample[2] == -math.inf
    assert back.cpu[0] == call.cpu[0] and back.nonfinite == 2 and back.diverged


def test_the_first_divergent_call_in_execution_order_is_reported(tmp_path: Path) -> None:
    calls = [
        _call(1, "Net.a", outcome=COMPARED, divergence=1e-6, tolerance=1e-4, reference_dtype="float32"),
        _call(
            2,
            "Net.b",
            outcome=COMPARED,
            divergence=3e-3,
            tolerance=1e-4,
            reference_dtype="float32",
            reason="bfloat16 on the tpu, float32 on the CPU",
        ),
        _call(3, "Net", outcome=COMPARED, divergence=1e-2, tolerance=1e-4, reference_dtype="float32"),
        _call(4, "Net.drop", outcome=NOT_COMPARED, reason="random"),
    ]
    _write(tmp_path / "run.tpnum", calls)
    report = replay_report(read_recording(tmp_path / "run.tpnum"))
    assert report.first_divergence is not None and report.first_divergence.call.module == "Net.b"
    assert report.not_compared == [("Net.drop", "random", 1)]
    text = render(report)
    assert "first divergent module: Net.b (Linear) forward, step 1, at train.py:12" in text
    assert "dtype: bfloat16 on the tpu, float32 on the CPU" in text


def test_comparing_digests_flags_a_changed_norm_and_new_non_finite_values(tmp_path: Path) -> None:
    reference = [_call(1, "Net.a"), _call(2, "Net.b"), _call(3, "Net.b", phase="backward")]
    changed = [_call(1, "Net.a"), _call(2, "Net.b"), _call(3, "Net.b", phase="backward")]
    for call in reference + changed:
        call.tpu[0] = _digest(4.0, [1.0, 2.0])
    changed[1].tpu[0] = _digest(4.01, [1.0, 2.0])
    changed[2].tpu[0] = _digest(4.0, [1.0, math.nan], nonfinite=1)
    _write(tmp_path / "a.tpnum", changed)
    _write(tmp_path / "b.tpnum", reference)
    report = compare_report(read_recording(tmp_path / "a.tpnum"), read_recording(tmp_path / "b.tpnum"))
    assert report.first_divergence is not None and report.first_divergence.call.module == "Net.b"
    assert report.first_divergence.divergence == pytest.approx(0.0025)
    assert report.first_nonfinite is not None and report.first_nonfinite.phase == "backward"
    assert report.reference_nonfinite is False


def test_tolerances_fit_the_dtype() -> None:
    assert tolerance_for("bfloat16") == 1e-2 and tolerance_for("float32") == 1e-4
    assert digest_difference(1.0, [0.5], 1.0, [0.5]) == 0.0
    assert digest_difference(0.0, [0.0], 0.0, [1e-3]) == 1.0
    assert digest_difference(1.0, [0.0], 0.0, [0.0]) == math.inf


def test_a_file_that_is_not_a_recording_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(TputraceError, match="not a tputrace numerics recording"):
        read_recording(other)
    with pytest.raises(TputraceError, match="no such numerics recording"):
        read_recording(tmp_path / "missing.tpnum")


def test_the_compare_command_prints_the_first_divergence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tputrace.cli.main import main

    reference, changed = [_call(1, "Net.a")], [_call(1, "Net.a")]
    reference[0].tpu[0] = _digest(4.0, [1.0, 2.0])
    changed[0].tpu[0] = _digest(4.0, [1.0, 2.5], dtype="bfloat16")
    _write(tmp_path / "a.tpnum", changed)
    _write(tmp_path / "b.tpnum", reference)
    assert main(["numerics", "--compare", str(tmp_path / "a.tpnum"), str(tmp_path / "b.tpnum")]) == 0
    out = capsys.readouterr().out
    assert "first divergent module: Net.a (Linear) forward, step 1, at train.py:11" in out
    assert "dtype: bfloat16 here, float32 in the reference" in out
    assert main(["numerics"]) == 2
    assert main(["numerics", "--compare", str(tmp_path / "a.tpnum"), str(tmp_path / "b.tpnum"), "train.py"]) == 2
    assert main(["numerics", "--compare", str(tmp_path / "a.tpnum"), str(tmp_path / "missing.tpnum")]) == 2
    assert "no such numerics recording" in capsys.readouterr().err
