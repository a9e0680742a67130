"""The XProf writer streams: its lines' events wait in files, and what it writes is the same bytes whatever
its chunk sizes (digests in tests/fixtures/xprof_golden.json)."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import sys
import tracemalloc
from pathlib import Path

import pytest

import tputrace
from tputrace import xplane_proto
from tputrace.viewers.export import xplane_builder, xplane_device, xplane_line
from tputrace.viewers.export.xplane import export_tensorboard
from tputrace.viewers.export.xplane_line import Line, Ref

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = json.loads((FIXTURES / "xprof_golden.json").read_text())["outputs"]

pytest.importorskip("google.protobuf", reason="the XProf export needs protobuf (pip install -e .[views])")


def _fixture_trace(name: str, folder: Path) -> Path:
    """The fixture trace `name`, unpacked into `folder` when it is committed gzipped."""
    packed = FIXTURES / f"{name}.gz"
    if not packed.exists():
        return FIXTURES / name
    path = folder / name
    with gzip.open(packed) as source, path.open("wb") as target:
        shutil.copyfileobj(source, target)
    return path


def _export(trace_name: str, folder: Path) -> dict[str, bytes]:
    """The files an export of fixture trace `trace_name` writes, by name; checks that no spill file is left."""
    folder.mkdir()
    with tputrace.open(_fixture_trace(trace_name, folder)) as trace:
        exports = export_tensorboard(trace, folder / "logdir", run="r")
    run_dir = folder / "logdir" / "plugins" / "profile" / "r"
    assert sorted(path.name for path in run_dir.iterdir()) == sorted(export.path.name for export in exports)
    return {export.path.name: export.path.read_bytes() for export in exports}


@pytest.fixture(params=["default", "tiny"])
def chunks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """`tiny` chunks make every line spill, merge many sorted chunks, and drop spilled events when
    interleaved flushes restart the scan; event metadata go to their file a few at a time, and the
    caches of encoded stats and op descriptions start again every few entries."""
    if request.param == "tiny":
        monkeypatch.setattr(xplane_line, "CHUNK_EVENTS", 5)
        monkeypatch.setattr(xplane_line, "MERGE_EVENTS", 7)
        monkeypatch.setattr(xplane_builder, "METADATA_BUFFER_BYTES", 100)
        monkeypatch.setattr(xplane_builder, "MAX_CACHED_STATS", 3)
        monkeypatch.setattr(xplane_device, "MAX_CACHED_DESCRIPTIONS", 2)
    return str(request.param)


@pytest.mark.parametrize("trace_name", sorted(GOLDEN))
def test_streamed_files_are_the_recorded_bytes_at_any_chunk_size(trace_name: str, chunks: str, tmp_path: Path) -> None:
    """On a recorded trace (gpt_train, whose Python dispatch line comes out of start order), the sample
    trace, and the interleaved-flush and strict-mode traces."""
    pytest.importorskip("numpy")
    files = _export(trace_name, tmp_path / "out")
    assert sorted(files) == sorted(GOLDEN[trace_name])
    for name, data in files.items():
        expected = GOLDEN[trace_name][name]["numpy"]
        assert (len(data), hashlib.sha256(data).hexdigest()) == (expected["bytes"], expected["sha256"]), name


@pytest.mark.parametrize("trace_name", sorted(GOLDEN))
def test_without_numpy_the_files_hold_the_same_messages(trace_name: str, chunks: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without numpy, events are encoded one by one (a duration of 0 left out): the same messages, and the
    recorded no-numpy bytes (see xprof_golden.json)."""
    pytest.importorskip("numpy")
    with_numpy = _export(trace_name, tmp_path / "numpy")
    monkeypatch.setitem(sys.modules, "numpy", None)
    without = _export(trace_name, tmp_path / "no_numpy")
    space = xplane_proto.messages()["XSpace"]
    for name, data in without.items():
        assert space.FromString(data) == space.FromString(with_numpy[name]), name
        expected = GOLDEN[trace_name][name].get("no_numpy")
        if expected is not None:
            assert (len(data), hashlib.sha256(data).hexdigest()) == (expected["bytes"], expected["sha256"]), name


def test_a_line_keeps_at_most_a_chunk_of_events_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xplane_line, "CHUNK_EVENTS", 1_000)
    line = Line("ops", tmp_path / "line")
    events = 200_000
    tracemalloc.start()
    try:
        for start in range(0, events, 500):
            line.extend(range(start, start + 500), range(start * 10, (start + 500) * 10, 10), [5] * 500)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(line) == events
    assert (tmp_path / "line.events").stat().st_size == events * 4 * 8
    assert peak < 1_000_000  # all events in memory would take 6.4 MB


def test_a_failed_export_leaves_no_spill_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        raise RuntimeError("stop")

    monkeypatch.setattr(Line, "write", fail)
    with tputrace.open(FIXTURES / "tui_small.tptrace") as trace, pytest.raises(RuntimeError):
        export_tensorboard(trace, tmp_path / "logdir", run="r")
    assert list(tmp_path.iterdir()) == []


def test_event_stats_survive_their_file() -> None:
    names: dict[str, int] = {}
    stats = [("text", "a\udcff\n\"b"), ("none", None), ("count", 7), ("big", 1 << 64), ("negative", -3), ("flag", True),
             ("ratio", 0.25), ("raw", b"\x00\xff"), ("note", Ref("shared text")), ("other", 2.5j)]
    packed = xplane_line._pack_stats(names, stats)
    size, start = xplane_proto.decode_varint(packed, 0)
    assert start + size == len(packed)
    unpacked = xplane_line._unpack_stats(list(names), memoryview(packed)[start:])
    assert unpacked == [(name, str(value) if name == "other" else value) for name, value in stats if value is not None]
    assert [type(value) for _, value in unpacked] == [str, int, int, int, bool, float, bytes, Ref, str]
