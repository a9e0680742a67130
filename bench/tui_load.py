"""TUI load benchmark: time to first paint and to switching views on traces of 10^6 events and more (headless).

Builds the trace with `tests/fixtures/make_traces.build_large_trace`, then starts fresh processes
that do what `tputrace tui TRACE` does (open and check the trace, start the app) headless at 160x48,
and time, from the moment the process was started:

- first paint: the screen is drawn (with "loading" placeholders where data is still coming);
- overview data: the Overview shows the run, the step chart and the time split;

and then, for each view key, the time from the key press until the view shows its data, in wall time
and in the process's CPU time (the machine is shared: CPU time is what the code costs, wall time also
waits for a core). It also times a key press handled while a view's aggregation over all ops is still
running (the UI must stay responsive). Medians of several cold starts per size go to the `## TUI load`
section of bench/RESULTS.md; `--save` keeps them as JSON, and `--before` (such a file from an earlier
version of the code) adds its figures beside them.

    python bench/tui_load.py [--events N [N ...]] [--runs N] [--save JSON] [--before JSON] [--before-what TEXT] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SIZE = (160, 48)
SWITCHES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Findings", "findings", ("2",)),
    ("Ops (by op)", "ops", ("3",)),
    ("Ops: group by op + shapes", "ops", ("g",)),
    ("Ops: filter `/op_1`", "ops", ("slash", "o", "p", "_", "1", "enter")),
    ("Compiles", "compiles", ("4",)),
    ("Fusions", "fusions", ("5",)),
    ("Collectives", "collectives", ("6",)),
    ("Timeline (one step)", "timeline", ("7",)),
    ("Timeline: whole run", "timeline", ("w",)),
    ("Source", "source", ("8",)),
    ("back to Overview", "overview", ("1",)),
)


# -- the child: one cold start ------------------------------------------------------------------


def child(trace_path: str, started_at: float) -> dict[str, Any]:
    """Run the app headless on `trace_path`; times are seconds since `started_at` (the parent's clock)."""
    from tputrace.store.reader import open_trace
    from tputrace.tui.session import Session

    trace = open_trace(trace_path)
    session = Session.open(trace)
    session.check()
    from textual import events

    from tputrace.tui.app import TraceApp

    class TimedApp(TraceApp):
        """The app, noting when its first frame was written (Textual sends `Ready` right after it)."""

        first_paint_at: float | None = None
        first_paint_cpu_s: float | None = None

        def on_ready(self, event: events.Ready) -> None:
            self.first_paint_at = time.perf_counter()
            self.first_paint_cpu_s = time.process_time()

    app = TimedApp(session)
    result: dict[str, Any] = {"imported_and_checked_s": time.time() - started_at, "checked_cpu_s": time.process_time()}

    def since_start(perf_counter_time: float) -> float:
        return time.time() - (time.perf_counter() - perf_counter_time) - started_at

    async def drive() -> None:
        async with app.run_test(headless=True, size=SIZE) as pilot:
            while app.first_paint_at is None:
                await asyncio.sleep(0.001)
            result["first_paint_s"] = since_start(app.first_paint_at)
            result["first_paint_cpu_s"] = app.first_paint_cpu_s
            overview = app.view("overview")
            while "main" not in overview.loaded_at:
                await asyncio.sleep(0.002)
            result["overview_data_s"] = since_start(overview.loaded_at["main"])
            result["overview_data_cpu_s"] = time.process_time()
            _, result["overview_findings_cpu_s"] = await wait_loaded(pilot, "overview")
            result["overview_findings_s"] = since_start(overview.loaded_at["detail"])
            switches, switches_cpu = {}, {}
            for label, view_id, keys in SWITCHES:
                mounted = app.mounted_view(view_id)
                shown_before = dict(mounted.loaded_at) if mounted is not None else {}
                begin, begin_cpu = time.perf_counter(), time.process_time()
                await pilot.press(*keys)
                seen_at, seen_cpu = await wait_loaded(pilot, view_id)
                # Shown: when the last result the key asked for was put on screen (a view with nothing
                # to fetch: when the bench saw it). Not when the process is next idle: Textual's pilot
                # waits for that, and background work (aggregating ahead) would count.
                loads = [moment for slot, moment in app.mounted_view(view_id).loaded_at.items()
                         if moment >= begin and shown_before.get(slot) != moment]
                switches[label] = (max(loads) if loads else seen_at) - begin
                switches_cpu[label] = seen_cpu - begin_cpu
            result["switch_s"] = switches
            result["switch_cpu_s"] = switches_cpu
            # Responsiveness: how long the UI's event loop goes without running while views
            # aggregate all ops in their workers (a 5 ms interval timer; its longest gap).
            await pilot.press("3")
            await wait_loaded(pilot, "ops")
            app.session.forget()  # what the switches above aggregated and kept is aggregated again
            ticks: list[tuple[float, float]] = []  # (wall, CPU time of the UI thread) at each tick
            timer = app.set_interval(0.005, lambda: ticks.append((time.perf_counter(), time.thread_time())))
            await asyncio.sleep(0.2)
            begin = time.perf_counter()
            for keys in (("g",), ("g",), ("8",), ("7", "w")):
                await pilot.press(*keys)
                await wait_loaded(pilot, app.query_one("#views").active)
            end = time.perf_counter()
            timer.stop()
            gaps = sorted((later[0] - earlier[0], later[1] - earlier[1]) for earlier, later in zip(ticks, ticks[1:]) if later[0] >= begin)
            result["busy_s"] = end - begin
            result["stall_max_s"], result["stall_max_cpu_s"] = gaps[-1] if gaps else (0.0, 0.0)
            result["stall_p95_s"] = gaps[int(len(gaps) * 0.95)][0] if gaps else 0.0

    asyncio.run(drive())
    trace.close()
    return result


async def wait_loaded(pilot: Any, view_id: str, timeout_s: float = 600.0) -> tuple[float, float]:
    """Until `view_id` is on show with no request in flight, and the screen has refreshed; returns the
    `perf_counter` and `process_time` when the bench first saw the view loaded."""
    app = pilot.app
    deadline = time.monotonic() + timeout_s
    seen = (time.perf_counter(), time.process_time())
    while time.monotonic() < deadline:
        view = app.mounted_view(view_id)
        seen = (time.perf_counter(), time.process_time())
        if app.query_one("#views").active == view_id and view is not None and view.is_loaded:
            break
        await asyncio.sleep(0.002)
    await pilot.pause()
    return seen


# -- the parent ---------------------------------------------------------------------------------


def run_child(trace_path: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    started_at = time.time()
    completed = subprocess.run(
        [sys.executable, __file__, "--child", str(trace_path), "--started-at", repr(started_at)],
        capture_output=True, text=True, env=env, check=False,
    )
    if completed.returncode != 0:
        raise SystemExit(f"tui_load child failed:\n{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1000:.0f}"


def summarize(results: list[dict[str, Any]], n_events: int, counts: dict[str, int], build_s: float,
              load_before: float, load_after: float) -> dict[str, Any]:
    """The medians over cold starts of one trace size (what `--save` writes, one entry per size)."""
    def median(key: str) -> float:
        return statistics.median(result[key] for result in results)

    return {
        "events": n_events, "counts": counts, "build_s": build_s, "runs": len(results),
        "load": [load_before, load_after],
        **{key: median(key) for key in ("imported_and_checked_s", "checked_cpu_s", "first_paint_s", "first_paint_cpu_s",
                                        "overview_data_s", "overview_data_cpu_s", "overview_findings_s",
                                        "overview_findings_cpu_s", "busy_s", "stall_max_s",
                                        "stall_max_cpu_s", "stall_p95_s")},
        "switch_s": {label: statistics.median(result["switch_s"][label] for result in results) for label, _, _ in SWITCHES},
        "switch_cpu_s": {label: statistics.median(result["switch_cpu_s"][label] for result in results) for label, _, _ in SWITCHES},
    }


def report(sizes: list[dict[str, Any]], before: dict[int, dict[str, Any]], before_what: str) -> str:
    lines = [
        "Traces from tests/fixtures/make_traces.build_large_trace (96% ops), opened headless at "
        f"{SIZE[0]}x{SIZE[1]} in fresh processes; medians. Times to first paint and to overview data count from "
        "process start (interpreter, imports, opening and checking the trace included). Targets: first paint ≤ 1 s; "
        "each view shows its data ≤ 2 s after its key at 5·10^6 events. "
        f"Machine: {os.cpu_count()} CPUs shared with other work: wall times scale with how busy it is, the CPU time of "
        "the process much less."
        + (f" Before: the same script on the code before {before_what} (its figures saved with `--save`, shown with "
           "`--before`)." if before else ""),
        "",
    ]
    for size in sizes:
        counts, earlier = size["counts"], before.get(size["events"])
        lines += [
            f"### {size['events']:,} events",
            "",
            f"{counts.get('ops', 0):,} ops, {counts.get('flushes', 0):,} flushes, {counts.get('steps', 0):,} steps; built in "
            f"{size['build_s']:.1f} s; {size['runs']} cold start(s); load average {size['load'][0]:.1f} before and "
            f"{size['load'][1]:.1f} after the runs"
            + (f" (before: {earlier['runs']} cold start(s), load average {earlier['load'][0]:.1f} and {earlier['load'][1]:.1f})."
               if earlier else "."),
            "",
            "| moment | ms since start | CPU ms of the process |" + (" before: ms | before: CPU ms |" if earlier else ""),
            "|---|---|---|" + ("---|---|" if earlier else ""),
        ]

        def row(label: str, wall_key: str, cpu_key: str) -> str:
            cells = [ms(size[wall_key]), ms(size[cpu_key])]
            if earlier:
                cells += [ms(earlier.get(wall_key)), ms(earlier.get(cpu_key))]
            return f"| {label} | " + " | ".join(cells) + " |"

        lines += [
            row("imports done, trace opened and checked", "imported_and_checked_s", "checked_cpu_s"),
            row("**first paint**", "first_paint_s", "first_paint_cpu_s"),
            row("Overview data shown (run, step chart, time split)", "overview_data_s", "overview_data_cpu_s"),
            row("Overview top findings shown (the analysis of the whole trace)", "overview_findings_s",
                "overview_findings_cpu_s"),
            "",
            "| key press → view shows its data | ms | CPU ms |" + (" before: ms | before: CPU ms |" if earlier else ""),
            "|---|---|---|" + ("---|---|" if earlier else ""),
        ]
        for label, _, _ in SWITCHES:
            cells = [ms(size["switch_s"][label]), ms(size["switch_cpu_s"][label])]
            if earlier:
                cells += [ms(earlier["switch_s"].get(label)), ms(earlier.get("switch_cpu_s", {}).get(label))]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += [
            "",
            f"Responsiveness: while views aggregate all {counts.get('ops', 0):,} ops in their workers (Ops by source line "
            f"and by module, Source, the whole-run Timeline: {ms(size['busy_s'])} ms of work), the UI's event loop "
            f"(a 5 ms interval timer) goes at most {ms(size['stall_max_s'])} ms without running, of which the UI thread "
            f"itself computed {ms(size['stall_max_cpu_s'])} ms; 95th percentile gap {ms(size['stall_p95_s'])} ms.",
            "",
        ]
    lines += [
        "Switches are timed in this order, each right after the previous one is shown (and the process is idle, or "
        "1 s has passed: Textual's test pilot waits for that). A switch lasts from the key press until the last "
        "result it asked for is on screen; its CPU time is the whole process's from the key press until the bench "
        "sees the view loaded, background work included. Work started ahead counts in them: once the Overview is complete the Ops "
        "view's groups by op are aggregated in the background, the Ops view aggregates the next grouping `g` shows, a "
        "filter narrows groups already aggregated, and Source reuses the ops grouped by source line. Queries run in "
        "worker threads, never on the event loop.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--save", type=Path, metavar="JSON", help="also write the medians per size to this file")
    parser.add_argument("--before", type=Path, metavar="JSON", help="a --save file of an earlier version, shown beside")
    parser.add_argument("--before-what", default="the change measured", metavar="TEXT",
                        help="what the --before code lacked, for the section's text")
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing bench/RESULTS.md")
    parser.add_argument("--child", metavar="TRACE", help=argparse.SUPPRESS)
    parser.add_argument("--started-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.started_at)))
        return 0

    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from fixtures.make_traces import build_large_trace

    import tputrace

    sizes = []
    for n_events in args.events:
        with tempfile.TemporaryDirectory(prefix="tputrace-tui-bench-") as directory:
            trace_path = Path(directory) / "large.tptrace"
            begin = time.perf_counter()
            build_large_trace(trace_path, n_events)
            build_s = time.perf_counter() - begin
            with tputrace.open(trace_path) as trace:
                counts = trace.counts()
            run_child(trace_path)  # warm the OS page cache: the first open of a fresh file is not what is measured
            load_before = os.getloadavg()[0]
            results = [run_child(trace_path) for _ in range(args.runs)]
            load_after = os.getloadavg()[0]
        sizes.append(summarize(results, n_events, counts, build_s, load_before, load_after))
        print(f"{n_events:,} events: " + json.dumps(sizes[-1]["switch_s"]), file=sys.stderr, flush=True)
    if args.save:
        args.save.write_text(json.dumps(sizes, indent=1))
    before = {entry["events"]: entry for entry in json.loads(args.before.read_text())} if args.before else {}
    body = report(sizes, before, args.before_what)
    print(body)
    if not args.no_write:
        sys.path.insert(0, str(REPO_ROOT / "bench"))
        from results import write_section

        write_section("TUI load", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
