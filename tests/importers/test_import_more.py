"""More captures, imported and read as a user would: a sharded JAX training step, a fully optioned torch.profiler
loop, torch.compile with dynamic shapes and several breaks, and a folder holding several formats of one run."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import tputrace
from tputrace.cli.main import main


def _import(tmp_path: Path, *paths: Path, name: str = "imported.tptrace") -> Path:
    output = tmp_path / name
    assert main(["import", *map(str, paths), "-o", str(output)]) == 0
    return output


def test_a_sharded_jax_steps_ops_are_in_their_launch_step_with_their_line_and_scope(tmp_path: Path) -> None:
    """Dispatch is asynchronous: XLA:CPU runs a step's ops after later steps' markers have ended. Each op, collective
    and execution is in the step whose host event launched its run (they were all in the last step)."""
    from captures import jax_sharded_capture

    output = _import(tmp_path, jax_sharded_capture(tmp_path))
    with tputrace.open(output) as trace:
        # After the loop, the profiler's stop: an `end` step, no step of the loop.
        assert [(step.step, step.source) for step in trace.records("steps")] == [
            (5, "imported"), (6, "imported"), (7, "imported"), (8, "imported"), (9, "end")]
        per_step = Counter(op.step for op in trace.records("ops"))
        assert set(per_step) == {5, 6, 7, 8} and len(set(per_step.values())) == 1, per_step
        assert Counter(row.step for row in trace.records("executions")) == {5: 4, 6: 4, 7: 4, 8: 4}
        assert Counter(row.step for row in trace.records("collectives")) == {5: 4, 6: 4, 7: 4, 8: 4}

    # XLA:CPU's op events name no source or scope: their HLO instructions' metadata (in `/host:metadata`) does.
    from captures import JAX_SHARDED

    script_lines = JAX_SHARDED.splitlines()
    update_line = next(index for index, text in enumerate(script_lines, 1) if "p - 0.1 * g" in text)
    loss_lines = {index for index, text in enumerate(script_lines, 1) if "out = jnp.tanh" in text}
    with tputrace.open(output) as trace:
        ops = list(trace.records("ops"))
    assert all(op.module and op.module.startswith("jit(step)/") for op in ops)
    assert {op.source.line for op in ops if op.module.startswith("jit(step)/update/")} == {update_line}
    assert {op.source.line for op in ops if "/backward/jvp(forward)/tanh" in op.module} == loss_lines
    assert all(op.source.file.endswith("jax_sharded.py") for op in ops if op.source)

    # XLA:CPU's events give no bytes for the all-reduces: their HLO's shapes size them, never "0 B" or "bus 0 B/s".
    from tputrace.analysis import analyze_path
    from tputrace.summary import sections, summarize

    with tputrace.open(output) as trace:
        shown = sections(summarize(trace))
    (section,) = [section for section in shown if section.title.startswith("collectives")]
    assert [row[2] for row in section.rows] == ["40.0 KiB"]  # 16 calls (4 chips, 4 steps), each of the 640 f32 gradients
    # Its ops are XLA ops' device times, not host dispatch: the summary says so.
    assert not [section for section in shown if "host dispatch" in section.title + repr(section.rows + (section.columns,))]
    assert [section.columns[2] for section in shown if section.title.startswith("top ops by device op time")] == [
        "device op time"]
    (finding,) = [finding for finding in analyze_path(output).findings if finding.analyzer == "collectives"]
    by_line, by_kind = finding.evidence
    assert by_kind.text.startswith("all_reduce: 16 calls, ") and ", 40.0 KiB, " in by_kind.text, by_kind.text
    assert by_line.text.startswith("all_reduce, 4 calls a step: "), by_line.text
    assert not [evidence.text for evidence in finding.evidence if "0 B" in evidence.text]


def test_dynamic_shapes_several_breaks_and_a_compiled_optimizer_step(tmp_path: Path) -> None:
    """Automatic dynamic shapes recompile once for four sizes; two prints in one function make it three graphs, said
    at each break; the graph break inside torch's optimizer is reported at the user's `opt.step()` line as the step
    falling out of the compiled function's graph, and names where in torch it broke."""
    from captures import torch_dynamic_capture

    from tputrace.analysis import analyze_path

    folder, script = torch_dynamic_capture(tmp_path)
    output = _import(tmp_path, folder)
    with tputrace.open(output) as trace:
        f = [(row.reason, row.diff) for row in trace.records("compiles") if row.name == "f"]
    assert f == [("first", None), ("recompile", "0/0: tensor 'x' size mismatch at index 0. expected 4, actual 5")]
    findings = {finding.line: finding for finding in analyze_path(output).findings if finding.analyzer == "graph_breaks"}
    assert {line: finding.title.split(": ", 1)[1] for line, finding in findings.items() if line != 19} == {
        5: "f() runs as 3 graphs", 7: "f() runs as 3 graphs"}
    assert findings[19].title.startswith(f"The optimizer step at {script.name}:19 falls out of opt_step()'s graph: "
                                         "torch.optim breaks the graph"), findings[19].title
    assert findings[19].file == str(script) and "at optimizer.py:" in findings[19].title


