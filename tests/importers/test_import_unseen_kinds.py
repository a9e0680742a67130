"""Captures of kinds the other importer tests do not make, imported and read as a user would: JAX host callbacks,
a DDP run over gloo (a file per rank), a loop fed by a DataLoader's workers, a compile made before a profiling
schedule's window (with the process's TORCH_TRACE log), and one rank's file of a distributed run imported alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tputrace.analysis import analyze_path
from tputrace.cli.main import main


def _import(tmp_path: Path, *paths: Path) -> Path:
    output = tmp_path / "imported.tptrace"
    assert main(["import", *map(str, paths), "-o", str(output)]) == 0
    return output


def test_a_jitted_step_waiting_for_host_callbacks_is_a_finding_at_their_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`jax.debug.print` and `jax.pure_callback` stop the program while the host runs Python: nearly all of the
    device's time here (the callback sleeps 2 ms a call), which the report names first, at the callbacks' lines."""
    from captures import JAX_CALLBACKS, jax_callbacks_capture

    lines = JAX_CALLBACKS.splitlines()
    print_line = next(index for index, text in enumerate(lines, 1) if "jax.debug.print" in text)
    callback_line = next(index for index, text in enumerate(lines, 1) if "jax.pure_callback" in text)
    output = _import(tmp_path, jax_callbacks_capture(tmp_path))
    report = analyze_path(output)
    finding = report.findings[0]
    assert finding.analyzer == "data_movement" and finding.severity == "critical"
    assert finding.title.startswith("The device waits for host callbacks (pure_callback, debug_print): ")
    assert (Path(finding.file).name, finding.line) == ("jax_callbacks.py", callback_line)
    assert [(evidence.text.split(" ")[1], evidence.line) for evidence in finding.evidence] == [
        ("(pure_callback)", callback_line), ("(debug_print)", print_line)]
    assert "3 runs on 1 device" in finding.evidence[0].text
    assert finding.cost_total_ns >= 3 * 2e6  # three calls of a 2 ms sleep
    assert "jax.debug.print" in finding.suggestion and "pure_callback" in finding.suggestion
    data = report.results["data_movement"].plain_data()
    assert data["callback_ns"] == pytest.approx(finding.cost_total_ns)
    assert main(["report", str(output)]) == 0
    assert "1. [critical] The device waits for host callbacks" in capsys.readouterr().out


def test_a_jax_step_without_callbacks_has_no_callback_finding(captures: dict[str, Path], tmp_path: Path) -> None:
    report = analyze_path(_import(tmp_path, captures["jax"]))
    assert report.results["data_movement"].plain_data()["callback_ns"] == 0
    assert not [finding for finding in report.findings if "callback" in finding.title]


def test_ranks_of_a_ddp_run_wait_for_the_rank_that_arrives_late(tmp_path: Path) -> None:
    """One torch.profiler file per DDP rank: the import puts the ranks' collectives on one clock and fills each
    rank's wait for the last arrival, so the report names rank 1 (which sleeps 150 ms before each step) the straggler: a
    sleep long enough that a busy host's scheduling delays stay a small part of the waits."""
    from captures import torch_ddp_capture

    import tputrace

    output = _import(tmp_path, torch_ddp_capture(tmp_path))
    with tputrace.open(output) as trace:
        waits = {rank: wait for rank, wait in trace.sql("SELECT rank, SUM(wait_ns) FROM collectives GROUP BY rank")}
    # Rank 0 waits out most of rank 1's 150 ms sleeps (in the gradients' all-reduces, or DDP's first broadcasts): at
    # least two of the three, as its profiler may start after rank 1's first sleep.
    assert waits[0] >= 2 * 100e6 and waits[1] < waits[0] / 3, waits
    report = analyze_path(output)
    (finding,) = [finding for finding in report.findings if finding.title.startswith("Straggler")]
    assert finding.title.startswith("Straggler: rank 1 arrives last; other ranks wait "), finding.title
    assert finding.cost_total_ns >= 2 * 100e6
    # The capture marks no steps: the finding claims no step shares and no measure of unrecorded time.
    assert "virtual chips" not in finding.title + finding.explanation and "of the steps" not in finding.explanation
    assert "the capture marks no steps" in finding.explanation
    assert all(waiting != "unknown" for *_, waiting in _collectives_rows(output))


def test_a_cpu_process_groups_capture_is_not_told_its_communication_was_exposed(tmp_path: Path) -> None:
    """A profile of DDP over gloo has steps and collectives but no program runs: nothing says what the collectives
    overlapped, so no finding claims they ran while no program ran on a chip."""
    from captures import torch_ddp_steps_capture

    output = _import(tmp_path, torch_ddp_steps_capture(tmp_path))
    report = analyze_path(output)
    assert report.step_count >= 3 and [finding for finding in report.findings if finding.analyzer == "collectives"]
    assert not [finding for finding in report.findings if finding.title.startswith("Communication exposed")]


