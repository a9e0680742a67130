"""The planted problems of `examples/problems/`: each script, run under `tputrace run`, gets a report
whose top finding names its problem at the line marked `# tputrace: problem`; with `--fixed` that
finding is gone. The clean examples get no warning-level finding.

Each run is a subprocess (`python -m tputrace.cli.main run ...`), like a user's; the analysis runs
here (it imports neither torch nor jax).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tputrace.analysis import Report, analyze_path
from tputrace.store import open_trace
from tputrace.summary import render_text, summarize
from tputrace.tui.queries import compile_sites

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "examples" / "problems"
MARKER = "# tputrace: problem"

# script -> (the analyzer whose finding must come first, extra arguments that keep the run short)
EXPECTED: dict[str, tuple[str, list[str]]] = {
    "recompile_storm": ("recompiles", ["--steps", "6"]),
    "host_sync": ("syncs", ["--steps", "6"]),
    "tile_padding": ("padding", ["--steps", "6"]),
    "cpu_fallback": ("fallbacks", ["--steps", "6"]),
    "fragmented_fusion": ("fusion", ["--steps", "6"]),
    "host_copies": ("transfers", ["--steps", "6"]),
    "fp32_matmul": ("precision", ["--steps", "4"]),
    "graph_break": ("graph_breaks", ["--steps", "6"]),
}
# Enough steady steps that one copy or dispatch slowed by a loaded host does not make a share of the steps.
CLEAN = {"quickstart": ["--steps", "4"], "gpt_train": ["--steps", "5"], "cnn_train": ["--steps", "3"]}


def record(script: Path, trace: Path, args: list[str], run_options: tuple[str, ...] = ()) -> Report:
    """Run `script` under `tputrace run [run_options]` in a subprocess and analyse its trace."""
    command = [sys.executable, "-m", "tputrace.cli.main", "run", *run_options, "-o", str(trace), str(script), *args]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "top findings" in completed.stderr or "no findings" in completed.stderr  # `run` ends with them
    return analyze_path(trace)


def marked_line(script: Path) -> int:
    lines = [number for number, text in enumerate(script.read_text().splitlines(), 1) if MARKER in text]
    assert len(lines) == 1, f"{script.name} must mark exactly one line with {MARKER!r}"
    return lines[0]


def xfail_on_backend_fallbacks(report: Report, planted: str | None) -> None:
    """A CPU fallback of an op the script did not plant is a gap in the tpu backend, not in the analysis."""
    foreign = sorted({
        finding.title.split(": ", 1)[1].split(" ", 1)[0]
        for finding in report.findings
        if finding.analyzer == "fallbacks" and finding.severity != "info" and planted != "fallbacks"
    })
    if foreign:
        pytest.xfail(f"the tpu backend has no lowering for {', '.join(foreign)} (a CPU fallback dominates the run)")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_problem_is_the_top_finding(name: str, tmp_path: Path) -> None:
    analyzer, args = EXPECTED[name]
    script = PROBLEMS / f"{name}.py"
    report = record(script, tmp_path / f"{name}.tptrace", args)
    assert report.findings, f"no findings for {name}"
    top = report.findings[0]
    if top.analyzer != analyzer:
        xfail_on_backend_fallbacks(report, analyzer)
    assert top.analyzer == analyzer, [f"{f.analyzer}: {f.title}" for f in report.findings[:5]]
    assert top.file == str(script) and top.line == marked_line(script), (top.file, top.line, top.title)
    assert top.cost_total_ns > 0


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixed_problem_has_no_such_finding(name: str, tmp_path: Path) -> None:
    analyzer, args = EXPECTED[name]
    report = record(PROBLEMS / f"{name}.py", tmp_path / f"{name}-fixed.tptrace", [*args, "--fixed"])
    remaining = [finding.title for finding in report.findings if finding.analyzer == analyzer]
    assert remaining == []


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_clean_examples_have_no_warnings(name: str, tmp_path: Path) -> None:
    report = record(ROOT / "examples" / f"{name}.py", tmp_path / f"{name}.tptrace", CLEAN[name])
    warnings = [f"{finding.analyzer}: {finding.title}" for finding in report.findings if finding.severity != "info"]
    if warnings:
        xfail_on_backend_fallbacks(report, None)
    assert warnings == []


@pytest.fixture(scope="module")
def compile_storm_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `torch.compile` run whose Dynamo frame compiles nest AOTAutograd and XLA compiles."""
    trace_path = tmp_path_factory.mktemp("compile_storm") / "compile_recompile_storm.tptrace"
    record(PROBLEMS / "compile_recompile_storm.py", trace_path, ["--steps", "3"])
    return trace_path


