"""Scripts of kinds that read wrong before: a distillation whose teacher runs with autograd on, the backward through it
unreported; an attention head width of 10 told to become 8 or 16, which changes nothing on the MXU; a column picked by
a Python int each step in strict mode, its per-index programs in no finding; and scripts named like library modules
(`pmap.py`, `functional.py`) or kept in a folder named like the backend's (`backend/ops.py`), whose lines must stay the
user's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_fresh_scripts import _run

from tputrace.analysis import analyze_path

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

DISTILLATION = '''
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)


    class Teacher(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU())
            self.head = nn.Linear(1024, 10)

        def forward(self, x):
            return self.head(self.body(x))  {marker}


    teacher = Teacher().to("tpu")
    student = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)).to("tpu")
    opt = torch.optim.Adam(student.parameters(), lr=1e-3)
    temperature = 2.0
    for step in range(10):
        x = torch.randn(64, 256, device="tpu")
        y = torch.randint(0, 10, (64,), device="tpu")
        soft_targets = teacher(x){detach}
        logits = student(x)
        distill = F.kl_div(F.log_softmax(logits / temperature, -1), F.softmax(soft_targets / temperature, -1),
                           reduction="batchmean") * temperature ** 2
        loss = distill + F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

PARTLY_FROZEN = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to("tpu")
    model[2].requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for step in range(10):
        x = torch.randn(64, 128, device="tpu")
        y = torch.randint(0, 10, (64,), device="tpu")
        loss = nn.functional.cross_entropy(model(x), y)  {marker}
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

NARROW_HEADS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=40, nhead=4, dim_feedforward=160, batch_first=True).to("tpu")
    head = nn.Linear(40, 2).to("tpu")
    opt = torch.optim.Adam([*layer.parameters(), *head.parameters()], lr=1e-3)
    for step in range(8):
        x = torch.randn(64, 128, 40, device="tpu")
        y = torch.randint(0, 2, (64,), device="tpu")
        loss = nn.functional.cross_entropy(head(layer(x).mean(1)), y)  {marker}
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

COLUMN_PER_STEP = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    FEATURES = 8
    model = nn.Linear(1, 1).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(256, FEATURES, device="tpu")
    target = torch.randn(256, 1, device="tpu")
    for step in range(16):
        feature = data[:, step % FEATURES].unsqueeze(1)  {marker}
        loss = ((model(feature) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''

SYNCED_LOSS = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(8):
        x = torch.randn(32, 64, device="tpu")
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() > 1e6:  {marker}
            break
    print(loss.item())
'''


def test_a_teacher_run_with_autograd_on_is_a_backward_through_frozen_weights(tmp_path: Path) -> None:
    """The teacher's forward keeps its graph and the loss reaches it, so the backward computes its weights' gradients,
    which no optimizer steps: one finding at the teacher's forward line, costing those products; with the teacher's
    output detached there is none."""
    report, script, line = _run(tmp_path, "distill", DISTILLATION.replace("{detach}", ""))
    (frozen,) = [finding for finding in report.findings if finding.analyzer == "frozen_backward"]
    assert (frozen.file, frozen.line) == (str(script), line), frozen.title
    assert frozen.title.startswith(f"Backward through parameters no optimizer steps: the forward at {script.name}:{line}")
    assert "3 weights of Teacher.body.0, Teacher.body.2, Teacher.head" in frozen.explanation, frozen.explanation
    assert frozen.cost_per_step_ns and frozen.suggestion.startswith("If the `Teacher` model is frozen on purpose"), frozen.suggestion
    assert "under `torch.no_grad()`" in frozen.suggestion, frozen.suggestion
    assert any(evidence.text.startswith("aten.mm.default(f32[1024,64], f32[64,1024]) in the backward: 10 calls, a frozen "
                                        "weight's gradient") for evidence in frozen.evidence), frozen.evidence
    assert "The backward also ran 20 products through those weights" in frozen.explanation, frozen.explanation
    detached, _, _ = _run(tmp_path, "distill_detached", DISTILLATION.replace("{detach}", ".detach()"))
    assert not [finding for finding in detached.findings if finding.analyzer == "frozen_backward"]



def test_a_layer_frozen_behind_a_trained_one_is_no_backward_to_remove(tmp_path: Path) -> None:
    """A middle layer frozen with `requires_grad_(False)`: the backward must pass through it to reach the first layer,
    but computes no gradient of its weight, so there is nothing to remove."""
    report, _, _ = _run(tmp_path, "partly_frozen", PARTLY_FROZEN)
    assert not [finding for finding in report.findings if finding.analyzer == "frozen_backward"]

def test_a_head_width_far_below_the_mxu_is_not_told_to_become_a_multiple_of_8(tmp_path: Path) -> None:
    """d_model 40 in 4 heads: a head width of 10, the rows of one backward product (padded to 16) and the k or n of
    the attention products, which the MXU pads to its width whatever multiple of 8 it is. The advice says so."""
    report, _, _ = _run(tmp_path, "narrow_heads", NARROW_HEADS)
    (width,) = [finding for finding in report.findings if finding.analyzer == "padding" and "dim 10 " in finding.title]
    assert not width.suggestion.startswith("Use 8"), width.suggestion
    assert "where the MXU pads it to 256" in width.suggestion and "not the MXU's" in width.suggestion, width.suggestion
    assert "fewer, wider heads" in width.suggestion, width.suggestion


@pytest.mark.parametrize("mode", [(), ("--mode", "strict")], ids=["defer", "strict"])
def test_a_column_picked_by_a_python_int_each_step_is_an_index_storm(tmp_path: Path, mode: tuple[str, ...]) -> None:
    """`data[:, step % 8]`: the index is a constant of the program, one program per column, in either mode (strict
    mode's view programs were in no finding); the advice is to index with a tensor, not to pad a length."""
    report, script, line = _run(tmp_path, "column_per_step", COLUMN_PER_STEP, mode)
    (storm,) = [finding for finding in report.findings if finding.analyzer == "recompiles"]
    assert "as a Python int indexing a tensor changes (8 positions)" in storm.title, storm.title
    # a read view is recorded at the op that first takes it, the next line here
    assert storm.line == line + 1 and "Pad" not in storm.suggestion, storm.suggestion
    assert "index_select" in storm.suggestion, storm.suggestion
    if mode:
        assert "DeferAndFuse" not in storm.explanation, storm.explanation


@pytest.mark.parametrize("name", ["pmap", "functional"])
def test_a_script_named_like_a_library_module_keeps_its_lines(tmp_path: Path, name: str) -> None:
    """A user's `pmap.py` or `functional.py` is the user's by its path: its read is found at its own line."""
    report, script, line = _run(tmp_path, name, SYNCED_LOSS)
    (sync,) = [finding for finding in report.findings if finding.analyzer == "syncs"]
    assert (sync.file, sync.line) == (str(script), line), sync.title


@pytest.mark.parametrize("module", ["ops", "compile"])
def test_a_users_module_in_a_folder_named_backend_is_the_users(tmp_path: Path, module: str) -> None:
    """A project's `backend/ops.py` has the path tail of the tpu backend's modules: on this machine it is told by where
    it is, so the out-of-memory failure is at its line, not at the script's call of it."""
    (tmp_path / "backend").mkdir()
    helper = tmp_path / "backend" / f"{module}.py"
    helper.write_text('import torch\n\n\ndef make_buffer(rows):\n    return torch.ones(rows, 1 << 20, device="tpu")\n')
    script = tmp_path / "train.py"
    script.write_text(f"import torch\nfrom backend.{module} import make_buffer\n\n"
                      "kept = [torch.ones(256, 256, device='tpu') for _ in range(4)]\nhuge = make_buffer(1 << 20)\n")
    trace = tmp_path / "train.tptrace"
    completed = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "run", "--mode", "strict", "-o", str(trace),
                                str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert completed.returncode != 0
    (oom,) = [finding for finding in analyze_path(trace).findings if finding.title.startswith("The run ran out of memory")]
    assert (oom.file, oom.line) == (str(helper), 5), oom.title
