"""`TORCH_TRACE` logs as other people's tools and torch versions write them: the real log of a script compiled here,
edited the way older or other logs differ (no times in the metrics, no graph-break artifacts, cache artifacts, a
damaged line, another file name), and small logs built in the format's structure where this machine cannot make
them (a torch source checkout, AOTInductor, compiled autograd, several ranks)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import pytest

import tputrace
from tputrace.cli.main import main

_RECORD = re.compile(r"^(.*?\] )(\{.*\})$")


def _records(text: str) -> list[list[str]]:
    """A log as its records: each a list of its line and its payload lines."""
    records: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("\t") and records:
            records[-1].append(line)
        else:
            records.append([line])
    return records


def _envelope(record: list[str]) -> dict[str, Any]:
    match = _RECORD.match(record[0])
    assert match, record[0]
    value = json.loads(match.group(2))
    assert isinstance(value, dict)
    return value


def _with_envelope(record: list[str], envelope: dict[str, Any]) -> list[str]:
    match = _RECORD.match(record[0])
    assert match
    return [match.group(1) + json.dumps(envelope), *record[1:]]


def _text(records: list[list[str]]) -> str:
    return "".join(line + "\n" for record in records for line in record)


def _edited(log: Path, edit: Callable[[list[str]], list[list[str]]]) -> str:
    """The log with each record replaced by what `edit` returns for it (none, itself, or others)."""
    return _text([new for record in _records(log.read_text()) for new in edit(record)])


def _log(captures: dict[str, Path]) -> Path:
    return next(captures["torch_trace"].glob("*.log"))


def _import(tmp_path: Path, *paths: Path, name: str = "imported.tptrace") -> tputrace.Trace:
    output = tmp_path / name
    assert main(["import", *map(str, paths), "-o", str(output)]) == 0
    return tputrace.open(output)


def _summary(trace_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(["summary", str(trace_path), *args]) == 0
    return capsys.readouterr().out


def test_a_line_that_is_not_a_record_is_skipped_counted_and_said_once(captures: dict[str, Path], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    records = _records(_log(captures).read_text())
    with_payload = next(index for index, record in enumerate(records) if len(record) > 2)
    # A blank line inside a payload (as torch.export's logs have) is part of the payload; two lines of other output
    # that found their way into the log are not records.
    records[with_payload].insert(2, "")
    records.insert(6, ["Traceback (most recent call last): something else wrote here", "RuntimeError: boom"])
    damaged = tmp_path / "damaged.log"
    damaged.write_text(_text(records))
    capsys.readouterr()
    trace = _import(tmp_path, damaged)
    err = capsys.readouterr().err.strip().splitlines()
    first = _text(records[:6]).count("\n") + 1
    assert err == [f"tputrace: warning: {damaged}: skipped 2 line(s) that are not TORCH_TRACE records "
                   f"(the first at line {first})"]
    assert sorted((row.name, row.reason) for row in trace.records("compiles")) == [
        ("f", "first"), ("f", "recompile"),
        ("torch_dynamo_resume_in_f_at_5", "first"), ("torch_dynamo_resume_in_f_at_5", "recompile")]
    (source,) = json.loads(trace.meta["imported"])
    assert source["skipped_lines"] == 2
    # A file that only looks like a log at its start, with no record in it, is still a one-line error.
    foreign = tmp_path / "foreign.log"
    foreign.write_text("V1206 15:24:45.403000 1667746 torch/x.py:1] {not json\nplain text\n")
    assert main(["import", str(foreign), "-o", str(tmp_path / "out.tptrace")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a TORCH_TRACE log" in err[0], err


def test_a_torch_trace_log_is_known_by_its_records_whatever_its_name(captures: dict[str, Path], tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    renamed = folder / "inductor_provenance_log.txt"
    renamed.write_text(_log(captures).read_text())
    (folder / "another.log").write_text("")  # empty files beside the logs are not captures
    (folder / "some_other_file.txt").write_text("")
    trace = _import(tmp_path, folder)
    assert [Path(source["path"]).name for source in json.loads(trace.meta["imported"])] == [renamed.name]
    assert trace.count("compiles") == 4 and trace.count("graph_breaks") == 2
    capsys.readouterr()
    assert main(["import", str(folder / "another.log"), "-o", str(tmp_path / "out.tptrace")]) == 2
    assert capsys.readouterr().err.strip() == f"tputrace: error: {folder / 'another.log'} is empty"


_METRICS_TIMES = ("start_time", "entire_frame_compile_time_s", "start_time_us", "duration_us", "end_time_us",
                  "dynamo_cumulative_compile_time_us")


def _without_metrics_times(record: list[str]) -> list[list[str]]:
    envelope = _envelope(record)
    if "compilation_metrics" not in envelope:
        return [record]
    for key in _METRICS_TIMES:
        envelope["compilation_metrics"].pop(key, None)
    return [_with_envelope(record, envelope)]


@pytest.mark.parametrize("chromium_events", [True, False])
def test_compile_times_come_from_chromium_events_or_glog_times_where_the_metrics_have_none(
        captures: dict[str, Path], tmp_path: Path, chromium_events: bool) -> None:
    log = _log(captures)
    original = _import(tmp_path, log, name="original.tptrace")
    expected = {json.loads(row.detail)["compile_id"]: row.dur_ns / 1e9 for row in original.records("compiles")}
    assert all(seconds > 0.001 for seconds in expected.values())

    def edit(record: list[str]) -> list[list[str]]:
        if not chromium_events and "chromium_event" in _envelope(record):
            return []
        return _without_metrics_times(record)

    edited = tmp_path / "old.log"
    edited.write_text(_edited(log, edit))
    trace = _import(tmp_path, edited)
    compiles = list(trace.records("compiles"))
    assert len(compiles) == 4
    for row in compiles:
        seconds = row.dur_ns / 1e9
        wanted = expected[json.loads(row.detail)["compile_id"]]
        # Chromium's `dynamo` span is the whole compile; glog times have a millisecond's precision.
        assert abs(seconds - wanted) <= 0.003 + 0.25 * wanted, (row.name, seconds, wanted)
    starts = [row.start_ns for row in sorted(compiles, key=lambda row: row.id)]
    assert starts == sorted(starts) and starts[0] == 0 and starts[-1] > 0
    assert trace.run.end_ns > 0


def test_recompile_reasons_and_graph_breaks_of_logs_without_them_in_the_metrics(captures: dict[str, Path],
                                                                                 tmp_path: Path) -> None:
    log = _log(captures)

    def edit(record: list[str]) -> list[list[str]]:
        envelope = _envelope(record)
        if envelope.get("artifact", {}).get("name") == "dynamo_graph_break_reason":
            return []  # torch before 2.5 wrote no graph-break artifacts
        if "compilation_metrics" in envelope:
            envelope["compilation_metrics"].pop("recompile_reason", None)  # the `recompile_reasons` artifact has it
            return [_with_envelope(record, envelope)]
        return [record]

    edited = tmp_path / "older.log"
    edited.write_text(_edited(log, edit))
    trace = _import(tmp_path, edited)
    assert sorted(row.diff for row in trace.records("compiles") if row.diff) == [
        "0/0: tensor 'x' rank mismatch. expected 1, actual 2", "1/0: tensor 'y' rank mismatch. expected 1, actual 2"]
    # The breaks are where the resume functions (`torch_dynamo_resume_in_f_at_5`) say, for the restart reason of
    # the compile of `f` that broke.
    breaks = [(row.reason, row.source.file, row.source.line, row.source.function)
              for row in trace.records("graph_breaks")]
    assert breaks == [("Failed to trace builtin operator", str(captures["script"]), 5, "f")] * 2


def test_compile_cache_hits_and_misses_are_each_compiles_detail(captures: dict[str, Path], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    log = _log(captures)
    outcomes = {(0, 0): ("fx_graph_cache_hit", "aotautograd_cache_hit"), (1, 0): ("fx_graph_cache_miss",)}

    def edit(record: list[str]) -> list[list[str]]:
        envelope = _envelope(record)
        key = (envelope.get("frame_id"), envelope.get("frame_compile_id"))
        if "compilation_metrics" not in envelope or key not in outcomes:
            return [record]
        ids = {name: envelope[name] for name in ("frame_id", "frame_compile_id", "attempt")}
        artifacts = [_with_envelope(record, {"artifact": {"name": name, "encoding": "json"}, **ids,
                                              "has_payload": "0"}) + ["\t{}"] for name in outcomes[key]]
        return [*artifacts, record]

    edited = tmp_path / "cached.log"
    edited.write_text(_edited(log, edit))
    trace = _import(tmp_path, edited)
    details = {json.loads(row.detail)["compile_id"]: json.loads(row.detail) for row in trace.records("compiles")}
    assert details["0/0"]["cache"] == {"fx_graph": "hit", "aotautograd": "hit"} and details["0/0"]["loaded_from_disk"]
    assert details["1/0"]["cache"] == {"fx_graph": "miss"} and "loaded_from_disk" not in details["1/0"]
    text = _summary(tmp_path / "imported.tptrace", capsys)
    assert "4 compiles (2 recompiles; 1 loaded from the compile cache)" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("0/0 "))
    assert re.search(r"0/0\s+f\s+compiled\.py:3\s+.*FX graph cache hit, AOTAutograd cache hit", row), row


BROKEN_BACKEND = """\
import torch, torch._dynamo
torch._dynamo.config.suppress_errors = True

