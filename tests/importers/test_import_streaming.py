"""Streaming imports: the block-wise JSON reader and the window-wise XSpace reader give what a whole-file
parse gives, an import read in tiny pieces is the same trace, bad captures are one-line errors, and XLA
compiles in an XProf capture become `compiles` rows."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import tputrace
from captures import jax_compile_capture
from tputrace.cli.main import main
from tputrace.importers import json_events, sink, wire
from tputrace.importers.chrome_json import ChromeJsonImporter, _is_user_frame
from tputrace.importers.json_events import event_lists
from tputrace.importers.sink import ImportSink
from tputrace.importers.wire import XSpaceFile
from tputrace.store.writer import TraceWriter
from tputrace.xplane_proto import encode_varint, messages


def _xplane(captures: dict[str, Path]) -> Path:
    return next(captures["jax"].rglob("*.xplane.pb"))


def _field_size(payload: int) -> int:
    """Bytes of a length-delimited field (a one-byte key, the length's varint, the payload)."""
    return 1 + len(encode_varint(payload)) + payload


def _dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, strings and frames resolved (ids of strings and frames may differ), sorted."""
    connection = sqlite3.connect(path)
    strings = dict(connection.execute("SELECT id, text FROM strings"))
    frames = {row[0]: (strings[row[1]], row[2], strings[row[3]])
              for row in connection.execute("SELECT id, file_sid, line, function_sid FROM frames")}
    tables = [name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
              if name not in ("strings", "frames", "meta")]
    dump = {}
    for table in tables:
        columns = [row[1] for row in connection.execute(f"PRAGMA table_info({table})")]
        rows = [tuple(strings.get(value) if column.endswith("_sid") else frames.get(value) if column == "frame_id"
                      else value for column, value in zip(columns, row))
                for row in connection.execute(f"SELECT * FROM {table}")]
        dump[table] = sorted(rows, key=repr)
    connection.close()
    return dump


def _import(path: Path, output: Path) -> Path:
    assert main(["import", str(path), "-o", str(output)]) == 0
    return output


@pytest.mark.parametrize("block", [97, 4096, None])
def test_the_json_stream_holds_the_events_of_a_whole_file_parse(captures: dict[str, Path], block: int | None) -> None:
    whole = json.loads(captures["profiler"].read_text())["traceEvents"]
    streamed = [event for events in event_lists(captures["profiler"], block) for event in events]
    assert streamed == whole and len(whole) > 100


def test_the_xspace_reader_holds_the_events_of_a_whole_message_parse(captures: dict[str, Path],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = _xplane(captures)
    classes = messages()
    space = classes["XSpace"]()
    space.ParseFromString(path.read_bytes())
    whole = [(plane.name, line.name, line.timestamp_ns, [event.SerializeToString() for event in line.events])
             for plane in space.planes for line in plane.lines]
    window = 512
    monkeypatch.setattr(wire, "_WINDOW", window)
    streamed = []
    metadata = 0
    most_pieces = 0
    with XSpaceFile(path) as reader:
        for span in reader.planes():
            plane, lines = reader.plane(span, classes["XPlane"])
            assert len(plane.lines) == 0  # the lines are read separately
            metadata += len(plane.event_metadata)
            for line in map(reader.line_head, lines):
                chunks = list(reader.events(line, classes["XLine"]))
                most_pieces = max(most_pieces, len(chunks))
                # Each piece parsed holds at most a window's worth of events: memory does not grow with the line.
                assert all(sum(_field_size(event.ByteSize()) for event in chunk) <= window for chunk in chunks)
                streamed.append((plane.name, line.name, line.timestamp_ns,
                                 [event.SerializeToString() for chunk in chunks for event in chunk]))
    assert streamed == whole and sum(len(events) for *_, events in whole) > 50 and metadata > 0
    assert most_pieces > 1


@pytest.mark.parametrize("capture", ["jax", "profiler"])
def test_an_import_read_in_tiny_pieces_is_the_same_trace(captures: dict[str, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, capture: str) -> None:
    usual = _dump(_import(captures[capture], tmp_path / "usual.tptrace"))
    monkeypatch.setattr(json_events, "_BLOCK", 211)
    monkeypatch.setattr(wire, "_WINDOW", 2048)
    monkeypatch.setattr(sink, "_ROWS_PER_COMMIT", 7)  # the writer's thread commits while the importer reads on
    tiny = _dump(_import(captures[capture], tmp_path / "tiny.tptrace"))
    assert tiny == usual
    assert len(usual["ops"]) > 0 and len(usual["annotations"]) > 0


def test_damaged_captures_are_one_line_errors(captures: dict[str, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    xplane = _xplane(captures).read_bytes()
    profile = captures["profiler"].read_text()
    middle = len(profile) // 2
    between = profile.index("},", middle) + 2
    cases = {
        # cut inside a plane's lines (the top level then runs past the end of the file)
        "cut.xplane.pb": (xplane[: len(xplane) * 9 // 10], "truncated"),
        "json.xplane.pb": (profile.encode()[:4000], "not an XSpace protobuf"),
        "cut.json": (profile[:middle].encode(), "truncated"),
        # between two events (inside a string the text would still be JSON)
        "garbled.json": ((profile[:between] + "#not json#" + profile[between:]).encode(), "damaged"),
        "cut-after-an-event.json": (profile[: profile.index("},", middle) + 1].encode(), "truncated"),
        "notes.txt": (b"hello\n", "not an xplane.pb"),
    }
    for name, (data, words) in cases.items():
        bad = tmp_path / name
        bad.write_bytes(data)
        assert main(["import", str(bad), "-o", str(tmp_path / "out.tptrace")]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (name, err)
        assert not (tmp_path / "out.tptrace").exists() and not (tmp_path / "out.tptrace.partial").exists()


def test_xla_compiles_in_an_xprof_capture_are_imported(tmp_path: Path) -> None:
    logdir = jax_compile_capture(tmp_path)
    trace = tputrace.open(_import(logdir, tmp_path / "compiles.tptrace"))
    compiles = [row for row in trace.records("compiles") if row.name == "jit_step"]
    assert [(row.kind, row.reason) for row in compiles] == [("xla", "first"), ("xla", "recompile")]
    assert all(row.dur_ns > 0 and row.start_ns >= 0 for row in compiles)
    # Each compile built its own program (one per input shape), named with XLA's id of its module.
    programs = {program.id: program for program in trace.records("programs")
                if program.id in {row.program_id for row in compiles}}
    assert len(programs) == 2 and {program.structure for program in programs.values()} == {"jit_step"}
    assert all(program.name.startswith("jit_step(") for program in programs.values())
    # The compiled programs are the ones executed: their ops point at them.
    assert {op.program_id for op in trace.records("ops") if op.op == "dot"} == set(programs)


def test_the_raw_text_scan_finds_what_decoding_finds(captures: dict[str, Path], tmp_path: Path) -> None:
    document = json.loads(captures["profiler"].read_text())
    stamps = [event["ts"] for event in document["traceEvents"] if "ts" in event]
    first, span = min(stamps), max(stamps) - min(stamps)
    document["traceEvents"] += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1,
                                 "tid": 1, "ts": first + span * step / 4, "dur": span / 4, "args": {}}
                                for step in range(4)]
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(document, indent=2))
    importer = ChromeJsonImporter(ImportSink(TraceWriter(tmp_path / "unused.tptrace", create_file=False)), [path])
    start_us, markers, frames = importer._scan_text()
    decoded_start_us, decoded_markers, decoded_frames = importer._scan_events()
    assert (start_us, sorted(markers), sorted(frames)) == (decoded_start_us, sorted(decoded_markers),
                                                           sorted(decoded_frames))
    assert start_us == first and len(markers) == 4 and frames


def test_user_frames_whose_names_are_escaped_in_the_text_are_found_as_decoding_finds_them(
        captures: dict[str, Path], tmp_path: Path) -> None:
    document = json.loads(captures["profiler"].read_text())
    renamed = 0
    for event in document["traceEvents"]:
        name = str(event.get("name", ""))
        if event.get("cat") == "python_function" and _is_user_frame(name):
            event["name"] = name + "_é"  # written as `\u00e9`: the scan decodes it once per distinct name
            renamed += 1
    assert renamed >= 1  # the script's `<module>` (the standard library's frames are not the user's)
    path = tmp_path / "escaped.json"
    path.write_text(json.dumps(document, indent=2, ensure_ascii=True))
    importer = ChromeJsonImporter(ImportSink(TraceWriter(tmp_path / "unused.tptrace", create_file=False)), [path])
    start_us, markers, frames = importer._scan_text()
    decoded_start_us, decoded_markers, decoded_frames = importer._scan_events()
    assert (start_us, markers, sorted(frames)) == (decoded_start_us, decoded_markers, sorted(decoded_frames))
    assert '\\u00e9' in path.read_text() and len(frames) == renamed and all(name.endswith("_é") for *_, name in frames)


def test_ops_nested_in_xla_loops_take_self_time_however_the_line_is_windowed(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from captures import jax_loops_capture

    logdir = jax_loops_capture(tmp_path)
    trace = tputrace.open(_import(logdir, tmp_path / "usual.tptrace"))
    ops = list(trace.records("ops"))
    loops = [op for op in ops if op.op.startswith("while")]
    assert len(loops) == 2  # the scan (XLA folds the short while_loop), in each of 2 steps
    for execution in trace.records("executions"):
        inside = [op for op in ops if op.chip == execution.chip
                  and execution.start_ns <= op.start_ns < execution.start_ns + execution.dur_ns]
        # Self times do not overlap: they fit in the program's run (the loop's time is not its body's again).
        assert any(op.op.startswith("while") for op in inside)
        assert sum(op.dur_ns for op in inside) <= execution.dur_ns
    usual = _dump(tmp_path / "usual.tptrace")
    monkeypatch.setattr(wire, "_WINDOW", 512)
    assert _dump(_import(logdir, tmp_path / "tiny.tptrace")) == usual
