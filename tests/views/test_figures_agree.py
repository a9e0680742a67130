"""The figures a user meets first agree across views on real recordings of examples/gpt_train.py (the whole
run, and a run that keeps steps 2-4 only, `--schedule wait=1,warmup=1,active=3`): the summary, the report's
JSON (as `tputrace report --json` writes it), the TUI's Overview, the HTML report's header and the Perfetto
export's metadata."""

from __future__ import annotations

import json
import re

import pytest

from tputrace.analysis.render import render_json
from tputrace.analysis.report import analyze
from tputrace.store.reader import open_trace
from tputrace.summary import render_text, summarize
from tputrace.wording import format_ns


@pytest.fixture(scope="module", params=["whole", "windowed"])
def figures(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from tputrace.tui.overview import facts_text, projection_text, step_summary
    from tputrace.tui.queries.overview import overview
    from tputrace.viewers.report.data import prepare_report
    from tputrace.viewers.report.report_html import render_report

    from tputrace.viewers.export.perfetto import export_perfetto

    trace_path = request.getfixturevalue("gpt_train_trace" if request.param == "whole" else "gpt_train_windowed_trace")
    perfetto_path = tmp_path_factory.mktemp("perfetto") / "gpt_train.json"
    with open_trace(trace_path) as trace:
        export_perfetto(trace, perfetto_path)
        summary = summarize(trace)
        tui = overview(trace, summary.rank)
        html = render_report(prepare_report(trace), plotlyjs="cdn")
        report = json.loads(render_json(analyze(trace)))
        steps = [row[0] for row in trace.sql("SELECT step FROM steps WHERE source = 'optimizer' ORDER BY step")]
    return {"summary": summary, "summary_text": render_text(summary), "report": report,
            "tui": tui, "tui_steps": step_summary(tui.steps).plain,
            "tui_projection": projection_text(tui).plain,
            "perfetto": json.loads(perfetto_path.read_text())["otherData"]["step_times"], "html": html,
            "tui_facts": facts_text(tui.facts).plain, "windowed": request.param == "windowed", "step_numbers": steps}


def test_step_count_agrees(figures: dict[str, object]) -> None:
    summary = figures["summary"]
    steps = summary.step_count
    assert steps > 0
    assert figures["report"]["steps"] == steps
    assert figures["tui"].facts.steps == steps
    assert figures["perfetto"]["steps"] == steps
    assert re.search(rf"<th>steps</th><td>{steps} ·", figures["html"])
    assert f" · {steps} steps (" in figures["summary_text"]


def test_median_step_agrees(figures: dict[str, object]) -> None:
    median = figures["summary"].median_step_ns
    assert median is not None
    assert figures["report"]["median_step_ns"] == median
    assert figures["tui"].facts.median_step_ns == median
    assert figures["perfetto"]["median_step_ns"] == median
    assert f"median {format_ns(median)}" in figures["html"]
    assert f"median {format_ns(median)}" in figures["summary_text"]
    assert f"median step {format_ns(median)} measured on this host" in figures["tui_projection"]


def test_projected_step_agrees(figures: dict[str, object]) -> None:
    projected = figures["summary"].projected
    assert projected is not None and projected.median_ns is not None
    assert figures["report"]["projected_median_step_ns"] == projected.median_ns
    assert figures["tui"].projected.median_ns == projected.median_ns
    assert figures["perfetto"]["projected_median_step_ns"] == projected.median_ns
    shown = f"{format_ns(projected.median_ns)} projected for {projected.target}"
    for view in ("summary_text", "tui_projection", "html"):
        assert shown in figures[view], view


def test_compile_and_sync_counts_agree(figures: dict[str, object]) -> None:
    summary = figures["summary"]
    tui = figures["tui"]
    assert tui.compiles.count == summary.compiles.count
    assert (summary.compiles.count == 0) == figures["windowed"]  # a window after the first steps keeps no compile
    assert tui.compiles.total_ns == summary.compiles.total_ns
    assert f"{summary.compiles.count:,} compiles" in figures["html"]
    assert tui.facts.counts.get("syncs", 0) == summary.sync_count
    assert f"{summary.sync_count:,} syncs" in figures["html"]


def test_a_windowed_trace_counts_its_recorded_steps_and_every_view_says_which(figures: dict[str, object]) -> None:
    if not figures["windowed"]:
        assert figures["report"]["recording_window"] is None
        assert "this trace records" not in figures["summary_text"] + figures["html"] + figures["tui_facts"]
        return
    assert figures["step_numbers"] == [2, 3, 4]
    assert figures["summary"].step_count == 3
    sentence = "this trace records steps 2-4 of the run (--schedule wait=1,warmup=1,active=3)"
    assert figures["report"]["recording_window"]["recorded_steps"] == [[2, 4]]
    assert figures["report"]["recording_window"]["text"].startswith(sentence)
    for view in ("summary_text", "html", "tui_facts"):
        assert sentence in figures[view], view
