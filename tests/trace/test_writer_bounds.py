"""The writer's bounds: its queues stay bounded however fast rows come, `close()` keeps to its index
budget and leaves the rest to the first reader that can write the file, and a reader that cannot still
reads the trace. On real SQLite files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import tputrace
from tputrace.schema import index_statements
from tputrace.store import TraceWriter
from tputrace.store import indexing
from tputrace.store.indexing import DEFERRED_META_KEY, index_name

ALL_INDEXES = sorted(index_name(statement) for statement in index_statements())


def _op(seq: int, op_sid: int) -> tuple[object, ...]:
    return (seq, 0, op_sid, None, None, 0, seq * 1000, 500, None, None, seq // 100, None, None)


def _indexes_in(path: Path) -> list[str]:
    connection = sqlite3.connect(path)
    try:
        return sorted(name for (name,) in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'idx_%'"))
    finally:
        connection.close()


def test_append_and_relieve_keep_every_queue_bounded(tmp_path: Path) -> None:
    path = tmp_path / "bounded.tptrace"
    # The background thread never commits here: only the bound makes rows reach the file early.
    writer = TraceWriter(path, commit_interval_s=3600, max_queued_rows=1000)
    op_sid = writer.intern("aten.add.Tensor")
    most_queued = 0
    for seq in range(1, 5001):
        writer.append("ops", _op(seq, op_sid))
        most_queued = max(most_queued, writer.queued("ops"))
    append_op = writer.appender("ops")
    for batch in range(50):
        for seq in range(5001 + batch * 100, 5101 + batch * 100):
            append_op(_op(seq, op_sid))
        writer.relieve()
        most_queued = max(most_queued, writer.queued("ops"))
    with tputrace.open(path) as trace:
        committed_before_close = trace.count("ops")
    writer.close()
    assert most_queued <= 1000
    assert committed_before_close >= 9000
    with tputrace.open(path) as trace:
        assert trace.count("ops") == 10_000
        assert [seq for (seq,) in trace.sql("SELECT seq FROM ops ORDER BY rowid")] == list(range(1, 10_001))


def _trace_with_deferred_indexes(path: Path) -> None:
    with TraceWriter(path, index_budget_s=0.0) as writer:
        writer.set_run(script="bounds.py", start_unix_ns=0)
        op_sid = writer.intern("aten.mul.Tensor")
        for seq in range(1, 3001):
            writer.append("ops", _op(seq, op_sid))
        writer.update_run(end_ns=3_000_000, exit_status=0)


def test_close_past_its_index_budget_defers_indexes_to_the_first_reader(tmp_path: Path) -> None:
    path = tmp_path / "deferred.tptrace"
    _trace_with_deferred_indexes(path)
    assert _indexes_in(path) == []
    connection = sqlite3.connect(path)
    (deferred,) = connection.execute("SELECT value FROM meta WHERE key = ?", (DEFERRED_META_KEY,)).fetchone()
    connection.close()
    assert sorted(indexing.deferred_indexes({DEFERRED_META_KEY: deferred})) == ALL_INDEXES
    with tputrace.open(path) as trace:
        assert DEFERRED_META_KEY not in trace.meta
        assert trace.count("ops") == 3000 and trace.run.finished
    assert _indexes_in(path) == ALL_INDEXES
    connection = sqlite3.connect(path)
    assert connection.execute("SELECT COUNT(*) FROM meta WHERE key = ?", (DEFERRED_META_KEY,)).fetchone() == (0,)
    connection.close()


def test_a_reader_that_cannot_write_reads_the_trace_without_its_indexes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "read-only.tptrace"
    _trace_with_deferred_indexes(path)
    monkeypatch.setattr(indexing.os, "access", lambda *_: False)
    with tputrace.open(path) as trace:
        assert DEFERRED_META_KEY in trace.meta
        assert trace.count("ops") == 3000
        assert trace.sql("SELECT COUNT(*), MIN(seq), MAX(seq) FROM ops WHERE rank = 0") == [(3000, 1, 3000)]
    assert _indexes_in(path) == []


def test_a_budget_large_enough_builds_every_index_on_close(tmp_path: Path) -> None:
    path = tmp_path / "indexed.tptrace"
    with TraceWriter(path) as writer:
        op_sid = writer.intern("aten.add.Tensor")
        for seq in range(1, 101):
            writer.append("ops", _op(seq, op_sid))
    assert _indexes_in(path) == ALL_INDEXES
    connection = sqlite3.connect(path)
    assert connection.execute("SELECT COUNT(*) FROM meta WHERE key = ?", (DEFERRED_META_KEY,)).fetchone() == (0,)
    connection.close()


def test_an_unknown_index_name_in_the_file_is_never_built(tmp_path: Path) -> None:
    path = tmp_path / "foreign.tptrace"
    _trace_with_deferred_indexes(path)
    connection = sqlite3.connect(path)
    connection.execute("UPDATE meta SET value = ? WHERE key = ?",
                       ('["idx_ops_op_sid", "x; DROP TABLE ops", 7]', DEFERRED_META_KEY))
    connection.commit()
    connection.close()
    with tputrace.open(path) as trace:
        assert trace.count("ops") == 3000
    assert _indexes_in(path) == ["idx_ops_op_sid"]


def test_commit_soon_commits_before_the_interval_ends_and_close_does_not_wait_for_it(tmp_path: Path) -> None:
    import time

    path = tmp_path / "soon.tptrace"
    writer = TraceWriter(path, commit_interval_s=3600)
    op_sid = writer.intern("aten.add.Tensor")
    for seq in range(1, 11):
        writer.append("ops", _op(seq, op_sid))
    writer.commit_soon()  # what a rank asks for as it starts waiting in a collective
    deadline = time.monotonic() + 10
    committed = 0
    while time.monotonic() < deadline and committed < 10:
        time.sleep(0.01)
        connection = sqlite3.connect(path)
        try:
            committed = connection.execute("SELECT COUNT(*) FROM ops").fetchone()[0]
        finally:
            connection.close()
    assert committed == 10
    started = time.monotonic()
    writer.close()
    assert time.monotonic() - started < 30  # the commit thread wakes for the close, not after its hour
