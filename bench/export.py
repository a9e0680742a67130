"""Export benchmark: `tputrace export` of a 1,000,000-event trace to XProf files and to Perfetto JSON.

Builds the trace with `tests/fixtures/make_traces.build_large_trace` (96% ops, in DeferAndFuse
flushes of 50, with executions, syncs, steps and memory samples), then runs the real command in
fresh processes, one format at a time, and times each from process start to exit (imports, reading
the trace, building, writing). It reports wall time and the process's CPU time: the machine is
shared, so wall time also shows how busy it was (the load average is reported beside it).
Target: each export ≤ 20 s. Results go to the `## Export` section of bench/RESULTS.md.

    python bench/export.py [--events N] [--runs N] [--trace PATH] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 20.0
FORMATS = {
    "XProf (`--tensorboard`)": lambda out: ["--tensorboard", str(out / "logdir")],
    "Perfetto (`--perfetto`, gzip)": lambda out: ["--perfetto", str(out / "trace.json.gz")],
}


@dataclass(frozen=True)
class Measurement:
    wall_s: float
    cpu_s: float
    output_bytes: int
    load_average: float


def build_trace(path: Path, events: int) -> Path:
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from fixtures.make_traces import build_large_trace

    return build_large_trace(path, events)


def measure(trace_path: Path, arguments: list[str], out: Path) -> Measurement:
    """One `tputrace export` in a fresh process: its wall and CPU time and what it wrote."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "tputrace.cli.main", "export", str(trace_path), *arguments],
        capture_output=True, text=True, cwd=REPO_ROOT,
    )
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"export failed:\n{result.stderr[-3000:]}")
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    size = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    return Measurement(wall_s, cpu_s, size, os.getloadavg()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the generated trace")
    parser.add_argument("--runs", type=int, default=1, help="exports per format (the median is reported)")
    parser.add_argument("--trace", type=Path, help="export this trace instead of generating one")
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="tputrace-export-bench-") as scratch:
        scratch_dir = Path(scratch)
        if args.trace:
            trace_path = args.trace
        else:
            print(f"building a {args.events:,}-event trace ...", file=sys.stderr)
            trace_path = build_trace(scratch_dir / "large.tptrace", args.events)
        import tputrace

        with tputrace.open(trace_path) as trace:
            counts = trace.counts()
        events = sum(count for table, count in counts.items() if table not in ("strings", "frames", "runs", "programs"))
        rows = []
        for label, arguments in FORMATS.items():
            measurements = []
            for run in range(args.runs):
                out = scratch_dir / f"out-{len(rows)}-{run}"
                out.mkdir()
                measurements.append(measure(trace_path, arguments(out), out))
                print(f"{label}: {measurements[-1]}", file=sys.stderr)
            rows.append((label, measurements))

    lines = [
        f"`tputrace export` of a trace with {events:,} events ({counts['ops']:,} ops, {counts['executions']:,} "
        f"program executions) from `tests/fixtures/make_traces.build_large_trace`; each format in a fresh process, "
        f"timed from start to exit; median of {args.runs} run(s). Target: ≤ {TARGET_S:.0f} s each. The machine is "
        f"shared ({os.cpu_count()} cores): CPU time is the process's own, wall time includes waiting for the cores, "
        f"and the 1-minute load average at the end of each run says how busy they were.",
        "",
        "| format | wall s | CPU s | output | load average | within target |",
        "|---|---|---|---|---|---|",
    ]
    for label, measurements in rows:
        wall = statistics.median(m.wall_s for m in measurements)
        cpu = statistics.median(m.cpu_s for m in measurements)
        size = statistics.median(m.output_bytes for m in measurements)
        load = statistics.median(m.load_average for m in measurements)
        verdict = "yes" if wall <= TARGET_S else ("no (CPU time is)" if cpu <= TARGET_S else "no")
        lines.append(f"| {label} | {wall:.1f} | {cpu:.1f} | {size / 1e6:.0f} MB | {load:.1f} | {verdict} |")
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        sys.path.insert(0, str(REPO_ROOT / "bench"))
        from results import write_section

        write_section("Export", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
