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
    # whichever is later) to the last step's.
    with tputrace.open(tmp_path / "run.tptrace") as trace:
        steps = trace.sql("SELECT step, end_ns FROM steps WHERE COALESCE(source, '') != 'end' ORDER BY step")
        ready = dict(trace.sql("SELECT step, MAX(start_ns + dur_ns) FROM executions GROUP BY step"))
    (first, first_end), (last, last_end) = steps[0], steps[-1]
    finished_ns = max(last_end, ready.get(last, 0)) - max(first_end, ready.get(first, 0))
    assert (len(steps) - 1) * pace.mean_step_ns == pytest.approx(finished_ns, abs=len(steps))
