"""In strict mode a recompile is a program of the same op (or view) at the same line compiled in an
earlier step for other shapes or arguments: the layers of one model call, with other shapes, are each
a first compile, and a new batch size at the same line in a later step is a recompile of that line's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tputrace

_RUN = "import sys; from tputrace.cli.main import main; sys.exit(main(sys.argv[1:]))"
_MLP = (
    "import torch, torch.nn as nn\n"
    "model = nn.Sequential(nn.Linear(10, 128), nn.ReLU(), nn.Linear(128, 4)).to('tpu')\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "for batch in {batches}:\n"
    "    x = torch.randn(batch, 10).to('tpu')\n"
    "    y = torch.randint(0, 4, (batch,)).to('tpu')\n"
    "    loss = nn.functional.cross_entropy(model(x), y)\n"
    "    optimizer.zero_grad()\n"
    "    loss.backward()\n"
    "    optimizer.step()\n"
    "    loss.item()\n"
)


def _recompiles(tmp_path: Path, batches: tuple[int, ...]) -> list[tuple[str, str, int]]:
    script = tmp_path / "mlp.py"
    script.write_text(_MLP.format(batches=batches))
    trace_path = tmp_path / "mlp.tptrace"
    result = subprocess.run([sys.executable, "-c", _RUN, "run", "--no-summary", "--mode", "strict", "-o", str(trace_path), str(script)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with tputrace.open(trace_path) as trace:
        return [(compile.name, compile.diff, compile.step) for compile in trace.records("compiles") if compile.reason == "recompile"]


def test_programs_of_other_layers_and_lines_are_not_recompiles_of_each_other(tmp_path: Path) -> None:
    assert _recompiles(tmp_path, (32, 32, 32)) == []


def test_a_new_batch_size_recompiles_the_programs_of_its_lines_against_their_own_earlier_shapes(tmp_path: Path) -> None:
    recompiles = _recompiles(tmp_path, (32, 32, 24))
    assert recompiles, "the last step's smaller batch compiles its lines' programs again"
    assert {step for _, _, step in recompiles} == {2}
    addmm_diffs = [diff for name, diff, _ in recompiles if name == "aten.addmm.default"]
    assert addmm_diffs and all("32 -> 24" in diff for diff in addmm_diffs)
    assert all("10 -> 128" not in diff and "128 -> 4" not in diff for _, diff, _ in recompiles)


_INFERENCE = (
    "import torch, torch.nn as nn\n"
    "model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4)).to('tpu')\n"
    "with torch.no_grad():\n"
    "    for batch in (8, 12, 16):\n"
    "        model(torch.randn(batch, 10).to('tpu')).sum().item()\n"
)


def test_a_loop_without_steps_recompiles_each_layers_programs_for_new_shapes(tmp_path: Path) -> None:
    """No optimizer step divides the loop: a layer's program for a new batch size is a recompile of the one its
    module call compiled before (the storm's count), and the two layers are not recompiles of each other."""
    script = tmp_path / "infer.py"
    script.write_text(_INFERENCE)
    trace_path = tmp_path / "infer.tptrace"
    result = subprocess.run([sys.executable, "-c", _RUN, "run", "--no-summary", "--mode", "strict", "-o", str(trace_path), str(script)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with tputrace.open(trace_path) as trace:
        addmm = [(compile.reason, compile.diff) for compile in trace.records("compiles") if compile.name == "aten.addmm.default"]
    assert [reason for reason, _ in addmm] == ["first", "first", "recompile", "recompile", "recompile", "recompile"], addmm
    assert {diff for _, diff in addmm if diff} == {"input 1 dim 0: 8 -> 12", "input 1 dim 0: 12 -> 16"}, addmm