def test_a_folder_holding_a_profile_and_a_torch_trace_log_of_one_run(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The profile's windows and the TORCH_TRACE log of one process are one rank: the log's compiles (with the
    recompile's reason and line) on the profile's clock and steps, beside the profile's backward compile, instead of
    a second rank (the report said 'rank 0 of 2') and the profile's nameless 'compiled frame 0' rows. The profiler's
    last window holds only the step marker that the schedule's next cycle opened (the import stopped there with
    'holds no torch.profiler events'): it imports, and that step, which ran nothing, is the trailing `end` step."""
    from captures import TORCH_PROFILE_AND_TRACE, torch_profile_and_trace_capture

    run = torch_profile_and_trace_capture(tmp_path)
    output = _import(tmp_path, run)
    with tputrace.open(output) as trace:
        (source,) = json.loads(trace.meta["imported"])
        assert source["format"] == "torch_profiler_json" and len(source["windows"]) == 2
        assert Path(source["torch_trace"]).parent == run / "torch_trace"
        assert [(step.step, step.source) for step in trace.records("steps")] == [
            (0, "imported"), (1, "imported"), (2, "imported"), (3, "imported"), (4, "end")]
        compiles = sorted(trace.records("compiles"), key=lambda row: row.start_ns)
    assert [(row.kind, row.reason, row.step) for row in compiles] == [
        ("dynamo_frame", "first", 0), ("aot", "first", 0), ("dynamo_frame", "recompile", 2)]
    call_line = next(index for index, text in enumerate(TORCH_PROFILE_AND_TRACE.splitlines(), 1) if "compiled(" in text)
    assert compiles[2].source.line == call_line and "expected 8, actual 6" in (compiles[2].diff or "")
    # The profile's backward compile (recorded without `with_stack`, so with no place of its own, and absent from the
    # log) takes its forward's place and name from the log's compile of the same id.
    assert compiles[1].source is not None and compiles[1].source.line == call_line
    assert compiles[1].name == f"backward of {compiles[0].name}"
    capsys.readouterr()
    assert main(["summary", str(output)]) == 0
    out = capsys.readouterr().out
    assert " 4 steps (" in out and "rank 0 of" not in out


def test_a_capture_named_twice_is_imported_once(captures: dict[str, Path], tmp_path: Path) -> None:
    """The profile given by name and again within its folder is one capture (it was imported twice into one rank,
    doubling every op)."""
    profile = captures["profiler"]
    output = _import(tmp_path, profile, profile, profile.parent / ".." / profile.parent.name / profile.name)
    with tputrace.open(output) as trace:
        sources = json.loads(trace.meta["imported"])
        assert [source["path"] for source in sources] == [str(profile)] and "windows" not in sources[0]
        assert sum(op.op == "aten::linear" for op in trace.records("ops")) == 4  # two layers, two steps


def test_bad_input_is_a_one_line_error(captures: dict[str, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """An empty folder, an empty xplane.pb, a cut gzip and a JSON without events: one line on stderr, exit 2,
    nothing written."""
    import gzip

    folder = tmp_path / "empty"
    folder.mkdir()
    (tmp_path / "empty.xplane.pb").write_bytes(b"")
    packed = gzip.compress(captures["profiler"].read_bytes())
    (tmp_path / "cut.json.gz").write_bytes(packed[: len(packed) // 2])
    (tmp_path / "none.json").write_text('{"traceEvents": []}')
    for name, words in (("empty", "holds no xplane.pb"), ("empty.xplane.pb", "is empty"),
                        ("cut.json.gz", "cannot be read"), ("none.json", "holds no timed events")):
        assert main(["import", str(tmp_path / name), "-o", str(tmp_path / "out.tptrace")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert not (tmp_path / "out.tptrace").exists()