def broken(gm, example_inputs):
    raise RuntimeError("broken backend")

def fn(x):
    return x.sin() + 1

torch.compile(fn, backend=broken)(torch.ones(3))
"""


def test_a_compile_that_failed_shows_its_reason_in_the_summary(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from captures import _torch_trace

    folder, script = _torch_trace(tmp_path, "broken.py", BROKEN_BACKEND, "broken_trace")
    trace = _import(tmp_path, folder)
    (row,) = trace.records("compiles")
    assert (row.name, row.source.file, row.source.line) == ("fn", str(script), 7) and row.dur_ns > 0
    text = _summary(tmp_path / "imported.tptrace", capsys)
    assert ("compile failures: 1\n  0/0 fn at broken.py:7: BackendCompilerFailed: backend='broken' raised: "
            "RuntimeError: broken backend") in text, text


def _line(glog: str, pid: int, envelope: dict[str, Any], payload: str | None = None) -> str:
    text = f"V1206 {glog} {pid} torch/_dynamo/utils.py:1045] {json.dumps(envelope)}\n"
    return text + (f"\t{payload}\n" if payload is not None else "")


def _built_log(pid: int, rank: int | None, loc: bool = True) -> str:
    """A small log in the format's structure: a module compiled through torch's wrapper in a source checkout of
    torch (its caller's line's text in the stack's `loc` unless not `loc`, as in older logs), a compiled autograd
    graph's frame, and an AOTInductor compile that no Dynamo frame made."""
    start = 1_765_000_000_000_000  # µs
    ids = {"frame_id": 0, "frame_compile_id": 0, "attempt": 0, **({"rank": rank} if rank is not None else {})}
    autograd = {**ids, "compiled_autograd_id": 1, "frame_id": 2}
    files = ["/home/u/pytorch/torch/_dynamo/external_utils.py", "/home/u/train.py",
             "/home/u/pytorch/torch/_inductor/__init__.py"]
    lines = [_line("10:00:00.000000", pid, {"str": [file, index]}) for index, file in enumerate(files)]
    lines += [
        _line("10:00:00.100000", pid, {"dynamo_start": {"stack": [
            {"line": 30, "name": "<module>", "filename": 1},
            {"line": 12, "name": "step", "filename": 1, **({"loc": "h = self.encoder(torch.relu(x))"} if loc else {})},
            {"line": 66, "name": "inner", "filename": 0}]}, **ids}),
        _line("10:00:00.600000", pid, {"compilation_metrics": {
            "co_name": "inner", "co_filename": files[0], "co_firstlineno": 66, "start_time_us": start,
            "duration_us": 500_000, "graph_op_count": 3}, **ids}),
        _line("10:00:01.000000", pid, {"dynamo_start": {"stack": [
            {"line": 31, "name": "<module>", "filename": 1}, {"line": 20, "name": "backward_hook", "filename": 1}]},
            **autograd}),
        _line("10:00:01.250000", pid, {"compilation_metrics": {
            "co_name": "backward_hook", "co_filename": files[1], "co_firstlineno": 20, "start_time_us": start + 1_000_000,
            "duration_us": 250_000}, **autograd}),
        _line("10:00:04.000000", pid, {"compilation_metrics": {
            "compile_id": None, "co_name": None, "start_time_us": start + 2_000_000, "end_time_us": start + 4_000_000},
            "stack": [{"line": 40, "name": "main", "filename": 1, "loc": "aoti_compile_and_package(ep)"},
                      {"line": 150, "name": "aoti_compile_and_package", "filename": 2}],
            **({"rank": rank} if rank is not None else {})}),
    ]
    return "".join(lines)


def test_compiles_through_torch_source_checkouts_compiled_autograd_and_aotinductor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "built.log"
    log.write_text(_built_log(4242, rank=None))
    trace = _import(tmp_path, log)
    compiles = [(json.loads(row.detail)["compile_id"], row.kind, row.name, row.source.line, row.source.function,
                 row.start_ns, row.dur_ns) for row in trace.records("compiles")]
    assert compiles == [
        # torch's wrapper `inner`, in a checkout of torch's source: named by what the user's line called, at that line.
        ("0/0", "dynamo_frame", "self.encoder", 12, "step", 0, 500_000_000),
        ("!1/2/0", "dynamo_frame", "backward_hook", 20, "backward_hook", 1_000_000_000, 250_000_000),
        # AOTInductor: named by the call the user's code made, at that line.
        ("", "aot", "aoti_compile_and_package", 40, "main", 2_000_000_000, 2_000_000_000),
    ]
    text = _summary(tmp_path / "imported.tptrace", capsys)
    assert re.search(r"-\s+aoti_compile_and_package\s+train\.py:40\s+2\.00 s", text), text
    assert re.search(r"!1/2/0\s+backward_hook\s+train\.py:20\s+250 ms", text), text


def test_a_module_compiled_through_torchs_wrapper_is_named_by_the_users_call(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`torch.compile(nn.Sequential(...))`: Dynamo compiles torch's wrapper `inner`; the compile is named by what the
    user's line calls (`net`), at that line. A log whose stack has no line text names the calling function."""
    from captures import TORCH_COMPILED_SEQUENTIAL, torch_sequential_capture

    call_line = next(index for index, text in enumerate(TORCH_COMPILED_SEQUENTIAL.splitlines(), 1) if "net(" in text)
    log_dir, _ = torch_sequential_capture(tmp_path)
    trace = _import(tmp_path, log_dir)
    assert [(row.name, Path(row.source.file).name, row.source.line) for row in trace.records("compiles")] == [
        ("net", "sequential.py", call_line)]
    text = _summary(tmp_path / "imported.tptrace", capsys)
    assert re.search(rf"0/0\s+net\s+sequential\.py:{call_line}\s", text), text
    assert "inner" not in text
    older = tmp_path / "older.log"
    older.write_text(_built_log(4242, rank=None, loc=False))
    assert [row.name for row in _import(tmp_path, older, name="older.tptrace").records("compiles")][0] == \
        "compiled call in step"


def test_a_directory_of_rank_logs_is_one_trace_with_each_rank(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ranks"
    folder.mkdir()
    # Logs whose records carry no `rank` (the rank is in the file name) and logs whose records do.
    (folder / "dedicated_log_torch_trace_rank_0_ab12.log").write_text(_built_log(100, rank=None))
    (folder / "dedicated_log_torch_trace_rank_1_cd34.log").write_text(_built_log(101, rank=None))
    (folder / "dedicated_log_torch_trace_x.log").write_text(_built_log(102, rank=2))
    (folder / "some_other_file.txt").write_text("")
    trace = _import(tmp_path, folder)
    sources = json.loads(trace.meta["imported"])
    assert [(source["rank"], source["distributed_rank"], source["pid"]) for source in sources] == [
        (0, 0, 100), (1, 1, 101), (2, 2, 102)]
    assert sorted({row.rank for row in trace.records("compiles")}) == [0, 1, 2]
    text = _summary(tmp_path / "imported.tptrace", capsys, "--rank", "1")
    assert "rank 1 of 3" in text and "3 compiles" in text


def test_recompiles_of_a_log_without_steps_are_placed_at_their_line_only(captures: dict[str, Path], tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A TORCH_TRACE log has no steps: its summary's recompiles say where they first happened, not "in step 0"."""
    _import(tmp_path, _log(captures))
    text = _summary(tmp_path / "imported.tptrace", capsys)
    recompiles = text[text.index("recompiles:"):].split("\n\n")[0]
    assert ", first at " in recompiles and "in step" not in recompiles, recompiles
