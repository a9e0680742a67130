"""The HTML report's sharding section: communication per step, bytes by cause, meshes and parameters,
shown only for a trace with sharding records, with the trace's strings escaped."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

import tputrace
from fixtures.make_tui_fixture import SMALL_TRACE
from tputrace.viewers.report import report_html
from tputrace.viewers.report.analysis_data import prepare_analysis
from tputrace.viewers.report.data import prepare_report
from tputrace.viewers.report.sharding_section import plot_bytes_by_cause, prepare_sharding

HOSTILE = "<script>alert('x')</script>&\""


def test_the_section_data_adds_up_the_traces_records(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        data = prepare_sharding(trace, prepare_analysis(trace))
        ((gradient_bytes, gradients),) = trace.sql("SELECT SUM(bytes), COUNT(*) FROM collectives WHERE rank = 0 AND kind = 'all_reduce'")
    assert data.present
    assert [(mesh.shape, mesh.dim_names) for mesh in data.meshes] == [("2", "dp")]
    assert [parameter.placements for parameter in data.parameters] == ["Replicate()"]
    (cause,) = data.bytes_by_cause
    assert (cause.label, cause.count, cause.bytes) == ("ddp_bucket · DistributedDataParallel", gradients, gradient_bytes)
    assert data.per_step is not None and data.per_step.communication_per_step_ns > 0
    assert data.per_step.exposed_per_step_ns + data.per_step.overlapped_per_step_ns == pytest.approx(data.per_step.communication_per_step_ns)
    (bar,) = plot_bytes_by_cause(data).data
    assert list(bar.x) == [gradient_bytes] and list(bar.y) == [cause.label]


def test_the_report_shows_the_section_only_with_sharding_records(sample_trace_path: Path, tmp_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        page = report_html.render_report(prepare_report(trace), plotlyjs="cdn")
    assert '<section id="sharding"' in page and "9 · Sharding" in page and "sharding-causes" in page
    assert "Replicate()" in page and "overlapped with compute" in page
    with tputrace.open(SMALL_TRACE) as trace:
        data = prepare_report(trace)
        page = report_html.render_report(data, plotlyjs="cdn")
    assert not data.sharding.present and '<section id="sharding"' not in page


def test_the_sections_strings_are_escaped(sample_trace_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "hostile.tptrace"
    shutil.copy(sample_trace_path, path)
    with sqlite3.connect(path) as connection:
        assert connection.execute("UPDATE device_meshes SET dim_names = ?, ranks = ?", (HOSTILE, HOSTILE)).rowcount
        assert connection.execute("UPDATE parameter_placements SET placements = ?, wrapper = ?", (HOSTILE, HOSTILE)).rowcount
        assert connection.execute("UPDATE collective_causes SET kind = ?", (HOSTILE,)).rowcount
    connection.close()
    with tputrace.open(path) as trace:
        page = report_html.render_report(prepare_report(trace), plotlyjs="cdn")
    section = page[page.index('<section id="sharding"'):]
    section = section[:section.index("</section>")]
    assert "<script>" not in section and "&lt;script&gt;" in section
    assert "<script>alert" not in page  # the figure's labels too
