"""The readable SQL views (`ops_v`, `compiles_v`, ...): created in new traces, added to older ones by
`tputrace sql-views`, with as many rows as their tables and names as text."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from tputrace.cli.main import main
from tputrace.schema import VIEW_SUFFIX, VIEW_TABLES


def _counts(path: Path, suffix: str) -> dict[str, int]:
    with sqlite3.connect(path) as connection:
        return {table: connection.execute(f"SELECT COUNT(*) FROM {table}{suffix}").fetchone()[0] for table in VIEW_TABLES}


def test_views_have_the_tables_rows(sample_trace_path: Path) -> None:
    table_counts = _counts(sample_trace_path, "")
    assert table_counts["ops"] > 0 and table_counts["compiles"] > 0
    assert _counts(sample_trace_path, VIEW_SUFFIX) == table_counts


def test_views_resolve_strings_and_frames(sample_trace_path: Path) -> None:
    with sqlite3.connect(sample_trace_path) as connection:
        joined = connection.execute(
            "SELECT o.seq, o.rank, s.text, fs.text, f.line, fn.text FROM ops o JOIN strings s ON s.id = o.op_sid "
            "LEFT JOIN frames f ON f.id = o.frame_id LEFT JOIN strings fs ON fs.id = f.file_sid "
            "LEFT JOIN strings fn ON fn.id = f.function_sid ORDER BY o.rank, o.seq").fetchall()
        viewed = connection.execute("SELECT seq, rank, op, file, line, function FROM ops_v ORDER BY rank, seq").fetchall()
    assert viewed == joined
    assert any(row[3] for row in viewed)


def test_sql_views_adds_them_to_an_older_trace(sample_trace_path: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    older = tmp_path / "older.tptrace"
    shutil.copy(sample_trace_path, older)
    with sqlite3.connect(older) as connection:
        for table in VIEW_TABLES:
            connection.execute(f"DROP VIEW {table}{VIEW_SUFFIX}")
        connection.execute("ALTER TABLE ops DROP COLUMN module_sid")
    assert main(["sql-views", str(older)]) == 0
    assert "ops_v" in capsys.readouterr().out
    assert _counts(older, VIEW_SUFFIX) == _counts(sample_trace_path, "")
    with sqlite3.connect(older) as connection:
        columns = [row[1] for row in connection.execute("PRAGMA table_info(ops_v)")]
    assert "op" in columns and "file" in columns and "module" not in columns


def test_pandas_reads_the_views(sample_trace_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    with sqlite3.connect(sample_trace_path) as connection:
        frame = pandas.read_sql_query("SELECT op, COUNT(*) AS calls FROM ops_v GROUP BY op", connection)
        op_count = connection.execute("SELECT COUNT(*) FROM ops").fetchone()[0]
    assert int(frame["calls"].sum()) == op_count
    assert frame["op"].notna().all()


def test_duckdb_reads_the_views(sample_trace_path: Path, tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    copy = tmp_path / "duck.tptrace"
    shutil.copy(sample_trace_path, copy)
    database = duckdb.connect()
    try:
        database.execute(f"ATTACH '{copy}' AS trace (TYPE sqlite, READ_ONLY)")
    except duckdb.IOException as error:
        pytest.skip(f"DuckDB's sqlite extension is not installed here and cannot be downloaded: {error}")
    (duck_count,) = database.execute("SELECT COUNT(*) FROM trace.ops_v WHERE op IS NOT NULL").fetchone()
    assert duck_count == _counts(sample_trace_path, "")["ops"]
