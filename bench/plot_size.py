"""HTML report size and generation time for traces of 10^4, 10^5 and 10^6 events (`tputrace plot`).

Targets: the report of a 10^6-event trace is at most 30 MB and is written in at most 30 s. Traces come
from the fast generator in `tests/fixtures/make_traces.py` (96% ops, the rest flushes, executions,
syncs, steps and memory samples) and are cached in `bench/out/`. Each report is written the way
`tputrace plot` writes it (diagnoses included, plotly.js inlined); the table gives the file size, the
wall and CPU time (the machine is shared, so CPU time is the steadier figure), and how many timeline
events were drawn one by one. With `--browser`, each report is also opened in headless Chromium and
the time from navigation until every figure is drawn is given, by the page's own clock (the page
logging no error). Chromium draws WebGL in software (SwiftShader) here, on a shared machine, so a
desktop browser with a GPU is much faster; the figure is for comparing sizes, not a promise.

Run: `python bench/plot_size.py [--sizes 10000 100000 1000000] [--browser]`; writes the
`## HTML report size` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from fixtures.make_traces import build_large_trace  # noqa: E402
from results import write_section  # noqa: E402

from tputrace.store.reader import open_trace  # noqa: E402
from tputrace.viewers.report import report_html  # noqa: E402
from tputrace.viewers.report.data import prepare_report  # noqa: E402

SECTION = "HTML report size"
OUT = ROOT / "bench" / "out"
DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
TARGET_EVENTS = 1_000_000
TARGET_MB = 30.0
TARGET_S = 30.0


@dataclass
class Measurement:
    events: int
    trace_mb: float
    report_mb: float
    wall_s: float
    cpu_s: float
    drawn: int
    timeline_events: int
    browser_s: float | None = None
    browser_ok: bool | None = None


def trace_for(events: int) -> Path:
    """The cached synthetic trace of about `events` rows (built on first use)."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"plot_{events}.tptrace"
    if not path.exists():
        build_large_trace(path, events)
    return path


def measure(events: int, browser: bool) -> Measurement:
    trace_path = trace_for(events)
    output = OUT / f"plot_{events}.html"
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    with open_trace(trace_path) as trace:
        data = prepare_report(trace)
        total_events = sum(trace.counts()[table] for table in ("ops", "executions", "syncs", "steps", "memory", "flushes"))
    output.write_text(report_html.render_report(data), encoding="utf-8")
    wall_s, cpu_s = time.perf_counter() - wall_start, time.process_time() - cpu_start
    result = Measurement(total_events, trace_path.stat().st_size / 1e6, output.stat().st_size / 1e6, wall_s, cpu_s,
                         data.timeline.drawn_events, data.timeline.total_events)
    if browser:
        from browser import load_page

        page = load_page(output, budget_ms=None)  # the real clock
        result.browser_s = (page.render_ms or 0) / 1000
        result.browser_ok = page.done and not page.page_errors and page.figures_rendered == page.figures_expected
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), metavar="N")
    parser.add_argument("--browser", action="store_true", help="also time drawing each report in headless Chromium")
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args(argv)

    rows = []
    verdicts = []
    for events in args.sizes:
        result = measure(events, args.browser)
        browser = ""
        if result.browser_s is not None:
            browser = f" | {result.browser_s:.1f} s{'' if result.browser_ok else ' (errors!)'}"
        rows.append(
            f"| {result.events:,} | {result.trace_mb:.1f} MB | {result.report_mb:.1f} MB | {result.wall_s:.1f} s | "
            f"{result.cpu_s:.1f} s | {result.drawn:,} of {result.timeline_events:,}{browser} |"
        )
        print(rows[-1], flush=True)
        if events >= TARGET_EVENTS:
            size_ok, time_ok = result.report_mb <= TARGET_MB, result.wall_s <= TARGET_S
            verdicts.append(
                f"10^6 events: {result.report_mb:.1f} MB ({'within' if size_ok else 'OVER'} {TARGET_MB:.0f} MB), "
                f"{result.wall_s:.1f} s wall ({'within' if time_ok else 'OVER'} {TARGET_S:.0f} s)."
            )
    header = "| trace events | trace file | report | wall | CPU | timeline events drawn one by one"
    header += " | loaded and drawn in headless Chromium |\n|---|---|---|---|---|---|---|" if args.browser else " |\n|---|---|---|---|---|---|"
    body = (
        "`tputrace plot` on synthetic traces (`tests/fixtures/make_traces.py`, 96% ops); diagnoses included, "
        "plotly.js (about 4.8 MB) inlined. Target for 10^6 events: ≤ 30 MB and ≤ 30 s. The machine is shared "
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the end), so wall time includes waiting "
        "for a CPU; CPU time is the steadier figure."
        + (" Chromium times are from navigation until every figure is drawn, by the page's own clock, with "
           "software WebGL (SwiftShader): a desktop browser with a GPU is much faster." if args.browser else "")
        + "\n\n"
        + header + "\n" + "\n".join(rows)
        + ("\n\n" + " ".join(verdicts) if verdicts else "")
    )
    if not args.no_write:
        write_section(SECTION, body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
