"""The trace store: TraceWriter -> file -> Trace, on real SQLite files."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import tputrace
from fixtures.make_traces import BROKEN_TRACE_MESSAGES, SAMPLE_RANKS, SAMPLE_STEPS, build_broken_traces
from tputrace.schema import FORMAT_VERSION, RECORD_KINDS, RECORD_KINDS_BY_TABLE, RecordKind, location_prefix
from tputrace.store import QueryError, Trace, TraceError, TraceWriteError, TraceWriter
from tputrace.store.records import RECORD_TYPES, SourceLocation, field_name

REPO_ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
EVENT_KINDS = [kind for kind in RECORD_KINDS if kind.table not in ("strings", "frames", "runs")]


def _known_row(writer: TraceWriter, kind: RecordKind) -> tuple[tuple[Any, ...], list[Any]]:
    """A row for `kind` with a distinct value per column, and the record fields it should read back as."""
    row: list[Any] = []
    expected: list[Any] = []
    for index, column in enumerate(kind.columns):
        if column.ref == "strings":
            text = f"{kind.table}.{column.name} text"
            row.append(writer.intern(text))
            expected.append(text)
        elif column.ref == "frames":
            row.append(writer.frame(f"/src/{kind.table}.py", 10 + index, f"fn_{kind.table}"))
            expected.append(SourceLocation(f"/src/{kind.table}.py", 10 + index, f"fn_{kind.table}"))
        elif column.name == "id":
            value = writer.next_id(kind.table)
            row.append(value)
            expected.append(value)
        elif column.kind == "REAL":
            row.append(1.5 * (index + 1))
            expected.append(1.5 * (index + 1))
        elif column.kind == "TEXT":
            text = '{"k": 1}' if column.name == "detail" else f"{column.name}-{index}"
            row.append(text)
            expected.append(text)
        else:
            value = 0 if column.name == "rank" else 1_000_000_007 * (index + 1)
            row.append(value)
            expected.append(value)
    return tuple(row), expected


@pytest.mark.parametrize("kind", EVENT_KINDS, ids=lambda kind: kind.table)
def test_round_trip_every_event_table(tmp_path: Path, kind: RecordKind) -> None:
    path = tmp_path / "t.tptrace"
    with TraceWriter(path) as writer:
        row, expected = _known_row(writer, kind)
        writer.append(kind.table, row)
    with tputrace.open(path) as trace:
        records = list(trace.records(kind.table))
        assert records == [RECORD_TYPES[kind.table](*expected)]
        assert trace.count(kind.table) == 1
        assert list(trace.raw_records(kind.table)) == [row]
        frame = trace.dataframe(kind.table)
        assert len(frame) == 1
        for column, value in zip(kind.columns, expected):
            if column.ref == "strings":
                assert frame[column.name.removesuffix("_sid")][0] == value
            elif column.ref == "frames":
                prefix = location_prefix(column.name, kind.column_names)
                assert (frame[f"{prefix}file"][0], frame[f"{prefix}line"][0], frame[f"{prefix}function"][0]) == (
                    value.file,
                    value.line,
                    value.function,
                )
            else:
                assert frame[column.name][0] == value


def test_round_trip_runs_strings_frames(tmp_path: Path) -> None:
    path = tmp_path / "t.tptrace"
    with TraceWriter(path, rank=1) as writer:
        writer.set_run(world_size=2, script="/x/train.py", argv=["--lr", "0.1"], platform="tpu", start_unix_ns=5)
        writer.set_run(world_size=2, script="/x/train.py", argv=["--lr", "0.2"], platform="tpu", start_unix_ns=6)
        writer.set_run(rank=0, world_size=2, script="/x/train.py", argv=[], start_unix_ns=7)
        writer.update_run(end_ns=99, exit_status=3, error="Traceback ...\nValueError: boom\n")
        sid = writer.intern("hello")
        assert writer.intern("hello") == sid
        frame_id = writer.frame("/x/train.py", 3, "main")
        assert writer.frame("/x/train.py", 3, "main") == frame_id
    with tputrace.open(path) as trace:
        assert trace.ranks == [0, 1]
        assert trace.run.rank == 0
        rank1 = trace.runs[1]
        assert rank1.argv == ("--lr", "0.2")
        assert (rank1.end_ns, rank1.exit_status, rank1.finished) == (99, 3, True)
        assert trace.runs[0].finished is False
        assert trace.string(sid) == "hello"
        assert trace.string_id("hello") == sid
        assert trace.string_id("absent") is None
        assert trace.frame(frame_id) == SourceLocation("/x/train.py", 3, "main")
        assert trace.frame(None) is None and trace.string(None) is None
        assert [record.text for record in trace.records("strings")] == ["hello", "/x/train.py", "main"]
        assert list(trace.records("frames"))[0].file == "/x/train.py"


def test_record_classes_follow_schema() -> None:
    assert set(RECORD_TYPES) == set(RECORD_KINDS_BY_TABLE)
    for kind in RECORD_KINDS:
        fields = [field.name for field in dataclasses.fields(RECORD_TYPES[kind.table])]
        assert fields == [field_name(kind, column) for column in kind.columns], kind.table


def test_writer_overwrites_and_leaves_one_file(tmp_path: Path) -> None:
    path = tmp_path / "t.tptrace"
    path.write_text("old contents")
    Path(f"{path}-wal").write_text("stale wal")
    with TraceWriter(path) as writer:
        writer.append("steps", (0, 1, 0, 10, "explicit"))
    assert sorted(os.listdir(tmp_path)) == ["t.tptrace"]
    with tputrace.open(path) as trace:
        assert trace.count("steps") == 1
        assert trace.format_version == FORMAT_VERSION
        assert trace.meta["magic"] == "tputrace-trace"
        indexes = {name for (name,) in trace.sql("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "idx_ops_op_sid" in indexes


def test_flush_commits_for_a_concurrent_reader(tmp_path: Path) -> None:
    path = tmp_path / "t.tptrace"
    writer = TraceWriter(path, commit_interval_s=60)
    try:
        writer.append("steps", (0, 1, 0, 10, "explicit"))
        writer.flush()
        with tputrace.open(path) as trace:
            assert trace.count("steps") == 1
            assert trace.run.script is None
    finally:
        writer.close()


def test_bad_rows_are_dropped_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "t.tptrace"
    writer = TraceWriter(path)
    writer.append("steps", (0, 1, 0, 10, "explicit"))
    writer.append("steps", (0, 2))
    writer.append("steps", (0, 3, 20, 30, "explicit"))
    with pytest.raises(TraceWriteError, match="1 rows could not be stored"):
        writer.flush()
    writer.flush()
    writer.close()
    with pytest.raises(KeyError):
        writer.append("no_such_table", ())
    with pytest.raises(KeyError):
        writer.next_id("ops")
    with pytest.raises(TypeError):
        writer.set_run(no_such_column=1)
    with tputrace.open(path) as trace:
        assert [record.step for record in trace.records("steps")] == [1, 3]


def test_appends_from_four_threads(tmp_path: Path) -> None:
    path = tmp_path / "t.tptrace"
    per_thread = 20_000
    writer = TraceWriter(path, commit_interval_s=0.02)
    dangling_seen: list[int] = []
    writing = threading.Event()
    writing.set()

    def produce(thread_index: int) -> None:
        append = writer.appender("ops")
        for seq in range(per_thread):
            op_sid = writer.intern(f"aten.op_{seq % 50}_{thread_index % 2}")
            frame_id = writer.frame("/x/model.py", seq % 97, f"thread_{thread_index}")
            append((seq, thread_index, op_sid, None, None, 0, seq, 1, frame_id, None, 0, None, None))

    def watch_references() -> None:
        while writing.is_set():
            if path.exists():
                connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
                try:
                    (dangling,) = connection.execute(
                        "SELECT COUNT(*) FROM ops WHERE op_sid NOT IN (SELECT id FROM strings) "
                        "OR frame_id NOT IN (SELECT id FROM frames)"
                    ).fetchone()
                    dangling_seen.append(dangling)
                except sqlite3.OperationalError:
                    pass
                finally:
                    connection.close()
            time.sleep(0.005)

    watcher = threading.Thread(target=watch_references)
    watcher.start()
    producers = [threading.Thread(target=produce, args=(index,)) for index in range(4)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join()
    writer.close()
    writing.clear()
    watcher.join()

    assert dangling_seen and max(dangling_seen) == 0
    with tputrace.open(path) as trace:
        assert trace.count("ops") == 4 * per_thread
        assert trace.count("strings") == 100 + 1 + 4  # op names, the file, one function per thread
        for rank in range(4):
            seqs = [seq for (seq,) in trace.sql("SELECT seq FROM ops WHERE rank = ? ORDER BY rowid", (rank,))]
            assert seqs == list(range(per_thread))
        (resolved,) = trace.sql("SELECT COUNT(*) FROM ops JOIN strings ON strings.id = ops.op_sid")[0]
        assert resolved == 4 * per_thread


_CHILD_WRITER = textwrap.dedent(
    """
    import signal, sys, time
    from tputrace.store.writer import TraceWriter

    def on_sigterm(signum, frame):
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
    with TraceWriter(sys.argv[1], commit_interval_s=0.25) as writer:
        writer.set_run(script="child.py", start_unix_ns=time.time_ns())
        op_sid = writer.intern("aten.add.Tensor")
        append = writer.appender("ops")
        seq = 0
        announced = False
        while True:
            for _ in range(100):
                seq += 1
                append((seq, 0, op_sid, None, None, 0, time.monotonic_ns(), 1000, None, None, 0, None, None))
            time.sleep(0.001)
            if not announced and seq >= 5000:
                print("ready", flush=True)
                announced = True
    """
)


def _start_child_writer(path: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD_WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=SUBPROCESS_ENV
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


def test_sigkill_leaves_a_readable_trace_missing_at_most_the_last_second(tmp_path: Path) -> None:
    path = tmp_path / "killed.tptrace"
    child = _start_child_writer(path)
    time.sleep(1.0)
    killed_at_ns = time.monotonic_ns()
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    assert Path(f"{path}-wal").exists()
    with tputrace.open(path) as trace:
        assert trace.count("ops") > 5000
        assert trace.run.script == "child.py"
        assert not trace.run.finished
        (last_ns,) = trace.sql("SELECT MAX(start_ns) FROM ops")[0]
        assert killed_at_ns - last_ns < 1_000_000_000
        assert trace.op_stats()[0].op == "aten.add.Tensor"


def test_sigterm_closes_the_trace_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "terminated.tptrace"
    child = _start_child_writer(path)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=10) == 143
    assert sorted(os.listdir(tmp_path)) == ["terminated.tptrace"]
    with tputrace.open(path) as trace:
        assert trace.count("ops") >= 5000
        indexes = {name for (name,) in trace.sql("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "idx_ops_op_sid" in indexes


@pytest.mark.parametrize("name", list(BROKEN_TRACE_MESSAGES))
def test_unreadable_files_raise_one_sentence(tmp_path: Path, sample_trace_path: Path, name: str) -> None:
    path = build_broken_traces(tmp_path, sample_trace_path)[name]
    with pytest.raises(TraceError) as raised:
        with tputrace.open(path) as trace:
            for table in RECORD_KINDS_BY_TABLE:
                list(trace.records(table))
    message = str(raised.value)
    assert BROKEN_TRACE_MESSAGES[name] in message
    assert "\n" not in message
    if name == "newer_version":
        assert f"(format {FORMAT_VERSION + 1}, this reads up to {FORMAT_VERSION})" in message


def test_tputrace_exposes_the_error_types() -> None:
    assert tputrace.TraceError is TraceError
    assert issubclass(TraceError, tputrace.TputraceError)
    with pytest.raises(AttributeError):
        tputrace.no_such_name  # noqa: B018


def test_sample_trace_contents(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        assert trace.ranks == list(range(SAMPLE_RANKS))
        counts = trace.counts()
        # `kernel_launches` is filled only by an imported GPU capture (tests/importers/test_import_kernel_launches.py).
        assert all(counts[table] > 0 for table in RECORD_KINDS_BY_TABLE if table != "kernel_launches"), counts
        assert counts["steps"] == SAMPLE_RANKS * SAMPLE_STEPS
        assert {record.rank for record in trace.records("collectives")} == {0, 1}
        first_op = next(trace.records("ops"))
        assert first_op.op == "aten.embedding.default"
        assert first_op.module == "GPT.wte"
        assert first_op.source == SourceLocation("/home/user/proj/model.py", 88, "forward")
        recompile = next(trace.records("compiles", where="reason = ?", params=("recompile",)))
        assert recompile.diff == "input 0 dim 1: 128 -> 192"
        assert recompile.is_recompile
        frame = trace.dataframe("ops", where="rank = ?", params=(1,), limit=5)
        assert list(frame.columns[:5]) == ["seq", "rank", "op", "inputs", "outputs"]
        assert {"file", "line", "function", "module"} <= set(frame.columns)
        assert len(frame) == 5 and set(frame["rank"]) == {1}
        raw = trace.dataframe("ops", limit=1, resolve=False)
        assert "op_sid" in raw.columns


def test_aggregates_agree_with_records(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        ops = list(trace.records("ops", where="rank = 0"))
        by_op: dict[str | None, list[int]] = {}
        for op in ops:
            by_op.setdefault(op.op, []).append(op.dur_ns or 0)
        stats = trace.op_stats(rank=0)
        assert {stat.op: (stat.count, stat.total_ns) for stat in stats} == {
            name: (len(durations), sum(durations)) for name, durations in by_op.items()
        }
        assert [stat.total_ns for stat in stats] == sorted((stat.total_ns for stat in stats), reverse=True)
        assert sum(stat.share for stat in stats) == pytest.approx(1.0)
        assert trace.op_stats(limit=2, order="count")[0].count >= trace.op_stats(limit=2, order="count")[1].count
        assert trace.op_stats("op_shapes", limit=1)[0].inputs
        assert trace.op_stats("source", limit=1)[0].source is not None
        assert trace.op_stats("module", limit=3)[0].label
        with pytest.raises(tputrace.TputraceError):
            trace.op_stats("nonsense")  # type: ignore[arg-type]

        steps = trace.step_times(rank=0)
        assert [step.step for step in steps] == list(range(1, SAMPLE_STEPS + 1))
        assert sum(step.ops for step in steps) == len(ops)
        assert sum(step.compiles for step in steps) == trace.count("compiles", where="rank = 0")

        split = trace.time_split(rank=0)
        assert split.dispatch_ns == sum(op.dur_ns or 0 for op in ops)
        assert split.wall_ns == trace.run.end_ns
        first_ns, last_ns = trace.time_range(rank=0)
        assert 0 <= first_ns < last_ns <= split.wall_ns

        compiles = trace.compile_stats(rank=0)
        assert (compiles.count, compiles.recompiles) == (5, 2)
        groups = trace.recompile_groups(rank=0)
        assert {group.reason for group in groups} == {"recompile", "guard_failure"}
        syncs = trace.sync_stats(rank=0)
        assert syncs[0].kind == "item" and syncs[0].source == SourceLocation("/home/user/proj/train.py", 35, "train_step")
        fallbacks = trace.fallback_stats(rank=0)
        assert fallbacks[0].op == "aten._unique2.default"
        assert {stat.kind for stat in trace.collective_stats()} == {"all_reduce", "broadcast"}


def test_query_errors_and_unknown_tables(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        assert trace.sql("SELECT COUNT(*) FROM steps WHERE rank = ?", (1,)) == [(SAMPLE_STEPS,)]
        with pytest.raises(QueryError):
            trace.sql("SELECT nope FROM steps")
        with pytest.raises(QueryError):
            trace.sql("DELETE FROM steps")
        with pytest.raises(tputrace.TputraceError, match="unknown record kind"):
            trace.count("nope")


def test_trace_without_run_row_has_placeholder_run(tmp_path: Path) -> None:
    path = tmp_path / "t.tptrace"
    TraceWriter(path).close()
    with tputrace.open(path) as trace:
        assert (trace.run.rank, trace.run.script, trace.run.argv, trace.run.finished) == (0, None, (), False)
        assert trace.ranks == [0]
        assert trace.time_range() == (0, 0)
        assert trace.time_split().wall_ns == 0
        assert isinstance(trace, Trace)


def test_strings_and_lines_that_are_not_text_or_numbers_read_as_unknown(tmp_path: Path, sample_trace_path: Path) -> None:
    """SQLite keeps any value in any column: a damaged file's NULL or blob string reads as an unknown id does
    (None, a location's `?`), and a line that is not a number as 0, so views get the types the format promises."""
    import shutil
    import sqlite3

    path = tmp_path / "damaged.tptrace"
    shutil.copyfile(sample_trace_path, path)
    with sqlite3.connect(path) as connection:
        frame_id, file_sid, function_sid = connection.execute("SELECT id, file_sid, function_sid FROM frames LIMIT 1").fetchone()
        connection.execute("UPDATE strings SET text = NULL WHERE id = ?", (file_sid,))
        connection.execute("UPDATE strings SET text = CAST(text AS BLOB) WHERE id = ?", (function_sid,))
        connection.execute("UPDATE frames SET line = 'x' WHERE id = ?", (frame_id,))
    connection.close()
    with tputrace.open(path) as trace:
        assert (trace.string(file_sid), trace.string(function_sid)) == (None, None)
        location = trace.frame(frame_id)
        assert (location.file, location.line, location.function) == ("?", 0, "?")
        assert all(isinstance(op.op, (str, type(None))) for op in trace.records("ops"))


def test_control_characters_read_as_escapes(tmp_path: Path) -> None:
    """A trace's text reaches every view (the TUI too) with its control characters written as escapes, so an
    escape sequence in a name cannot act on the terminal that shows it; newlines and tabs stay."""
    escapes = "\x1b]0;retitled\x07\x1b[2J\x9b"
    path = tmp_path / "t.tptrace"
    with TraceWriter(path) as writer:
        writer.set_run(world_size=1, script=f"/w/t{escapes}.py", argv=[f"--x{escapes}"], host=f"h{escapes}")
        frame = writer.frame(f"/w/t{escapes}.py", 3, f"main{escapes}")
        writer.append("syncs", (0, f"item{escapes}", frame, 0, 0, 10, 0, 0, None))
        writer.update_run(end_ns=20, exit_status=1, error=f"Traceback\n\tValueError: x{escapes}")
        op_sid = writer.intern(f"aten.add{escapes}")
    shown = "\\x1b]0;retitled\\x07\\x1b[2J\\x9b"
    with tputrace.open(path) as trace:
        assert trace.string(op_sid) == f"aten.add{shown}"
        assert (trace.frame(1).file, trace.frame(1).function) == (f"/w/t{shown}.py", f"main{shown}")
        run = trace.run
        assert (run.script, run.argv, run.host) == (f"/w/t{shown}.py", (f"--x{shown}",), f"h{shown}")
        assert run.error == f"Traceback\n\tValueError: x{shown}"
        assert next(trace.records("syncs")).kind == f"item{shown}"


def test_reading_never_imports_torch_or_jax(sample_trace_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        import tputrace, tputrace.store, tputrace.summary, tputrace.cli.main
        from tputrace.summary import render_text, summarize
        with tputrace.open({str(sample_trace_path)!r}) as trace:
            text = render_text(summarize(trace))
            trace.dataframe("ops", limit=3)
        assert "aten.mm.default" in text
        heavy = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "jax", "jaxlib"))
        assert not heavy, heavy
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_docs_describe_every_table_and_column() -> None:
    text = (REPO_ROOT / "docs" / "trace-format.md").read_text()
    sections = re.split(r"^### ", text, flags=re.M)
    by_table = {section.split("`", 2)[1]: section for section in sections[1:] if section.startswith("`")}
    for kind in RECORD_KINDS:
        assert kind.table in by_table, f"docs/trace-format.md has no '### `{kind.table}`' section"
        for column in kind.columns:
            assert f"| `{column.name}` |" in by_table[kind.table], f"{kind.table}.{column.name} is not documented"
    assert "| `key` |" in by_table["meta"]
