"""Records of real `tputrace run`s that the audit found wrong: sources outside the script, step rows,
program sizes and flush triggers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

import tputrace
from tputrace.backend.core.hlo_module import instruction_count
from tputrace.cli.main import main
from tputrace.schema import FLUSHES

CONSOLE_SCRIPT = Path(sys.executable).parent / "tputrace"


def _record(tmp_path: Path, name: str, source: str, *options: str) -> Path:
    """Run `source` as `name` under `tputrace run` in this process; the trace's path."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(source))
    trace_path = tmp_path / f"{script.stem}.tptrace"
    assert main(["run", *options, "-o", str(trace_path), str(script)]) == 0
    return trace_path


def _record_with_console_script(tmp_path: Path, name: str, source: str, *options: str) -> Path:
    """Run `source` through the installed `tputrace` launcher, naming the script by a relative path."""
    (tmp_path / name).write_text(textwrap.dedent(source))
    trace_path = tmp_path / f"{Path(name).stem}.tptrace"
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), "run", *options, "-o", str(trace_path), name],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return trace_path


def _listed(description: str) -> set[str]:
    """The words of a schema column's description that list values (`a, b, c`)."""
    return {word.strip() for word in description.split(",")}


needs_console_script = pytest.mark.skipif(
    not CONSOLE_SCRIPT.exists(), reason="the tputrace console script is not installed (pip install -e .)"
)


@needs_console_script
def test_the_exit_flush_has_no_launcher_source_and_frames_are_absolute(tmp_path: Path) -> None:
    trace_path = _record_with_console_script(tmp_path, "exit_flush.py", """\
        import torch
        x = torch.randn(16, 16).to("tpu")
        for _ in range(3):
            x = torch.tanh(x @ x)
        """)
    script = str((tmp_path / "exit_flush.py").absolute())
    with tputrace.open(trace_path) as trace:
        (exit_flush,) = trace.records("flushes", where="trigger = 'exit'")
        assert exit_flush.source is None
        (compile_record,) = trace.records("compiles", where="program_id = ?", params=(exit_flush.program_id,))
        assert compile_record.source is None
        assert {frame.file for frame in trace.records("frames")} == {script}
        assert [row.file for row in trace.records("source_files")] == [script]


def test_optimizer_and_explicit_steps_together_mark_one_step_per_iteration(tmp_path: Path) -> None:
    trace_path = _record(tmp_path, "mixed_steps.py", """\
        import torch, tputrace
        w = torch.nn.Parameter(torch.ones(4).to("tpu"))
        opt = torch.optim.SGD([w], lr=0.1)
        for i in range(3):
            opt.zero_grad()
            (w * 2).sum().backward()
            opt.step()
            tputrace.step()
        """)
    with tputrace.open(trace_path) as trace:
        steps = [(step.step, step.source) for step in trace.records("steps", order_by="step")]
        assert steps == [(0, "optimizer"), (1, "explicit"), (2, "explicit")]
        op_steps = Counter(step for (step,) in trace.sql(
            "SELECT o.step FROM ops o JOIN strings s ON s.id = o.op_sid WHERE s.text = 'aten.sum.default'"))
        assert op_steps == {0: 1, 1: 1, 2: 1}
        optimizer_steps = [annotation.step for annotation in trace.records("annotations", order_by="start_ns")
                           if annotation.name.startswith("Optimizer.step")]
        assert optimizer_steps == [0, 1, 2]


def test_programs_count_their_hlo_instructions(tmp_path: Path) -> None:
    trace_path = _record(tmp_path, "hlo_ops.py", """\
        import torch
        x = torch.ones(4, 8, device="tpu")
        print(((x * 2 + 1) @ x.t()).sum().item())
        compiled = torch.compile(lambda value: (value * 3).relu().sum())
        print(compiled(x).item())
        """)
    with tputrace.open(trace_path) as trace:
        sizes = {program.kind: program.hlo_ops for program in trace.records("programs") if program.kind != "op"}
        assert set(sizes) == {"fused", "compiled"}
        assert all(isinstance(size, int) and size >= 3 for size in sizes.values()), sizes
    strict_path = tmp_path / "strict.tptrace"
    assert main(["run", "--no-summary", "--mode", "strict", "-o", str(strict_path), str(tmp_path / "hlo_ops.py")]) == 0
    with tputrace.open(strict_path) as trace:
        op_sizes = [program.hlo_ops for program in trace.records("programs") if program.kind == "op"]
        assert op_sizes and all(isinstance(size, int) and size >= 1 for size in op_sizes), op_sizes


