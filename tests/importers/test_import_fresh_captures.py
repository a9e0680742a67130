"""`tputrace import` on captures as other tools leave them on disk: a log dir that several runs of a script wrote
to, a JAX loop that does not wait for each step, a profile exported after its schedule's cycle ended."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest

import tputrace
from captures import _capture, jax_capture, jax_processes_capture, torch_schedule_capture
from tputrace.cli.main import main

_CAPTURES = (".xplane.pb", ".pt.trace.json.gz")


def _import(capsys: pytest.CaptureFixture[str], output: Path, *paths: Path) -> tuple[tputrace.Trace, str]:
    capsys.readouterr()
    assert main(["import", *map(str, paths), "-o", str(output)]) == 0
    return tputrace.open(output), capsys.readouterr().err


@pytest.mark.parametrize("make", [jax_capture, torch_schedule_capture], ids=["xprof", "torch_profiler"])
def test_a_folder_two_runs_wrote_to_imports_the_latest_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           make: object) -> None:
    assert callable(make)
    make(tmp_path)
    first = {path for path in tmp_path.rglob("*") if path.is_file()}
    folder = make(tmp_path)  # the same script run again, into the same folder
    second = sorted(path for path in folder.rglob("*") if path not in first and path.name.endswith(_CAPTURES))
    trace, err = _import(capsys, tmp_path / "latest.tptrace", folder)
    # The two processes did not run together: the latest run is the trace, not a second rank beside the first.
    sources = json.loads(trace.meta["imported"])
    assert len(sources) == 1
    imported = sources[0].get("windows") or [sources[0]["path"]]
    assert sorted(map(Path, imported)) == second
    assert f"{folder}: holds 2 runs whose captures do not overlap in time; imported the latest" in err
    # Named file by file, every capture is imported: two ranks.
    earlier = sorted(path for path in first if path.name.endswith(_CAPTURES))
    named, err = _import(capsys, tmp_path / "named.tptrace", *earlier, *second)
    assert len(json.loads(named.meta["imported"])) == 2 and "runs whose captures" not in err


def test_a_jax_loops_device_work_is_in_the_steps_that_launched_it(captures: dict[str, Path], tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # JAX_STEP's loop does not wait for each step: its host markers end before XLA:CPU runs the step's program, and
    # the launches (`ExecuteHelperOnSingleDevice`) name no run. Each run is the step's that launched it.
    trace, _ = _import(capsys, tmp_path / "jax.tptrace", captures["jax"])
    ops_per_step = Counter(op.step for op in trace.records("ops"))
    assert ops_per_step == {0: 4, 1: 4, 2: 4}, ops_per_step
    assert sorted(run.step for run in trace.records("executions")) == [0, 1, 2]


# A profiling schedule's window is written by `on_trace_ready`: once its cycle has ended, `export_chrome_trace`
# writes a window holding the profiler's own step marker and Python calls, none of the loop's ops.
EXPORT_AFTER_CYCLE = textwrap.dedent("""
    import sys, torch
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Linear(8, 4)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=2),
                 with_stack=True) as prof:
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
    prof.export_chrome_trace(sys.argv[1])
""")


def test_a_profile_exported_after_its_schedules_cycle_says_it_recorded_no_op(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    capture = _capture(tmp_path, "export_after_cycle.py", EXPORT_AFTER_CYCLE, "late.json")
    trace, err = _import(capsys, tmp_path / "late.tptrace", capture)
    assert not list(trace.records("ops"))
    assert f"{capture}: torch.profiler recorded no operator or kernel in this capture" in err


# One process of a two-process `jax.distributed` run on XLA:CPU (gloo collectives), a device each: a data-parallel
# step whose gradient is all-reduced across the processes; each profiles its own log dir.
JAX_PROCESS = textwrap.dedent("""
    import sys, jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    logdir, process, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process)
    import numpy as np, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    batch = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), PartitionSpec("d"))
    x = jax.make_array_from_callback((8, 16), batch, lambda index: np.ones((8, 16), np.float32)[index])
    step = jax.jit(lambda w, x: w - 0.1 * jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w))
    w = step(jnp.ones((16, 16)), x).block_until_ready()
    with jax.profiler.trace(f"{logdir}/process{process}"):
        for i in range(3):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, x)
        w.block_until_ready()
""")


def test_the_processes_of_a_jax_distributed_run_are_a_device_each_and_wait_for_each_other(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jax_processes_capture(tmp_path, "jax_process.py", JAX_PROCESS)
    trace, _ = _import(capsys, tmp_path / "processes.tptrace", tmp_path / "logs")
    # Process 1's device is JAX's device 2048 (its global id): one device, not 2049.
    assert [run.chips for run in trace.records("runs")] == [1, 1]
    # Each process's k-th all-reduce is the other's: the waits are filled in on both.
    waits = list(trace.sql("SELECT rank, wait_ns FROM collectives ORDER BY rank, start_ns"))
    calls = Counter(rank for rank, _ in waits)
    assert calls[0] == calls[1] >= 3 and all(wait is not None for _, wait in waits), waits
    assert any(wait > 0 for _, wait in waits)
