"""A loop that reads nothing back each step lets the host queue steps ahead of the chip: the summary and the report
tell the chip's pace beside the host's median step; a loop that reads its loss each step has no such line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_problems import record

import tputrace
from tputrace.derived.run_facts import run_facts
from tputrace.summary import summarize

CHIP_BOUND = textwrap.dedent("""\
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(768, 768) for _ in range(4)]).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(1024, 768).to("tpu")
    losses = []
    for _ in range(8):
        loss = model(batch).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach()){read}
    print(sum(loss.item() for loss in losses))
""")


@pytest.mark.parametrize("read_each_step", [False, True])
def test_chip_pace_is_told_where_the_host_ran_ahead(tmp_path: Path, read_each_step: bool) -> None:
    script = tmp_path / "chip_bound.py"
    script.write_text(CHIP_BOUND.format(read="\n    print(loss.item())" if read_each_step else ""))
    report = record(script, tmp_path / "run.tptrace", [])
    with tputrace.open(tmp_path / "run.tptrace") as trace:
        summary = summarize(trace)
        facts = run_facts(trace, 0)  # the TUI's overview and the HTML report's facts
    if read_each_step:
        assert report.chip_pace is None and summary.chip_pace is None and facts.chip_pace is None
        return
    pace = report.chip_pace
    assert pace is not None and summary.chip_pace == pace == facts.chip_pace
    assert pace.host_median_step_ns == summary.median_step_ns and pace.mean_step_ns >= 1.2 * pace.host_median_step_ns
    assert pace.steps_ahead >= 2
    # The chip's steady steps span from the first step's finish on the chip (its host end or its last program ready,
    # whichever is later) to the last step's, less the time the chip sat idle until the host launched a step's first
    # program (a loaded host can fall behind the chip for a step).
    with tputrace.open(tmp_path / "run.tptrace") as trace:
        steps = trace.sql("SELECT step, end_ns FROM steps WHERE COALESCE(source, '') != 'end' ORDER BY step")
        executions = trace.sql("SELECT step, MIN(start_ns), MAX(start_ns + dur_ns) FROM executions WHERE dur_ns IS NOT NULL GROUP BY step")
    launched = {step: launch_ns for step, launch_ns, _ in executions}
    ready = {step: ready_ns for step, _, ready_ns in executions}
    finishes = [max(end_ns, ready.get(step, 0)) for step, end_ns in steps]
    for index in range(1, len(finishes)):
        finishes[index] = max(finishes[index], finishes[index - 1])
    idle_ns = sum(max(0, launched[step] - finishes[index - 1]) for index, (step, _) in enumerate(steps[1:], 1) if step in launched)
    assert (len(steps) - 1) * pace.mean_step_ns == pytest.approx(finishes[-1] - finishes[0] - idle_ns, abs=len(steps))
