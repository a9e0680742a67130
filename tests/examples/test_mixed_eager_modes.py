"""Runs that switch eager modes part-way, and chip costs of runs on XLA:CPU chips: a strict mode entered after fused
steps compiles each op once at its line, first compiles and no storm, while a size that changes step by step still
storms; its strict steps' chip time is the chip's work inside their ops' times, not 0 ns; and a float32 product's
saving on the MXU is projected from the target's roofline, not the CPU's measured time scaled."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

from tputrace.analysis import Report
from tputrace.analysis.shapes import matmuls_of

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

# Three fused steps, then four strict ones with a size that grows each step, then an evaluation after the loop.
SWITCHES_TO_STRICT = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 48), nn.Tanh(), nn.Linear(48, 40), nn.Tanh(), nn.Linear(40, 6)).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs, labels = torch.randn(8, 24, device="tpu"), torch.randint(0, 6, (8,), device="tpu")
    for step in range(7):
        if step == 3:
            torch.tpu.set_eager_mode("DEFER_NEVER")
        loss = nn.functional.cross_entropy(model(inputs), labels)  # model line
        noise = torch.randn(step + 2, 6, device="tpu").square().mean()  # growing line
        optimizer.zero_grad()
        (loss + noise).backward()
        optimizer.step()
    held_out = torch.randn(20, 24, device="tpu")
    with torch.no_grad():
        for _ in range(3):
            print(model(held_out).argmax(-1).bincount(minlength=6).tolist())  # evaluation line
'''

# A float32 student trained against a frozen float32 teacher run with autograd on.
FLOAT32_DISTILLATION = '''
    import torch
    from torch import nn

    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(768, 1024), nn.ReLU(), nn.Linear(1024, 768)).to("tpu")
    student = nn.Sequential(nn.Linear(768, 512), nn.ReLU(), nn.Linear(512, 768)).to("tpu")
    optimizer = torch.optim.SGD(student.parameters(), lr=1e-3)
    x = torch.randn(768, 768, device="tpu")
    for step in range(3):
        target = teacher(x)
        loss = (student(x) - target).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(loss.item())
'''


def _line(source: str, marker: str) -> int:
    (line,) = [number for number, text in enumerate(textwrap.dedent(source).splitlines(), 1) if f"# {marker}" in text]
    return line


@pytest.fixture(scope="module")
def switched(tmp_path_factory: pytest.TempPathFactory) -> Report:
    folder = tmp_path_factory.mktemp("switched")
    script = folder / "switched.py"
    script.write_text(textwrap.dedent(SWITCHES_TO_STRICT))
    return record(script, folder / "switched.tptrace", [])


def test_first_compiles_in_a_strict_mode_entered_part_way_are_no_storm(switched: Report) -> None:
    """Strict steps after fused ones compile each op of the model once at its line, several signatures there (one
    per `nn.Linear`), and so does the evaluation after the loop: first compiles, not a recompilation storm. The
    line whose size grows each strict step recompiles, and is the one storm."""
    storms = [finding for finding in switched.findings if finding.analyzer == "recompiles"
              and finding.title.startswith("Recompilation storm")]
    assert [finding.line for finding in storms] == [_line(SWITCHES_TO_STRICT, "growing line")], \
        [(finding.line, finding.title) for finding in storms]
    data = switched.results["recompiles"].data
    model_line = f"switched.py:{_line(SWITCHES_TO_STRICT, 'model line')}"
    evaluation_line = f"switched.py:{_line(SWITCHES_TO_STRICT, 'evaluation line')}"
    compiled_at = {site.where.rsplit("/", 1)[-1] for site in data.sites if site.kind == "op"}
    assert {model_line, evaluation_line} <= compiled_at, compiled_at  # the strict ops did compile there
    assert not [storm for storm in data.storms if storm.where.endswith((model_line, evaluation_line))], data.storms


def test_host_bound_steps_of_a_switched_run_have_each_modes_chip_time(switched: Report) -> None:
    """The fused steps' chip time is their executions'; the strict steps recorded none, and theirs is the chip's work
    inside their ops' recorded times, where it read 0 ns. The first strict step, whose ops compiled, is left out."""
    host = switched.results["host_bound"].data
    by_step = {step.step: step for step in host.steps}
    fused, strict = [by_step[step] for step in (1, 2) if step in by_step], [by_step[step] for step in (4, 5, 6)]
    assert fused and all(step.waited_ns == 0 and step.chip_ns > 0 for step in fused), host.steps
    assert 3 not in by_step, host.steps
    assert all(step.chip_ns == step.waited_ns for step in strict), host.steps
    assert sum(step.chip_ns for step in strict) > 0, host.steps
    assert "strict" in (host.chip_time or ""), host.chip_time
    for finding in switched.findings:
        if finding.analyzer == "host_bound":
            assert " 0 ns" not in finding.title, finding.title


def test_float32_and_frozen_costs_on_cpu_chips_are_projected_for_the_target(tmp_path: Path) -> None:
    """On XLA:CPU chips the float32 products' chip time is their roofline time on the target, at the precision they
    ran at (the saving was the CPU's measured time times the MXU's share, hundreds of times a projected step); the
    frozen teacher's weight-gradient products give their projected time beside the time measured on the CPU."""
    script = tmp_path / "distill.py"
    script.write_text(textwrap.dedent(FLOAT32_DISTILLATION))
    report = record(script, tmp_path / "distill.tptrace", [])
    precision = report.results["precision"].data
    assert precision.chip_time == "target roofline estimate" and precision.products, precision
    for product in precision.products:
        expected = product.calls * sum(report.target.roofline_ns(matmul.flops, matmul.bytes, "f32", product.matmul_precision)
                                       for matmul in matmuls_of(product.op, product.inputs))
        assert product.chip_ns == pytest.approx(expected), product
    (finding,) = [finding for finding in report.findings if finding.analyzer == "precision"]
    assert finding.cost_basis == "projected for the target chip"
    assert finding.cost_total_ns == pytest.approx(precision.saving_estimate_ns)
    assert "roofline estimate" in finding.explanation and "XLA:CPU" in finding.explanation
    frozen = report.results["frozen_backward"].data.backward
    assert frozen is not None and frozen.projected_ns is not None and 0 < frozen.projected_ns < frozen.cost_ns, frozen