def covered(intervals: list[tuple[int, int]]) -> int:
    """The ns that sorted (start, end) intervals cover, each instant once."""
    covered_ns, span_end = 0, 0
    for start_ns, end_ns in intervals:
        covered_ns += max(0, end_ns - max(start_ns, span_end))
        span_end = max(span_end, end_ns)
    return covered_ns


def test_nested_compiles_count_each_instant_once(compile_storm_trace: Path) -> None:
    """The compile time in the time split, compile stats and report is wall time spent compiling: the
    union of the compile records' intervals, not their sum, so it never exceeds the run."""
    with open_trace(compile_storm_trace) as trace:
        intervals = sorted(trace.sql("SELECT start_ns, start_ns + dur_ns FROM compiles WHERE rank = 0"))
        kinds = {kind for (kind,) in trace.sql("SELECT DISTINCT kind FROM compiles")}
        covered_ns = covered(intervals)
        summed_ns = sum(end_ns - start_ns for start_ns, end_ns in intervals)
        sites = compile_sites(trace, 0)
        # backward()'s compiles on autograd's thread and its flush on the main thread are one call's
        assert [site.call for site in sites if site.source is not None and site.source.file.endswith("common.py")
                and site.source.line == 44] == [None], sites
        for site in sites:  # the TUI's Compiles view: per call site, nested compiles once
            frame_ids = [frame_id for (frame_id,) in trace.sql("SELECT DISTINCT frame_id FROM compiles WHERE rank = 0")
                         if trace.frame(frame_id) == site.source
                         and (site.call is None or trace.frame(frame_id).call_key == site.source.call_key)]
            site_intervals = [interval for frame_id in frame_ids for interval in trace.sql(
                "SELECT start_ns, start_ns + dur_ns FROM compiles WHERE rank = 0 AND frame_id = ?", (frame_id,))]
            assert site.total_ns == covered(sorted(site_intervals)), site
        split, stats = trace.time_split(rank=0), trace.compile_stats(rank=0)
        step_compile_ns = sum(step.compile_ns for step in trace.step_times(rank=0))
        summary_text = render_text(summarize(trace))
    assert {"dynamo_frame", "aot", "xla"} <= kinds
    assert summed_ns > covered_ns  # the records do nest
    assert split.compile_ns == stats.total_ns == covered_ns
    assert covered_ns < split.wall_ns
    assert step_compile_ns <= covered_ns  # compiles after the last step record belong to no step
    assert stats.recompile_ns <= stats.total_ns
    share = re.search(r"compile\s+\S+ \S+\s+([\d.]+)%", summary_text)
    assert share is not None and float(share.group(1)) < 100.0, summary_text
    report = analyze_path(compile_storm_trace)
    for finding in report.findings:
        for match in re.finditer(r"(\d+)% of the run", finding.title + finding.explanation):
            assert int(match.group(1)) <= 100, finding.title


# Findings whose counts per step read as decimals ("in 0.5 copies", "0.286 per step") or whose cost is nothing.
FRACTIONAL_COUNT = re.compile(r"\b\d*\.\d+ (copies|copy|per step)|\b0 per step|\b0 ns stalled")


@pytest.mark.parametrize("script", ["problems/straggler.py", "ddp_train.py"])
def test_two_rank_runs_list_no_zero_cost_findings(script: str, tmp_path: Path) -> None:
    """On two ranks, syncs made only in the warm-up step cost the steady steps nothing and are not listed,
    and a copy or sync made in some steps reads as "2 copies every 3 steps", not "0.667 copies"."""
    report = record(ROOT / "examples" / script, tmp_path / "run.tptrace", ["--steps", "4"], ("--nproc", "2"))
    listed = [finding for finding in report.findings if finding.analyzer in ("syncs", "transfers")]
    assert listed, [finding.title for finding in report.findings]
    zero_cost = [finding.title for finding in listed if finding.cost_total_ns < 1_000]
    fractional = [text for finding in listed for text in (finding.title, *(evidence.text for evidence in finding.evidence))
                  if FRACTIONAL_COUNT.search(text)]
    assert (zero_cost, fractional) == ([], [])
