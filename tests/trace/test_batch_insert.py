"""Batches of rows inserted with as little binding as they allow (`tputrace.store.batch_insert`): columns NULL in
every row written as NULL literals, `None` bound through an adapter of the writer's own. What is stored is what one
bound INSERT per row stores: NULLs, values, their types, the rows' order, and bad rows dropped and counted. On real
SQLite files."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tputrace.store import TraceWriteError, TraceWriter
from tputrace.store.batch_insert import ROWS_PER_STATEMENT, BatchInserter

_NONE_KEY = (type(None), sqlite3.PrepareProtocol)


@pytest.fixture
def none_adapter_restored() -> Iterator[None]:
    before = sqlite3.adapters.get(_NONE_KEY)
    yield
    if before is None:
        sqlite3.adapters.pop(_NONE_KEY, None)
    else:
        sqlite3.adapters[_NONE_KEY] = before


def _table_rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(path)
    try:
        columns = [row[1] for row in connection.execute(f"PRAGMA table_info({table})")]
        typed = ", ".join(f"{column}, typeof({column})" for column in columns)
        return connection.execute(f"SELECT {typed} FROM {table} ORDER BY rowid").fetchall()
    finally:
        connection.close()


def _ops(count: int) -> list[tuple[Any, ...]]:
    """Ops rows: `outputs_sid`, `module_sid` and `flush_id` NULL in every row, `inputs_sid` in all but some,
    `frame_id` NULL in the first row only, `dur_ns` a float in one."""
    return [(seq, 0, 1, 1 if seq % 5 == 0 else None, None, 0, seq * 10, 2.5 if seq == 7 else 5,
             None if seq == 1 else seq % 3, None, seq // 4, 2, None) for seq in range(1, count + 1)]


@pytest.mark.parametrize("bulk", [False, True])
@pytest.mark.parametrize("count", [3, ROWS_PER_STATEMENT, 5 * ROWS_PER_STATEMENT + 7])
def test_a_batch_is_stored_as_one_bound_insert_per_row_stores_it(tmp_path: Path, bulk: bool, count: int,
                                                                 none_adapter_restored: None) -> None:
    rows = _ops(count)
    with TraceWriter(tmp_path / "batch.tptrace", bulk=bulk) as writer:
        writer.intern("aten.add.Tensor")
        writer.extend("ops", rows)
    reference = sqlite3.connect(tmp_path / "reference.tptrace")
    reference.execute(next(statement for statement in _schema(tmp_path / "batch.tptrace") if "TABLE ops " in statement))
    reference.executemany(f"INSERT INTO ops VALUES ({', '.join('?' * len(rows[0]))})", rows)
    reference.commit()
    reference.close()
    stored = _table_rows(tmp_path / "batch.tptrace", "ops")
    assert stored == _table_rows(tmp_path / "reference.tptrace", "ops")
    assert len(stored) == count and ("null" in stored[0]) and ("real" in stored[6] if count > 6 else True)


def _schema(path: Path) -> list[str]:
    connection = sqlite3.connect(path)
    try:
        return [sql for (sql,) in connection.execute("SELECT sql FROM sqlite_master WHERE type = 'table'")]
    finally:
        connection.close()


def test_a_row_of_the_wrong_length_is_dropped_and_counted_and_the_others_stored(tmp_path: Path) -> None:
    rows = _ops(3 * ROWS_PER_STATEMENT)
    rows[20] = rows[20][:-1]
    writer = TraceWriter(tmp_path / "bad.tptrace")
    writer.intern("aten.add.Tensor")
    writer.extend("ops", rows)
    with pytest.raises(TraceWriteError, match="1 rows could not be stored"):
        writer.close()
    stored = [row[0] for row in _table_rows(tmp_path / "bad.tptrace", "ops")]
    assert stored == [row[0] for index, row in enumerate(rows) if index != 20]


def test_columns_null_in_every_row_are_written_as_null_literals(tmp_path: Path) -> None:
    inserter = BatchInserter("pairs", ["a", "b", "c"])
    rows = [(index, None, None if index else "x") for index in range(40)]
    assert inserter.null_columns(rows) == (1,)  # `c` is not NULL in every row
    assert inserter.null_columns(rows[:3]) == ()  # too few rows to gain
    assert inserter.null_columns([*rows, (1, None)]) == ()  # a row of the wrong length: bound as it is, and fails
    connection = sqlite3.connect(tmp_path / "literals.db", isolation_level=None)
    connection.execute("CREATE TABLE pairs (a INTEGER, b INTEGER, c TEXT)")
    inserter.insert(connection, rows)
    assert connection.execute("SELECT count(*), count(b), count(c), sum(a) FROM pairs").fetchone() == (40, 0, 1, 780)


def test_an_adapter_the_process_registered_for_none_is_kept(tmp_path: Path, none_adapter_restored: None) -> None:
    def store_none_as_zero(value: None) -> int:
        return 0

    sqlite3.register_adapter(type(None), store_none_as_zero)
    with TraceWriter(tmp_path / "kept.tptrace") as writer:
        writer.intern("aten.add.Tensor")
    assert sqlite3.adapters[_NONE_KEY] is store_none_as_zero
