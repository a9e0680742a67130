"""Scripts of kinds that read wrong before: a convolutional teacher run with autograd on, whose weights' gradients the
backward computes through `aten.convolution_backward` only; a teacher's gradient-accumulating adds of several shapes in
one strict-mode step read as sizes taken in turn; a recurrent cell called over the time steps of one forward read as a
loop without steps; and an imported capture of a script whose file is named like a standard library module."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_fresh_scripts import _run
from test_fresh_scripts13 import MULTI_TASK
from test_fresh_scripts14 import DISTILLATION

from tputrace.analysis import analyze_path
from tputrace.cli.main import main

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

CONV_TEACHER = '''
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)


    class Teacher(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1),
                                          nn.ReLU())
            self.classifier = nn.Conv2d(64, 10, 1)

        def forward(self, x):
            return self.classifier(self.features(x)).mean((2, 3))  {marker}


    teacher = Teacher().to("tpu")
    student = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                            nn.Linear(8, 10)).to("tpu")
    opt = torch.optim.SGD(student.parameters(), lr=0.01)
    for step in range(8):
        images = torch.randn(16, 3, 32, 32, device="tpu")
        labels = torch.randint(0, 10, (16,), device="tpu")
        soft_targets = teacher(images){detach}
        logits = student(images)
        loss = F.kl_div(F.log_softmax(logits, -1), F.softmax(soft_targets, -1), reduction="batchmean")
        loss = loss + F.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(loss.item())
'''


def test_a_convolutional_teacher_run_with_autograd_on_is_a_backward_through_frozen_weights(tmp_path) -> None:
    """A teacher of convolutions only: the backward's `aten.convolution_backward` of its frozen weights computed their
    gradients (its output_mask asked for them), so the finding is at the teacher's forward line; detached, none."""
    report, script, line = _run(tmp_path, "conv_distill", CONV_TEACHER.replace("{detach}", ""))
    (frozen,) = [finding for finding in report.findings if finding.analyzer == "frozen_backward"]
    assert (frozen.file, frozen.line) == (str(script), line), frozen.title
    assert "3 weights of Teacher.classifier, Teacher.features.0, Teacher.features.2" in frozen.explanation, frozen.explanation
    assert "24 weight-gradient products" in frozen.explanation, frozen.explanation
    assert all(evidence.text.startswith("aten.convolution_backward") for evidence in frozen.evidence), frozen.evidence
    # the first convolution takes the images, which need no gradient: only its weight's gradient is made
    assert "The backward also ran 16 products through those weights" in frozen.explanation, frozen.explanation
    detached, _, _ = _run(tmp_path, "conv_distill_detached", CONV_TEACHER.replace("{detach}", ".detach()"))
    assert not [finding for finding in detached.findings if finding.analyzer == "frozen_backward"]


@pytest.mark.parametrize(("mode", "source", "sizes"), [
    (("--mode", "strict"), DISTILLATION.replace("{detach}", ""), None),
    ((), MULTI_TASK, "1, 5, 10"),
], ids=["teacher_strict", "multi_task"])
def test_shapes_of_one_step_are_no_sizes_taken_in_turn(tmp_path, mode: tuple[str, ...], source: str,
                                                       sizes: str | None) -> None:
    """In strict mode `loss.backward()` adds each teacher weight's gradient into its `.grad`, one program per weight
    shape, every step: several shapes of one step, no fixed set of sizes; heads of widths picked one per step are."""
    report, _, _ = _run(tmp_path, "size_turns", source, mode)
    settled = [finding for finding in report.findings if "sizes compiled once each" in finding.title]
    if sizes is None:
        assert not settled, [finding.title for finding in settled]
    else:
        (finding,) = settled
        assert f"took sizes {sizes}" in finding.title, finding.title

CELL_OVER_TIME = '''
    import torch
    from torch import nn

    torch.manual_seed(0)


    class Decoder(nn.Module):
        def __init__(self, hidden=256):
            super().__init__()
            self.cell = nn.{cell}(128, hidden)
            self.out = nn.Linear(hidden, 32)

        def forward(self, x):
            h = torch.zeros(x.shape[0], self.cell.hidden_size, device=x.device)
            state = (h, torch.zeros_like(h)) if isinstance(self.cell, nn.LSTMCell) else h
            outputs = []
            for t in range(x.shape[1]):
                state = self.cell(x[:, t], state)  {marker}
                h = state[0] if isinstance(state, tuple) else state
                outputs.append(self.out(h))
            return torch.stack(outputs, 1)


    model = Decoder().to("tpu")
    x = torch.randn(64, 24, 128, device="tpu")
    loss = model(x).pow(2).mean()
    loss.backward()
    print(loss.item())
'''


@pytest.mark.parametrize("cell", ["LSTMCell", "RNNCell"])
def test_a_cell_stepped_over_time_in_one_forward_is_no_loop_whose_memory_grows(tmp_path, cell: str) -> None:
    """One forward of a model stepping its cell over 24 time steps, then one backward, in a run without steps: the
    cell's calls inside the model's one call, and the backward's time steps in its one run, are no iterations of a
    loop of the script."""
    report, _, _ = _run(tmp_path, "cell_over_time", CELL_OVER_TIME.replace("{cell}", cell), ("--mode", "strict"))
    growth = [finding for finding in report.findings if "loop without steps" in finding.title]
    assert not growth, [finding.title for finding in growth]


# A JAX loop whose batches a generator in the project's own `data/{name}.py` makes slowly, captured with the Python
# tracer: the capture names that file `{name}.py`, the basename of a standard library module.
SLOW_BATCHES = textwrap.dedent("""
    import time

    import numpy as np


    def make_batch():
        time.sleep(0.03)
        return np.random.rand(32, 64).astype(np.float32)


    def batches():
        while True:
            yield make_batch()
""")

JAX_LOOP = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    from data.{name} import batches


    @jax.jit
    def step(w, x):
        return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)


    data = batches()
    w = step(jnp.ones((64, 64)), next(data)).block_until_ready()
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 1
    with jax.profiler.trace(sys.argv[1], profiler_options=options):
        for i in range(8):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                x = next(data)
                w = step(w, x)
        w.block_until_ready()
""")


@pytest.mark.parametrize("name", ["random", "queue"])
def test_a_users_file_named_like_a_standard_library_module_is_the_hosts_cause(tmp_path: Path, name: str) -> None:
    """The capture names the user's `data/random.py` by its basename only; its `make_batch` is no function of the
    standard library's `random`, so it is the range the idle devices waited for, not a library call inside it."""
    pytest.importorskip("jax", reason="making a capture needs jax")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "__init__.py").write_text("")
    (tmp_path / "data" / f"{name}.py").write_text(SLOW_BATCHES)
    script = tmp_path / "train.py"
    script.write_text(JAX_LOOP.replace("{name}", name))
    completed = subprocess.run([sys.executable, str(script), str(tmp_path / "logdir")], capture_output=True, text=True,
                               cwd=tmp_path, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    output = tmp_path / "capture.tptrace"
    assert main(["import", str(tmp_path / "logdir"), "-o", str(output)]) == 0
    (idle,) = [finding for finding in analyze_path(output).findings if finding.analyzer == "input_wait"]
    assert idle.title.endswith(f"the host is in {name}.py:7 make_batch"), idle.title
    assert "`time sleep`" in idle.explanation and idle.line == 7, idle.explanation
