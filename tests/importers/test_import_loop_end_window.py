"""A profiling schedule whose next cycle is recording when the loop runs out of batches: its last window holds the step
that the loop's last `prof.step()` opened, in which nothing ran but the DataLoader's fetch that ended the loop."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tputrace
from tputrace.cli.main import main

LOOP_END_SCRIPT = textwrap.dedent("""
    import sys, torch
    from torch.utils.data import DataLoader, TensorDataset
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(24, 16), torch.randint(0, 4, (24,))), batch_size=4)
    # Cycles of 4 steps (wait, warmup, 2 active): steps 2 and 3 are recorded, then the cycle that records step 6 is
    # under way when the 6 batches run out.
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2),
                 on_trace_ready=tensorboard_trace_handler(sys.argv[1])) as prof:
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
""")


def test_a_last_window_without_ops_is_no_step_of_the_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "loop_end.py"
    script.write_text(LOOP_END_SCRIPT)
    folder = tmp_path / "tb"
    subprocess.run([sys.executable, str(script), str(folder)], check=True, capture_output=True, timeout=300)
    windows = sorted(folder.glob("*.json"))
    assert len(windows) == 2
    last = [event for event in json.loads(windows[-1].read_text())["traceEvents"] if event.get("ph") == "X"]
    assert {event["name"].split("#")[0] for event in last} >= {"ProfilerStep", "enumerate(DataLoader)"}
    assert not [event for event in last if event.get("cat") == "cpu_op"]
    output = tmp_path / "loop_end.tptrace"
    assert main(["import", str(folder), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        assert [(step.step, step.source) for step in trace.records("steps")] == [
            (2, "imported"), (3, "imported"), (6, "end")]
    capsys.readouterr()
    assert main(["summary", str(output)]) == 0
    assert " 2 steps (" in capsys.readouterr().out
