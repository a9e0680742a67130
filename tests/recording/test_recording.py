"""`tputrace run` on real workloads: the trace holds what the script did, counted independently."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tputrace
from backend_helpers import eager
from tputrace.backend.compat.device_module import EagerMode
from tputrace.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.counts[str(func)] = self.counts.get(str(func), 0) + 1
        return func(*args, **(kwargs or {}))


def _cpu_op_counts(steps: int) -> dict[str, int]:
    import quickstart

    with _CountOps() as counter:
        quickstart.train("cpu", steps)
    return counter.counts


def test_trace_of_quickstart_matches_an_independent_count(tmp_path: Path) -> None:
    steps = 6
    backend_compiles: list[str] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, duration, **kwargs: backend_compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None
    )
    trace_path = tmp_path / "quickstart.tptrace"
    exit_status = main(["run", "-o", str(trace_path), str(EXAMPLES / "quickstart.py"), "--steps", str(steps)])
    assert exit_status == 0
    expected = _cpu_op_counts(steps)
    with tputrace.open(trace_path) as trace:
        run = trace.run
        assert run.exit_status == 0 and run.eager_mode == "DEFER_AND_FUSE" and run.platform == "cpu"
        step_rows = list(trace.records("steps", where="source = 'optimizer'"))
        assert len(step_rows) == steps
        op_counts = dict(trace.sql("SELECT s.text, COUNT(*) FROM ops o JOIN strings s ON s.id = o.op_sid GROUP BY s.text"))
        for op in ("aten.addmm.default", "aten.mm.default", "aten.relu.default", "aten.threshold_backward.default"):
            assert op_counts.get(op, 0) == expected.get(op, 0), op
        assert trace.count("compiles") == len(backend_compiles)
        flushes = list(trace.records("flushes"))
        assert {flush.trigger for flush in flushes} >= {"backward_end", "step"}
        steady = [flush for flush in flushes if flush.step >= 2]
        assert steady and all(flush.cache_hit for flush in steady)
        ops_in_user_code = trace.sql(
            "SELECT COUNT(*) FROM ops o JOIN frames f ON f.id = o.frame_id JOIN strings s ON s.id = f.file_sid WHERE s.text LIKE '%quickstart.py'"
        )[0][0]
        assert ops_in_user_code == trace.count("ops")
        modules = {row[0] for row in trace.sql("SELECT DISTINCT s.text FROM ops o JOIN strings s ON s.id = o.module_sid")}
        assert {"Sequential.0", "Sequential.2", "Sequential.4"} <= modules


def test_a_script_that_raises_leaves_a_complete_trace(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    script = tmp_path / "broken.py"
    script.write_text("import torch\nx = torch.ones(3, device='tpu') * 2\nprint(x.sum().item())\nraise ValueError('bad batch')\n")
    trace_path = tmp_path / "broken.tptrace"
    assert main(["run", "-o", str(trace_path), str(script)]) == 1
    captured = capsys.readouterr()
    assert "ValueError: bad batch" in captured.err and f'File "{script}", line 4' in captured.err
    with tputrace.open(trace_path) as trace:
        assert trace.run.exit_status == 1 and "ValueError: bad batch" in trace.run.error
        assert trace.count("ops") >= 2 and trace.count("syncs") == 1
        sync = next(trace.records("syncs"))
        assert sync.kind == "item" and sync.source.line == 3


def test_an_in_process_run_switches_the_eager_mode_for_the_script_only(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """The script runs in its `--mode`'s eager mode; afterwards (also after it raised) the process is back
    in the mode it had, so tpu ops after an in-process `main(["run", ...])` run as they ran before it."""
    script = tmp_path / "mode.py"
    script.write_text(
        "import sys\n"
        "import torch\n"
        "print('script mode', torch.tpu.eager_mode().name)\n"
        "print((torch.ones(3, device='tpu') * 2).sum().item())\n"
        "if sys.argv[1:] == ['raise']:\n"
        "    raise ValueError('bad batch')\n"
    )
    runs = [
        (EagerMode.DEFER_NEVER, "defer", EagerMode.DEFER_AND_FUSE, []),
        (EagerMode.DEFER_AND_FUSE, "strict", EagerMode.DEFER_NEVER, []),
        (EagerMode.DEFER_NEVER, "blocking", EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, ["raise"]),
    ]
    for mode_before, run_mode, script_mode, script_args in runs:
        trace_path = tmp_path / f"{run_mode}.tptrace"
        with eager(mode_before):
            status = main(["run", "--no-summary", "--mode", run_mode, "-o", str(trace_path), str(script), *script_args])
            mode_after = torch.tpu.eager_mode()
        assert status == (1 if script_args else 0)
        assert f"script mode {script_mode.name}" in capsys.readouterr().out
        with tputrace.open(trace_path) as trace:
            assert trace.run.eager_mode == script_mode.value
        assert mode_after is mode_before, run_mode


def test_blocking_mode_stops_at_the_line_of_an_index_out_of_range(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    script = tmp_path / "tokens.py"
    script.write_text(
        "import torch\n"
        "table = torch.nn.Embedding(10, 4).to('tpu')\n"
        "ids = torch.tensor([[1, 2], [3, 10]])\n"
        "rows = table(ids.to('tpu'))\n"
        "print(rows.sum().item())\n"
    )
    for mode in ("strict", "blocking"):
        trace_path = tmp_path / f"{mode}.tptrace"
        status = main(["run", "--mode", mode, "-o", str(trace_path), str(script)])
        captured = capsys.readouterr()
        with tputrace.open(trace_path) as trace:
            if mode == "strict":  # checked on the chip: the error comes at the next sync, naming the op's line
                assert status == 1 and trace.run.exit_status == 1
                assert f'File "{script}", line 5' in captured.err
                assert "index out of range in aten.embedding at tokens.py:4" in captured.err
                raised = [annotation for annotation in trace.records("annotations") if annotation.origin == "index_check"]
                assert len(raised) == 1 and raised[0].name.startswith("index out of range in aten.embedding at tokens.py:4")
                assert raised[0].source.line == 5
                continue
            assert status == 1 and f'File "{script}", line 4' in captured.err
            assert "IndexError: index out of range in self" in captured.err
            assert trace.run.exit_status == 1 and trace.run.eager_mode == "DEFER_NEVER_AND_LAUNCH_BLOCKING"
            checks = [sync for sync in trace.records("syncs") if sync.kind == "value_check"]
            assert checks and {sync.source.line for sync in checks} == {4}


def test_a_traced_run_killed_with_sigkill_leaves_a_trace_that_opens(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import time

    script = tmp_path / "forever.py"
    script.write_text(
        "import torch\nx = torch.ones(64, device='tpu')\nfor step in range(10**9):\n    x = x * 1.0001\n    if step % 50 == 0:\n        print(x.sum().item(), flush=True)\n"
    )
    trace_path = tmp_path / "killed.tptrace"
    process = subprocess.Popen(
        [sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace_path), str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for _ in range(3):
            assert process.stdout.readline(), "the traced script printed nothing"
        time.sleep(1.5)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    with tputrace.open(trace_path) as trace:
        assert trace.run.exit_status is None
        assert trace.count("ops") >= 100 and trace.count("syncs") >= 3


def test_a_run_on_a_platform_this_host_lacks_fails_once_and_finishes_its_trace(tmp_path: Path) -> None:
    """`TPUTRACE_PLATFORM` naming a platform JAX does not have: the script's first tpu op raises the
    backend's one-line error, and the run still ends as any failed script's does (summary, a complete
    trace saying how it ended), without a second traceback from tputrace counting the chips."""
    import os
    import subprocess

    script = tmp_path / "on_chip.py"
    script.write_text("import torch\nprint('before the tpu')\nx = torch.ones(3, device='tpu')\n")
    trace_path = tmp_path / "platform.tptrace"
    result = subprocess.run(
        [sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace_path), str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TPUTRACE_PLATFORM": "no_such_platform"},
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "before the tpu" in result.stdout
    error_line = "TPUTRACE_PLATFORM=no_such_platform but this JAX has no no_such_platform devices"
    assert result.stderr.count("Traceback") == 1, result.stderr[-3000:]
    assert any(line.startswith(f"tputrace.backend.core.chips.ChipError: {error_line}") for line in result.stderr.splitlines())
    assert f"tputrace: trace saved to {trace_path}" in result.stderr
    with tputrace.open(trace_path) as trace:
        run = trace.run
        assert run.exit_status == 1 and error_line in run.error and run.end_ns is not None
        assert run.chips is None and run.platform is None


def test_sync_kinds_annotations_explicit_steps_and_memory(tmp_path: Path) -> None:
    script = tmp_path / "kinds.py"
    script.write_text(
        "import torch, tputrace\n"
        "x = torch.arange(6.0, device='tpu')\n"
        "for step in range(3):\n"
        "    with tputrace.annotate('forward'):\n"
        "        y = x * (step + 1)\n"
        "    with torch.profiler.record_function('reduce'):\n"
        "        total = y.sum()\n"
        "    print(total)\n"
        "    values = y.tolist()\n"
        "    array = y.numpy()\n"
        "    if total > 0:\n"
        "        kept = torch.nonzero(y)\n"
        "    counts = torch.histogram(y, bins=3)\n"
        "    tputrace.step()\n"
    )
    trace_path = tmp_path / "kinds.tptrace"
    assert main(["run", "-o", str(trace_path), str(script)]) == 0
    with tputrace.open(trace_path) as trace:
        kinds = {(sync.kind, sync.source.line) for sync in trace.records("syncs")}
        assert {("print", 8), ("tolist", 9), ("numpy", 10), ("bool", 11), ("data_dependent", 12)} <= kinds
        annotations = [(annotation.name, annotation.origin) for annotation in trace.records("annotations")]
        assert annotations.count(("forward", "annotate")) == 3 and annotations.count(("reduce", "record_function")) == 3
        steps = list(trace.records("steps"))
        assert [step.source for step in steps] == ["explicit"] * 3
        assert trace.count("memory") >= 3
        assert trace.count("fallbacks", where="op_sid = (SELECT id FROM strings WHERE text = 'aten.nonzero.default')") == 0
        assert trace.count("fallbacks", where="op_sid = (SELECT id FROM strings WHERE text = 'aten.histogram.bin_ct')") == 3
