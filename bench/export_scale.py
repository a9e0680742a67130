"""Scale benchmark: export memory and trace finish time as a trace grows (10^6 and 10^7 events).

For each size it builds a synthetic trace with `tests/fixtures/make_traces.build_large_trace` and
measures:
- finish time: how long the writer takes from the stop request to a finished file, split into
  committing the rows still queued (`commit()`) and the rest of `close()` (index creation, WAL
  checkpoint, leaving one file). The generator appends without pausing, so every row since the last
  background commit is still queued: the worst case a stop request meets.
- export memory: the peak resident set size (`ru_maxrss` from `wait4`) of a fresh
  `tputrace export` process per format, with its wall time and output size.

Targets: each export ≤ 500 MB at 10^7 events; a trace finished within 5 s of a stop request.
Results go to the `## Export scale` section of bench/RESULTS.md.

    python bench/export_scale.py [--events N [N ...]] [--formats perfetto tensorboard] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
EXPORT_TARGET_BYTES = 500 * 10**6
FINISH_TARGET_S = 5.0
FORMATS = {
    "perfetto": ("Perfetto (`--perfetto`, gzip)", lambda out: ["--perfetto", str(out / "trace.json.gz")]),
    "tensorboard": ("XProf (`--tensorboard`)", lambda out: ["--tensorboard", str(out / "logdir")]),
}


@dataclass(frozen=True)
class Finish:
    """The writer's finish at a stop request: committing queued rows, then the rest of `close()`."""

    queued_commit_s: float
    close_s: float

    @property
    def total_s(self) -> float:
        return self.queued_commit_s + self.close_s


@dataclass(frozen=True)
class ExportRun:
    peak_rss_bytes: int
    wall_s: float
    output_bytes: int


def build_trace(path: Path, events: int) -> tuple[Path, Finish]:
    """Build a `build_large_trace` trace of about `events` events, timing the writer's finish."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from fixtures import make_traces

    from tputrace.store.writer import TraceWriter

    finishes: list[Finish] = []

    class TimedWriter(TraceWriter):
        """A `TraceWriter` whose `close()` records how long the finish takes, phase by phase."""

        def close(self) -> None:
            if self.closed:
                return
            started = time.perf_counter()
            self.commit()
            committed = time.perf_counter()
            super().close()
            finishes.append(Finish(committed - started, time.perf_counter() - committed))

    original = make_traces.TraceWriter
    make_traces.TraceWriter = TimedWriter  # type: ignore[misc]
    try:
        trace_path = make_traces.build_large_trace(path, events)
    finally:
        make_traces.TraceWriter = original  # type: ignore[misc]
    return trace_path, finishes[0]


def measure_export(trace_path: Path, arguments: list[str], out: Path) -> ExportRun:
    """One `tputrace export` in a fresh process: its peak RSS, wall time and output size."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "tputrace.cli.main", "export", str(trace_path), *arguments],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO_ROOT,
    )
    assert process.stderr is not None
    errors = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall_s = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"export failed:\n{errors.decode(errors='replace')[-3000:]}")
    size = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    return ExportRun(usage.ru_maxrss * 1024, wall_s, size)


def event_count(trace_path: Path) -> tuple[int, dict[str, int]]:
    import tputrace

    with tputrace.open(trace_path) as trace:
        counts = trace.counts()
    events = sum(count for table, count in counts.items() if table not in ("strings", "frames", "runs", "programs"))
    return events, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000],
                        help="sizes of the generated traces, in events")
    parser.add_argument("--formats", nargs="+", choices=sorted(FORMATS), default=list(FORMATS),
                        help="export formats to measure")
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args(argv)

    rows: list[tuple[int, dict[str, int], Finish, dict[str, ExportRun]]] = []
    for size in args.events:
        with tempfile.TemporaryDirectory(prefix="tputrace-scale-bench-") as scratch:
            scratch_dir = Path(scratch)
            print(f"building a {size:,}-event trace ...", file=sys.stderr)
            started = time.perf_counter()
            trace_path, finish = build_trace(scratch_dir / "large.tptrace", size)
            print(f"built in {time.perf_counter() - started:.0f} s; finish {finish}", file=sys.stderr)
            events, counts = event_count(trace_path)
            exports: dict[str, ExportRun] = {}
            for name in args.formats:
                label, arguments = FORMATS[name]
                out = scratch_dir / f"out-{name}"
                out.mkdir()
                exports[name] = measure_export(trace_path, arguments(out), out)
                print(f"{label}: {exports[name]}", file=sys.stderr)
            rows.append((events, counts, finish, exports))

    body = _report(rows, args.formats)
    print(body)
    if not args.no_write:
        sys.path.insert(0, str(REPO_ROOT / "bench"))
        from results import write_section

        write_section("Export scale", body)
    return 0


def _report(rows: list[tuple[int, dict[str, int], Finish, dict[str, ExportRun]]], formats: list[str]) -> str:
    lines = [
        "Synthetic traces from `tests/fixtures/make_traces.build_large_trace` (96% ops). Finish: the writer's "
        "time from a stop request to a finished file, split into committing the rows still queued and the rest "
        f"of `close()` (indexes, WAL checkpoint); target ≤ {FINISH_TARGET_S:.0f} s. Export: peak RSS of a fresh "
        f"`tputrace export` process per format; target ≤ {EXPORT_TARGET_BYTES / 1e6:.0f} MB at 10^7 events.",
        "",
        "| events | ops | queued commit s | close s | finish s | "
        + " | ".join(f"{FORMATS[name][0]} peak RSS | wall s | output" for name in formats) + " |",
        "|---|---|---|---|---|" + "---|---|---|" * len(formats),
    ]
    for events, counts, finish, exports in rows:
        cells: list[Any] = [f"{events:,}", f"{counts['ops']:,}", f"{finish.queued_commit_s:.1f}",
                            f"{finish.close_s:.1f}", f"{finish.total_s:.1f}"]
        for name in formats:
            run = exports[name]
            cells += [f"{run.peak_rss_bytes / 1e6:.0f} MB", f"{run.wall_s:.1f}", f"{run.output_bytes / 1e6:.0f} MB"]
        lines.append("| " + " | ".join(cells) + " |")
    per_event = [
        f"{FORMATS[name][0]}: {(b.peak_rss_bytes - a.peak_rss_bytes) / (eb - ea):.0f} bytes per event"
        for name in formats
        for (ea, _, _, ea_exports), (eb, _, _, eb_exports) in zip(rows, rows[1:])
        for a, b in [(ea_exports[name], eb_exports[name])]
        if eb != ea
    ]
    if per_event:
        lines += ["", "Growth of peak RSS between the sizes: " + "; ".join(per_event) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
