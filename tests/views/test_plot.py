"""`tputrace plot`: the data behind each section, the HTML page, escaping of hostile trace text, the
CLI, the import contract, and the page in headless Chromium (skipped with a reason where there is none)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tputrace
from browser import PageResult, find_chromium, load_page
from fixtures.make_traces import MS, START_UNIX_NS, build_sample_trace, build_trace_with_a_flush_inside_an_op
from tputrace.analysis.chips import chip
from tputrace.cli.main import main
from tputrace.store import TraceWriter
from tputrace.derived.op_ranking import rank_ops
from tputrace.derived.timeline import prepare_timeline
from tputrace.viewers.report import analysis_data, chip_data, compile_data, data as report_data, figures, report_html, time_data

REPO_ROOT = Path(__file__).resolve().parents[2]
# Where screenshots go: $TPUTRACE_SCREENSHOT_DIR (e.g. for CI artifacts), else the test's tmp dir.
SCREENSHOT_DIR_ENV = "TPUTRACE_SCREENSHOT_DIR"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Text planted in every string column of the hostile trace. If any of it became markup, the page would
# gain an element with id "pwned" or a changed title; the test checks the DOM for both.
HOSTILE_OP = "aten.<script>document.title='PWNED'</script>.default"
HOSTILE_MODULE = "Net.\"><img id=pwned src=x onerror=\"document.title='PWNED'\">.layer"
HOSTILE_FILE = "/tmp/'quote\"/<b id=pwned>bold</b>&amp;.py"
HOSTILE_TEXT = "</script><svg id=pwned onload=alert(1)>"
HOSTILE_SHAPES = "f32[128,256], f32[256,100]<i id=pwned>"


# -- fixtures ------------------------------------------------------------------------------------------


def _hostile_trace(path: Path) -> Path:
    """A small trace whose op names, shapes, module paths, file names and texts are markup and quotes."""
    with TraceWriter(path, created_unix_ns=START_UNIX_NS) as writer:
        writer.set_run(world_size=1, script=f"/x/{HOSTILE_TEXT}.py", argv=[HOSTILE_TEXT, "--x=\"'"], platform="cpu",
                       eager_mode=HOSTILE_TEXT, host=HOSTILE_TEXT, start_unix_ns=START_UNIX_NS)
        op = writer.intern(HOSTILE_OP)
        mm = writer.intern("aten.mm.default")
        shapes = writer.intern(HOSTILE_SHAPES)
        plain_shapes = writer.intern("f32[100,200], f32[200,300]")
        module = writer.intern(HOSTILE_MODULE)
        frame = writer.frame(HOSTILE_FILE, 7, HOSTILE_TEXT)
        text = writer.intern(HOSTILE_TEXT)
        program = writer.next_id("programs")
        writer.append("programs", (program, 0, "fused", text, text, shapes, 2, 1e6, 4e5, 10))
        clock = 0
        for step in (1, 2):
            start = clock
            for seq in range(5):
                clock += 10_000
                writer.append("ops", (step * 10 + seq, 0, op if seq % 2 else mm, shapes if seq % 2 else plain_shapes,
                                      shapes, 0, clock, 5_000, frame, module, step, program, None))
            compile_id = writer.next_id("compiles")
            writer.append("compiles", (compile_id, 0, program, "fused", text, shapes, 0, clock, 50_000, frame, step,
                                       "recompile" if step == 2 else "first", text, json.dumps({"x": HOSTILE_TEXT})))
            writer.append("executions", (0, program, 0, clock + 60_000, 20_000, step, None))
            writer.append("syncs", (0, HOSTILE_TEXT, frame, 0, clock + 60_000, 30_000, 5, step, None))
            writer.append("fallbacks", (0, op, shapes, 0, clock + 100_000, 7_000, frame, step))
            writer.append("transfers", (0, "h2d", 4096, -1, 0, clock + 110_000, 1_000, frame, step, None))
            writer.append("annotations", (0, text, "annotate", start, 100_000, frame, step))
            writer.append("memory", (0, 0, clock + 120_000, 1_000_000 * step, 2_000_000))
            writer.append("graph_breaks", (0, text, frame, clock, step))
            clock += 200_000
            writer.append("steps", (0, step, start, clock, HOSTILE_TEXT))
        writer.update_run(end_ns=clock + 1_000, exit_status=0, error=HOSTILE_TEXT)
    return path


@pytest.fixture(scope="module")
def hostile_trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _hostile_trace(tmp_path_factory.mktemp("hostile") / "hostile.tptrace")


@pytest.fixture(scope="module")
def sample_report(sample_trace_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("reports") / "sample.html"
    report_html.write_report(sample_trace_path, output)
    return output


def _screenshot_path(tmp_path: Path, name: str) -> Path:
    directory = os.environ.get(SCREENSHOT_DIR_ENV)
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        return Path(directory) / f"{name}.png"
    return tmp_path / f"{name}.png"


requires_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium not found: install Debian's chromium (apt-get install -y chromium chromium-driver) "
    "or set TPUTRACE_CHROMIUM to a Chromium/Chrome executable",
)


def _check_page(page: PageResult) -> None:
    """Every figure drawn and no error logged by the page."""
    assert page.done, "the page's render script did not finish"
    assert page.page_errors == "", page.page_errors
    assert page.figures_expected > 0
    assert page.unrendered_figures == []
    assert page.figures_rendered == page.figures_expected == len(page.figure_ids)
    assert page.dom.count('class="main-svg"') >= page.figures_expected  # plotly drew into every figure div


def _check_screenshot(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 20_000, "the screenshot is suspiciously small (a blank page?)"


# -- data (prepare_*) ----------------------------------------------------------------------------------


def test_timeline_lanes_per_rank_host_and_chip(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        timeline = prepare_timeline(trace)
        counts = trace.counts()
    names = [lane.name for lane in timeline.lanes]
    for rank in (0, 1):
        for lane in ("steps", "host dispatch", "host compiles", "host syncs", "host fallbacks", "tpu:0 programs",
                     "tpu:0 transfers", "collectives"):
            assert f"rank {rank} · {lane}" in names
    by_kind: dict[str, int] = {}
    for lane in timeline.lanes:
        by_kind[lane.kind] = by_kind.get(lane.kind, 0) + lane.events
    assert by_kind["dispatch"] == counts["ops"]
    assert by_kind["program"] == counts["executions"]
    assert by_kind["compile"] == counts["compiles"]
    assert timeline.drawn_events == timeline.total_events  # small: nothing decimated
    assert not timeline.bins
    dispatch = next(events for events in timeline.events if events.kind == "dispatch")
    detail = dict(zip(dispatch.fields, dispatch.details[0]))
    assert detail["op"].startswith("aten.") and detail["inputs"] and detail["source"].file.endswith(".py")


def test_timeline_decimates_busy_lanes_within_the_budget(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        timeline = prepare_timeline(trace, event_budget=200, bins_per_lane=20)
        (longest_op,) = trace.sql("SELECT MAX(dur_ns) FROM ops WHERE rank = 0")[0]
    assert timeline.drawn_events <= 200 < timeline.total_events
    dispatch_lanes = [(index, lane) for index, lane in enumerate(timeline.lanes) if lane.kind == "dispatch"]
    assert all(timeline.decimated(index) for index, _ in dispatch_lanes)
    for index, lane in dispatch_lanes:
        bins = next(item for item in timeline.bins if item.lane == index)
        assert sum(bins.counts) == lane.events and len(bins.counts) <= 20
    rank0 = next(events for events in timeline.events if events.lane == dispatch_lanes[0][0])
    assert max(rank0.durs_ns) == longest_op  # the longest events are the ones kept
    assert rank0.starts_ns == sorted(rank0.starts_ns)


def test_step_rows_and_dominant_category(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        steps = time_data.prepare_steps(trace)
        step_times = {(step.rank, step.step): step for step in trace.step_times()}
    assert len(steps.steps) == len(step_times) == 12
    first = next(row for row in steps.steps if row.rank == 0 and row.step == 1)
    assert first.dur_ns == step_times[(0, 1)].dur_ns
    assert first.compile_ns == step_times[(0, 1)].compile_ns
    assert first.dominant == "compile"  # step 1 compiles the step's programs
    quiet = next(row for row in steps.steps if row.rank == 0 and row.step == 2)
    assert quiet.compile_ns == 0 and quiet.dominant != "compile"


def test_where_tree_adds_up(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        where = time_data.prepare_where(trace, leaves=10)
        (op_ns,) = trace.sql("SELECT SUM(dur_ns) FROM ops")[0]
    nodes = {node.id: node for node in where.tree}
    assert where.tree_total_ns == op_ns
    assert sum(node.value_ns for node in where.tree if not node.parent) == op_ns
    for node in where.tree:  # branchvalues="total": a parent is exactly the sum of its children
        children = [child.value_ns for child in where.tree if child.parent == node.id]
        if children:
            assert sum(children) == node.value_ns, node.label
    assert where.leaves_merged > 0 and any(node.label == "(other ops)" for node in nodes.values())
    assert where.source_lines[0].total_ns >= where.source_lines[-1].total_ns


def test_where_tree_leaves_out_flushes_and_compiles_inside_op_calls(tmp_path: Path) -> None:
    with tputrace.open(build_trace_with_a_flush_inside_an_op(tmp_path / "nested.tptrace")) as trace:
        where = time_data.prepare_where(trace)
        ranking = rank_ops(trace, 0)
    leaves = {node.label: node.value_ns for node in where.tree if node.parent}
    assert leaves == {op.op: op.self_dispatch_ns for op in ranking.ops}
    assert leaves["aten._foreach_mul_.Scalar"] == 30 * MS and where.tree_total_ns == 70 * MS
    assert "host dispatch excl. flushes/compiles" in figures.plot_where_treemap(where).data[0].customdata[0]


def test_recompilations_show_varying_dims(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        analysis = analysis_data.prepare_analysis(trace)
        data = compile_data.prepare_recompilations(trace, analysis)
    assert data.total == len(data.points) == 9
    assert "train.py:35" in data.sites
    dim = next(item for item in data.varying if item.site == "train.py:35")
    assert dim.label == "input 0 dim 1" and dim.values == [128, 192]


def test_shapes_padding_follows_the_target(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        v5e = chip_data.prepare_shapes(trace, chip("v5e"))
        v6e = chip_data.prepare_shapes(trace, chip("v6e"))
    # K = 192 (the recompiled sequence length in attention) pads to 256 on both MXUs: a quarter is padding.
    attention = [shape for shape in v6e.shapes if shape.product.k == 192 and "attention" in shape.op]
    assert attention and all(shape.wasted_share == pytest.approx(0.25) for shape in attention)
    # K = 128 fills v5e's 128-wide MXU, but is half padding on v6e's 256-wide one.
    half = [shape for shape in v6e.shapes if shape.product.k == 128 and shape.product.n == 256]
    assert half and all(shape.wasted_share == pytest.approx(0.5) for shape in half)
    assert all(shape.wasted_share == 0 for shape in v5e.shapes if shape.product.k == 128 and shape.product.n == 256)


def test_roofline_measured_and_estimated(sample_trace_path: Path) -> None:
    with tputrace.open(sample_trace_path) as trace:
        roofline = chip_data.prepare_roofline(trace, chip("v6e"))
    assert roofline.programs
    for point in roofline.programs:
        assert point.achieved_flops == pytest.approx(point.flops / (point.mean_ns / 1e9))
        ceiling = min(roofline.target.peak_flops(point.dtype), point.intensity * roofline.target.hbm_bandwidth)
        assert roofline.estimated_flops(point) == pytest.approx(ceiling)


def test_collectives_and_memory(sample_trace_path: Path) -> None:
    target = chip(None)
    with tputrace.open(sample_trace_path) as trace:
        collectives = chip_data.prepare_collectives(trace, target)
        memory = chip_data.prepare_memory(trace, target)
        (max_peak,) = trace.sql("SELECT MAX(peak_bytes) FROM memory")[0]
        (waits,) = trace.sql("SELECT SUM(wait_ns) FROM collectives")[0]
    assert collectives.present and collectives.ranks == [0, 1]
    assert sum(sum(row) for row in collectives.wait_ns) == waits
    assert len(memory.series) == 4  # two chips on two ranks
    assert max(peak.peak_bytes for peak in memory.peaks) == max_peak


def test_every_analyzer_has_a_section() -> None:
    from tputrace.analysis import ANALYZERS

    for name in ANALYZERS:
        assert analysis_data.section_of(name) in analysis_data.SECTIONS, name
    assert analysis_data.section_of("recompiles") == "recompilations"
    assert analysis_data.section_of("padding") == analysis_data.section_of("precision") == "shapes"
    assert analysis_data.section_of("some_new_straggler_check") == "collectives"
    assert analysis_data.section_of("something else") == "where"


def test_timeline_figure_is_webgl_with_a_hover_point_per_event(sample_trace_path: Path) -> None:
    from tputrace.viewers.report.figures import plot_timeline

    with tputrace.open(sample_trace_path) as trace:
        timeline = prepare_timeline(trace, event_budget=200, bins_per_lane=20)
    figure = plot_timeline(timeline)
    assert {trace.type for trace in figure.data} == {"scattergl"}
    hover_points = sum(len(trace.x) for trace in figure.data if trace.mode == "markers" and trace.opacity is None
                       and trace.marker.opacity is None)
    assert hover_points == timeline.drawn_events
    ticks = list(figure.layout.yaxis.ticktext)
    assert len(ticks) == len(timeline.lanes) and any(tick.endswith("⋯") for tick in ticks)


def test_comparison_lists_the_expensive_ops_of_both(sample_trace_path: Path, tmp_path: Path) -> None:
    other = build_sample_trace(tmp_path / "fewer.tptrace", steps=3)
    with tputrace.open(sample_trace_path) as before, tputrace.open(other) as after:
        data = report_data.prepare_comparison(before, after)
    assert len(data.before.step_durations_ns) == 6 and len(data.after.step_durations_ns) == 3
    assert "aten.addmm.default" in data.ops
    assert data.before.compiles >= data.after.compiles


def test_comparison_steps_are_the_summarys(tmp_path: Path) -> None:
    """The comparison counts the loop's steps (a trailing `end` step left out) and gives the median steady step,
    as the summary and the report do, not a median pulled up by the warm-up step."""
    from fixtures.make_traces import START_UNIX_NS
    from tputrace.analysis import analyze_path
    from tputrace.analysis.render import render_text
    from tputrace.store.writer import TraceWriter
    from tputrace.summary import summarize

    path = tmp_path / "warm_up.tptrace"
    with TraceWriter(path, created_unix_ns=START_UNIX_NS) as writer:
        writer.set_run(world_size=1, script="/w/train.py", argv=[], cwd="/w", host="h", platform="tpu", chips=1,
                       eager_mode="DEFER_AND_FUSE", start_unix_ns=START_UNIX_NS)
        clock = 0
        for step, (duration_ms, source) in enumerate([(900, "optimizer"), (10, "optimizer"), (20, "optimizer"),
                                                      (40, "optimizer"), (50, "optimizer"), (700, "end")]):
            writer.append("steps", (0, step, clock, clock + duration_ms * 1_000_000, source))
            clock += duration_ms * 1_000_000
        writer.update_run(end_ns=clock, exit_status=0)
    with tputrace.open(path) as trace:
        side = report_data.summarize_for_compare(trace, "before")
        summary = summarize(trace)
    assert len(side.step_durations_ns) == summary.step_count == 5
    assert side.median_step_ns == 30_000_000 and "median step 30.0 ms" in render_text(analyze_path(path))


def test_comparison_says_a_speed_up_as_times_less(sample_trace_path: Path, tmp_path: Path) -> None:
    from tputrace.viewers.report.report_html import render_comparison

    other = build_sample_trace(tmp_path / "fewer.tptrace", steps=3)
    with tputrace.open(sample_trace_path) as before, tputrace.open(other) as after:
        page = render_comparison(report_data.prepare_comparison(before, after), plotlyjs="cdn")
    assert "<th>change</th>" in page.replace(' class="num"', "")
    assert "2.00× less" in page and "0.00×" not in page


# -- the page ------------------------------------------------------------------------------------------


def test_report_is_self_contained(sample_report: Path) -> None:
    text = sample_report.read_text(encoding="utf-8")
    assert "<script src=" not in text  # plotly.js inline: the page opens offline
    assert "Plotly" in text and len(text) > 3_000_000
    for key in analysis_data.SECTIONS:
        assert f'<section id="{key}"' in text
    figures = re.findall(r'<div class="tp-figure" id="([^"]+)"', text)
    assert len(figures) >= 9 and len(set(figures)) == len(figures)
    for element_id in figures:
        match = re.search(rf'<script type="application/json" id="{element_id}-data">(.*?)</script>', text, re.S)
        assert match is not None
        figure = json.loads(match.group(1))
        assert figure["data"] or figure["layout"].get("annotations")
    assert "Findings, most expensive first" in text or "No finding" in text or "found nothing" in text


def test_empty_and_killed_traces_still_give_a_page(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tptrace"
    with TraceWriter(empty, created_unix_ns=START_UNIX_NS):
        pass
    killed = build_sample_trace(tmp_path / "killed.tptrace", steps=2, finished=False)
    for trace_path in (empty, killed):
        output = trace_path.with_suffix(".html")
        report_html.write_report(trace_path, output)
        text = output.read_text(encoding="utf-8")
        assert all(f'<section id="{key}"' in text for key in analysis_data.SECTIONS)
    assert "no timed events in this trace" in empty.with_suffix(".html").read_text(encoding="utf-8")
    assert "running or killed (no end record)" in killed.with_suffix(".html").read_text(encoding="utf-8")


def test_plotlyjs_from_the_cdn(sample_trace_path: Path, tmp_path: Path) -> None:
    output = tmp_path / "cdn.html"
    assert main(["plot", str(sample_trace_path), "-o", str(output), "--plotlyjs", "cdn"]) == 0
    text = output.read_text(encoding="utf-8")
    assert re.search(r'<script src="https://cdn\.plot\.ly/plotly-[0-9.]+\.min\.js"', text)
    assert output.stat().st_size < 1_500_000


def test_hostile_text_is_escaped_in_the_file(hostile_trace_path: Path, tmp_path: Path) -> None:
    output = tmp_path / "hostile.html"
    report_html.write_report(hostile_trace_path, output)
    text = output.read_text(encoding="utf-8")
    for needle in ("<script>document.title", "<img id=pwned", "<b id=pwned", "<svg id=pwned", "<i id=pwned",
                   "</script><svg"):
        assert needle not in text, needle
    assert "&lt;script&gt;document.title=&#x27;PWNED&#x27;&lt;/script&gt;" in text  # shown, as text
    # Every figure's JSON block parses back to the same strings, so hovers and labels show the text as is.
    figure_json = re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', text, re.S)
    assert figure_json and all(json.loads(block) for block in figure_json)
    assert any("aten.&lt;script&gt;" in block.replace("\\u0026", "&") for block in figure_json)


def test_cli_plot_writes_next_to_the_trace_by_default(sample_trace_path: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    trace_copy = tmp_path / "run.tptrace"
    trace_copy.write_bytes(sample_trace_path.read_bytes())
    assert main(["plot", str(trace_copy)]) == 0
    assert (tmp_path / "run.html").exists()
    assert "wrote" in capsys.readouterr().err

    compare = tmp_path / "cmp.html"
    assert main(["plot", "--compare", str(sample_trace_path), str(trace_copy), "-o", str(compare)]) == 0
    text = compare.read_text(encoding="utf-8")
    assert 'id="fig-compare-steps"' in text and 'id="fig-compare-ops"' in text and 'id="fig-compare-compiles"' in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plot"], "give a trace to plot"),
        (["plot", "A.tptrace", "--compare", "B", "C"], "not both"),
        (["plot", "{trace}", "-o", "{tmp}/no/such/dir/x.html"], "no directory"),
        (["plot", "{trace}", "-o", "{tmp}"], "is a directory"),
        (["plot", "{tmp}/missing.tptrace"], "no such trace file"),
        (["plot", "{trace}", "--target", "v99"], "unknown target chip"),
    ],
)
def test_cli_plot_errors_are_one_line(argv: list[str], message: str, sample_trace_path: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    filled = [part.format(trace=sample_trace_path, tmp=tmp_path) for part in argv]
    assert main(filled) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_plotting_never_imports_torch_or_jax(sample_trace_path: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from tputrace.cli.main import main\n"
        f"assert main(['plot', {str(sample_trace_path)!r}, '-o', {str(tmp_path / 'x.html')!r}]) == 0\n"
        "loaded = sorted(name for name in ('torch', 'jax', 'jaxlib') if name in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr


# -- in a browser --------------------------------------------------------------------------------------


@requires_chromium
def test_sample_report_renders_in_chromium(sample_report: Path, tmp_path: Path) -> None:
    """Two ranks, collectives, recompiles, fallbacks: every figure drawn, no page error, a screenshot."""
    screenshot = _screenshot_path(tmp_path, "report-sample")
    page = load_page(sample_report, screenshot=screenshot, window=(1400, 2400))
    _check_page(page)
    _check_screenshot(screenshot)


@requires_chromium
def test_hostile_text_stays_inert_in_the_dom(hostile_trace_path: Path, tmp_path: Path) -> None:
    output = tmp_path / "hostile.html"
    report_html.write_report(hostile_trace_path, output)
    page = load_page(output)
    _check_page(page)
    dom = page.dom
    assert "PWNED" not in (re.search(r"<title>(.*?)</title>", dom, re.S) or [None, ""])[1]
    assert 'id="pwned"' not in dom and "id=pwned>" not in dom.replace("&gt;", "")  # no element was created
    scripts = re.findall(r"<script\b", dom)
    expected = output.read_text(encoding="utf-8").count("<script")
    assert len(scripts) == expected  # the trace added no script element
    # The text itself is there, as text: in the header, tables and plotly's SVG labels.
    assert "&lt;script&gt;document.title='PWNED'&lt;/script&gt;" in dom
    assert "&lt;/script&gt;&lt;svg id=pwned onload=alert(1)&gt;" in dom


def _record(script: Path, trace_path: Path, args: list[str]) -> Path:
    pytest.importorskip("torch", reason="recording an example needs torch (pip install -e .[backend])")
    pytest.importorskip("jax", reason="recording an example needs jax (pip install -e .[backend])")
    result = subprocess.run(
        [sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace_path), str(script), *args],
        capture_output=True, text=True, timeout=900, cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return trace_path


def _problem_example() -> tuple[Path, list[str]]:
    script = REPO_ROOT / "examples" / "problems" / "recompile_storm.py"
    if not script.exists():
        pytest.skip("examples/problems/recompile_storm.py is not in this checkout")
    return script, ["--steps", "6"]


@requires_chromium
@pytest.mark.parametrize("example", ["gpt_train", "recompile_storm"])
def test_example_reports_render_in_chromium(example: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A clean example and a planted problem, recorded here, reported and opened in Chromium."""
    directory = tmp_path
    if example == "gpt_train":
        trace_path = request.getfixturevalue("gpt_train_trace")
    else:
        script, args = _problem_example()
        trace_path = _record(script, directory / f"{example}.tptrace", args)
    output = directory / f"{example}.html"
    assert main(["plot", str(trace_path), "-o", str(output)]) == 0
    screenshot = _screenshot_path(tmp_path, f"report-{example}")
    page = load_page(output, screenshot=screenshot, window=(1400, 2400))
    _check_page(page)
    _check_screenshot(screenshot)
    if example == "recompile_storm":
        assert "Recompilation storm" in page.dom  # the finding sits beside the recompilations figure
        assert "saved," in page.dom  # the bucket advisor's proposal, in the table


def test_compare_page_leads_with_what_changed_escaped(tmp_path: Path) -> None:
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    compare = tmp_path / "cmp.html"
    assert main(["plot", "--compare", str(fixtures / "tui_small.tptrace"), str(fixtures / "tui_markup.tptrace"),
                 "-o", str(compare)]) == 0
    text = compare.read_text(encoding="utf-8")
    changed = text[text.index('<section id="changed"'):text.index('<section id="summary"')]
    assert "<strong>regression: new recompile at " in changed
    assert "train[bold].py:7" in changed
    assert "new</td>" in changed and "fixed</td>" in changed
    assert "gone</td>" in changed and "program</td>" in changed
    assert text.index('href="#changed"') < text.index('href="#summary"')
