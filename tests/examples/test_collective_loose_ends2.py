"""Distributed scripts under `tputrace run --nproc 2` whose collectives were read wrong: an asynchronous call's
output read before its wait, advice to hide communication naming DDP's buckets in a run without DDP, and the TUI's
Collectives view summing the time of calls in flight together."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from fixtures.make_tui_fixture import make_session, settle
from test_fresh_distributed import HEADER, _report, _run
from test_collective_loose_ends import LATE_TO_MANY

import tputrace
from tputrace.analysis import analyze
from tputrace.store.aggregates import merged_ns
from tputrace.tui.render import fmt_ns

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

# An asynchronous all-reduce whose output is read before its wait (planted), and one waited before its output is read.
EARLY_READ = HEADER + '''
    model = nn.Linear(16, 16).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        loss = model(torch.randn(8, 16, device="tpu")).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        work = dist.all_reduce(total, async_op=True)  # issued
        doubled = total * 2  {marker}
        work.wait()
        counts = torch.ones(4, device="tpu")
        waited = dist.all_reduce(counts, async_op=True)  # waited first
        other = model.weight.sum()
        waited.wait()
        print(float((doubled + counts.sum() + other).item()))
    dist.destroy_process_group()
'''

# Gradients reduced by hand after the backward, one call per parameter: no DDP anywhere.
HAND_REDUCED = HEADER + '''
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)]).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        model(torch.randn(32, 256, device="tpu")).square().mean().backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)  {marker}
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
'''


def _line_of(script: Path, text: str) -> int:
    return next(number for number, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def test_reading_an_asynchronous_calls_output_before_its_wait_is_named_at_the_reading_line(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "early_read", EARLY_READ)
    issued = _line_of(script, "# issued")
    for rank in (0, 1):
        with tputrace.open(trace) as opened:
            report = analyze(opened, rank=rank)
        early = [finding for finding in report.findings if "before waiting on it" in finding.title]
        assert [finding.line for finding in early] == [line], [finding.title for finding in report.findings]
        (finding,) = early
        assert finding.severity == "warning" and f"{script.name}:{issued}" in finding.title
        assert "wait()" in finding.suggestion and f"{script.name}:{line}" in finding.suggestion


def test_exposed_communication_of_gradients_reduced_by_hand_gets_no_ddp_advice(tmp_path: Path) -> None:
    script, trace, line = _run(tmp_path, "hand_reduced", HAND_REDUCED)
    report = _report(trace)
    exposed = [finding for finding in report.findings if finding.title.startswith("Communication exposed")]
    assert exposed, [finding.title for finding in report.findings]
    advice = exposed[0].suggestion
    assert not [text for text in ("DDP", "bucket_cap_mb", "no_sync", "FSDP") if text in advice], advice
    assert f"reduced by hand at {script.name}:{line}" in advice and "register_post_accumulate_grad_hook" in advice
    # Each call cuts the step's fused program: the cut's advice names no DDP either.
    (cut,) = [finding for finding in report.findings if finding.title.startswith("Fragmented fusion")]
    assert "one flattened all-reduce" in cut.suggestion, cut.suggestion
    assert not [text for text in ("DDP buckets", "bucket_cap_mb", "no_sync") if text in cut.suggestion], cut.suggestion


def test_the_collectives_view_counts_calls_in_flight_together_once(tmp_path: Path) -> None:
    from tputrace.tui.app import TraceApp

    _, trace, _ = _run(tmp_path, "late_to_many", LATE_TO_MANY)
    shown: dict[str, Any] = {}

    async def drive() -> None:
        app = TraceApp(make_session(trace))
        async with app.run_test(size=(160, 45)) as pilot:
            await settle(pilot)
            await pilot.press("6")
            await settle(pilot)
            table = app.screen.query_one("#collectives-ranks")
            shown["ranks"] = [[str(getattr(cell, "plain", cell)) for cell in table.get_row_at(index)] for index in range(table.row_count)]
            shown["status"] = str(app.screen.query_one("#collectives-status").render())

    asyncio.run(drive())
    with tputrace.open(trace) as opened:
        spans = {rank: opened.sql("SELECT start_ns, start_ns + dur_ns FROM collectives WHERE rank = ? ORDER BY start_ns", (rank,))
                 for rank in (0, 1)}
        (summed,) = opened.sql("SELECT SUM(dur_ns) FROM collectives WHERE rank = 1")[0]
    in_flight = {rank: merged_ns(intervals) for rank, intervals in spans.items()}
    assert summed > 2 * in_flight[1]  # rank 1's eight calls wait for rank 0 together
    ranks = {row[0].strip(): row for row in shown["ranks"]}
    assert ranks["1"][2].strip() == fmt_ns(in_flight[1]), shown["ranks"]
    assert ranks["0"][2].strip() == fmt_ns(in_flight[0]), shown["ranks"]
    assert f", {fmt_ns(in_flight[0])}," in shown["status"], shown["status"]