def test_a_flushs_input_bytes_count_its_packed_python_scalars(tmp_path: Path) -> None:
    """A flush's program reads its arrays and the Python scalars of its ops, packed one array per kind
    (float64, int64, bool, complex128): `input_bytes` counts both."""
    trace_path = _record(tmp_path, "scalars.py", """\
        import torch
        x = torch.ones(4, device="tpu")
        x.cpu()
        print(((x * 2.5 + 1.5) * 3).sum().item())
        """, "--mode", "defer", "--no-summary")
    with tputrace.open(trace_path) as trace:
        flushes = [flush for flush in trace.records("flushes") if flush.trigger == "item"]
    assert [flush.input_bytes for flush in flushes] == [4 * 4 + 2 * 8 + 8]  # x, the floats 2.5 and 1.5, the int 3


def test_the_instruction_count_covers_every_computation_and_nothing_else() -> None:
    module = textwrap.dedent("""\
        HloModule jit_fused, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

        FileNames
        1 "/work/a = b.py"

        %fused_computation (param_0: f32[4]) -> f32[4] {
          %param_0 = f32[4]{0} parameter(0)
          ROOT %tanh.0 = f32[4]{0} tanh(%param_0), metadata={op_name="jit(fused)/aten.tanh.default/tanh"}
        }

        ENTRY %main.4 (inputs: f32[4]) -> f32[4] {
          %inputs = f32[4]{0} parameter(0)
          ROOT %fusion = f32[4]{0} fusion(%inputs), kind=kLoop, calls=%fused_computation
        }
        """)
    assert instruction_count(module) == 4


def test_a_sync_after_the_last_optimizer_step_gets_a_closing_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace_path = _record(tmp_path, "item_after_step.py", """\
        import torch
        w = torch.nn.Parameter(torch.ones(4).to("tpu"))
        opt = torch.optim.SGD([w], lr=0.1)
        for i in range(4):
            opt.zero_grad()
            loss = (w * 2).sum()
            loss.backward()
            opt.step()
            print(loss.item())
        """)
    with tputrace.open(trace_path) as trace:
        steps = [(step.step, step.source) for step in trace.records("steps", order_by="step")]
        assert steps == [(0, "optimizer"), (1, "optimizer"), (2, "optimizer"), (3, "optimizer"), (4, "end")]
        assert sorted(sync.step for sync in trace.records("syncs")) == [1, 2, 3, 4]
    capsys.readouterr()
    assert main(["report", "--json", str(trace_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    (finding,) = [finding for finding in report["findings"] if finding["analyzer"] == "syncs"]
    assert "(item sync) 4 times in 4 steps" in finding["explanation"]
    assert finding["evidence"][0]["text"].startswith("4 item syncs, 1 time per step")


def test_a_run_without_work_after_its_last_step_has_no_closing_step(tmp_path: Path) -> None:
    trace_path = _record(tmp_path, "no_tail.py", """\
        import torch, tputrace
        x = torch.ones(4, device="tpu")
        for i in range(2):
            print((x * i).sum().item())
            tputrace.step()
        """)
    with tputrace.open(trace_path) as trace:
        assert [step.source for step in trace.records("steps", order_by="step")] == ["explicit", "explicit"]


@needs_console_script
def test_a_copy_between_chips_flushes_with_a_listed_trigger(tmp_path: Path) -> None:
    trace_path = _record_with_console_script(tmp_path, "two_chips.py", """\
        import torch
        a = torch.ones(8, device="tpu:0") * 2
        b = a.to("tpu:1")
        print((b + 1).sum().item())
        """, "--chips", "2")
    with tputrace.open(trace_path) as trace:
        triggers = {flush.trigger for flush in trace.records("flushes")}
    assert "transfer" in triggers
    (trigger_column,) = [column for column in FLUSHES.columns if column.name == "trigger"]
    assert triggers <= _listed(trigger_column.doc)
    assert {"transfer", "compiled_graph"} <= _listed(trigger_column.doc)