@pytest.fixture(scope="module")
def loader_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from captures import torch_loader_capture

    folder = tmp_path_factory.mktemp("loader")
    return _import(folder, torch_loader_capture(folder))


def test_a_loop_waiting_for_its_dataloaders_workers_is_a_finding_at_the_loop(loader_trace: Path) -> None:
    from captures import TORCH_LOADER

    lines = TORCH_LOADER.splitlines()
    # torch.profiler names a function already running when profiling began by the line it was at (`prof.step()`).
    loop = range(next(index for index, text in enumerate(lines, 1) if "for x, y in loader" in text),
                 next(index for index, text in enumerate(lines, 1) if "prof.step()" in text) + 1)
    report = analyze_path(loader_trace)
    finding = report.findings[0]
    assert finding.analyzer == "input_wait" and finding.severity == "critical", report.findings
    assert finding.title.startswith("The loop waits for its DataLoader: "), finding.title
    assert Path(finding.file or "").name == "loader.py" and finding.line in loop, (finding.file, finding.line)
    assert "_MultiProcessingDataLoaderIter" in finding.explanation and "num_workers" in finding.suggestion
    data = report.results["input_wait"].plain_data()
    assert data["steps"] == 2 and data["calls"] == 2  # the steady steps: the window's 3 less its first
    assert data["wait_ns"] >= 0.5 * data["span_ns"]  # a batch every 400 ms against a step of about 1 ms


def test_ops_run_inside_the_standard_library_are_at_the_users_line(loader_trace: Path) -> None:
    """torch.profiler names the standard library's files like a script's (`multiprocessing/queues.py`): the ops a
    DataLoader's queue runs in the main process are the user's loop's, not at a line of the standard library."""
    import tputrace

    with tputrace.open(loader_trace) as trace:
        files = {op.source.file for op in trace.records("ops") if op.source}
    assert files == {"loader.py"}, files


def test_a_compile_before_the_profiles_window_is_no_share_of_its_wall(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The TORCH_TRACE log of a profiled process has the compile made in the schedule's `wait` step, before the
    profile's window: it stays in the trace's compiles, and the time split (a share of the window's wall) leaves
    it out rather than counting it as more than the whole window."""
    import tputrace
    from captures import torch_compile_before_window_capture

    output = _import(tmp_path, torch_compile_before_window_capture(tmp_path))
    with tputrace.open(output) as trace:
        compiles = [(row.start_ns, row.dur_ns) for row in trace.records("compiles")]
        split = trace.time_split(rank=0)
    assert compiles and all(start + dur <= 0 for start, dur in compiles), compiles  # all before the window
    assert split.compile_ns == 0 and split.wall_ns > 0
    assert main(["summary", str(output)]) == 0
    assert "\n  compile " not in capsys.readouterr().out
    # The XProf export, whose lines start at the window's start, shows what of a compile lies inside it.
    assert main(["export", str(output), "--tensorboard", str(tmp_path / "tb_export")]) == 0
    assert list((tmp_path / "tb_export").rglob("*.xplane.pb"))


def test_one_ranks_capture_gives_bus_bandwidth_from_the_world_size_it_names(tmp_path: Path) -> None:
    """One gloo rank's file imported alone (the trace holds one rank of a run of two): the capture's
    `distributedInfo.world_size` gives the all-reduces' bus bandwidth (2(n-1)/n of the bytes), not 0 B/s."""
    from captures import torch_gloo_capture

    rank0 = torch_gloo_capture(tmp_path) / "rank0.json"
    output = _import(tmp_path, rank0)
    report = analyze_path(output)
    (row,) = report.results["collectives"].plain_data()["kinds"]
    assert row["kind"] == "all_reduce" and row["bytes"] == 3 * 4000
    assert row["bus_bandwidth"] == pytest.approx(row["bytes"] * 1.0 / (row["dur_ns"] / 1e9))
    texts = [evidence.text for finding in report.findings for evidence in finding.evidence]
    assert not [text for text in texts if "bus 0 B/s" in text], texts
    # Without the other rank's capture its waits are not measured: the summary says unknown, not 0 ns.
    assert _collectives_rows(output) == [("all_reduce", "3", "11.7 KiB", "unknown")]


def _collectives_rows(output: Path) -> list[tuple[str, ...]]:
    """The summary's collectives table: kind, count, bytes, waiting."""
    import tputrace
    from tputrace.summary import sections, summarize

    with tputrace.open(output) as trace:
        (section,) = [section for section in sections(summarize(trace)) if section.title.startswith("collectives")]
    return [(row[0], row[1], row[2], row[4]) for row in section.rows]
