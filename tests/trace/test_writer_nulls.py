"""The writer binds `None` through an adapter of its own (cheaper than sqlite3's failed adaptation lookup): the
values are still stored as NULL, and an adapter the process registered for `None` itself is left alone. On real
SQLite files."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tputrace.store import TraceWriter

_NONE_KEY = (type(None), sqlite3.PrepareProtocol)


@pytest.fixture
def none_adapter_restored() -> Iterator[None]:
    before = sqlite3.adapters.get(_NONE_KEY)
    yield
    if before is None:
        sqlite3.adapters.pop(_NONE_KEY, None)
    else:
        sqlite3.adapters[_NONE_KEY] = before


@pytest.mark.parametrize("bulk", [False, True])
def test_none_values_are_stored_as_null(tmp_path: Path, bulk: bool, none_adapter_restored: None) -> None:
    path = tmp_path / "nulls.tptrace"
    with TraceWriter(path, bulk=bulk) as writer:
        op_sid = writer.intern("aten.add.Tensor")
        # More rows than one multi-row statement holds, and a remainder bound one row at a time.
        writer.extend("ops", [(seq, 0, op_sid, None, None, 0, seq * 10, 5, None, None, 0, None, None)
                              for seq in range(1, 40)])
    connection = sqlite3.connect(path)
    try:
        kinds = connection.execute(
            "SELECT DISTINCT typeof(inputs_sid), typeof(outputs_sid), typeof(frame_id), typeof(module_sid),"
            " typeof(program_id), typeof(flush_id), typeof(op_sid) FROM ops").fetchall()
        count = connection.execute("SELECT count(*) FROM ops").fetchone()[0]
    finally:
        connection.close()
    assert kinds == [("null", "null", "null", "null", "null", "null", "integer")]
    assert count == 39


def test_an_adapter_the_process_registered_for_none_is_kept(tmp_path: Path, none_adapter_restored: None) -> None:
    def store_none_as_zero(value: None) -> int:
        return 0

    sqlite3.register_adapter(type(None), store_none_as_zero)
    with TraceWriter(tmp_path / "kept.tptrace") as writer:
        writer.intern("aten.add.Tensor")
    assert sqlite3.adapters[_NONE_KEY] is store_none_as_zero
