"""Scripts of kinds that read wrong before: a convolutional teacher run with autograd on, whose weights' gradients the
backward computes through `aten.convolution_backward` only; a teacher's gradient-accumulating adds of several shapes in
one strict-mode step read as sizes taken in turn; a recurrent cell called over the time steps of one forward read as a
loop without steps; and an imported capture of a script whose file is named like a standard library module."""

from __future__ import annotations

import pytest
from test_fresh_scripts import _run
from test_fresh_scripts13 import MULTI_TASK
from test_fresh_scripts14 import DISTILLATION

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
