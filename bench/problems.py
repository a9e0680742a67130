"""Each planted problem of `examples/problems/` recorded before and after `--fixed`: the top finding,
whether it is gone after the fix, and the step time before/after.

    python bench/problems.py [--steps N] [--repeat N] [--only NAME ...] [--no-write]

Step time is the loop's time per step after two warm-up steps (the first compiles the step, the
second the optimizer's update once its state exists): from the start of step 2 to the end of the
run, over the steps from 2 on, so work the chip finishes after the host has moved on (an
asynchronous step) is counted. With `--repeat`, the fastest of the repeats. The section "Diagnoses: problems before/after" of
bench/RESULTS.md is rewritten with the table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from results import write_section  # noqa: E402

from tputrace.analysis import Report, analyze_path  # noqa: E402
from tputrace.store.reader import open_trace  # noqa: E402

PROBLEMS = {
    "recompile_storm": "recompiles",
    "host_sync": "syncs",
    "tile_padding": "padding",
    "cpu_fallback": "fallbacks",
    "fragmented_fusion": "fusion",
    "host_copies": "transfers",
    "fp32_matmul": "precision",
}
SECTION = "Diagnoses: problems before/after"
WARMUP_STEPS = 2


@dataclass
class Measured:
    step_ns: float
    report: Report


def record(name: str, fixed: bool, steps: int, out_dir: Path) -> Measured:
    script = ROOT / "examples" / "problems" / f"{name}.py"
    trace = out_dir / f"{name}{'-fixed' if fixed else ''}.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace), str(script), "--steps", str(steps)]
    if fixed:
        command.append("--fixed")
    completed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if completed.returncode != 0:
        raise SystemExit(f"{name}{' --fixed' if fixed else ''} failed:\n{completed.stderr[-2000:]}")
    with open_trace(trace) as opened:
        loop = [step for step in opened.step_times() if step.source != "end"]
        end_ns = opened.wall_ns()
    later = loop[WARMUP_STEPS:] if len(loop) > WARMUP_STEPS + 1 else loop
    step_ns = (end_ns - later[0].start_ns) / len(later)
    return Measured(step_ns, analyze_path(trace))


def section_body(rows: list[str], steps: int, repeat: int) -> str:
    """The RESULTS.md section: the table and how to read it."""
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return "\n".join(rows) + (
        f"\n\nEach problem script run with `tputrace run` for {steps} steps, then with `--fixed` "
        f"(`python bench/problems.py --steps {steps} --repeat {repeat}`; the fastest of {repeat} run(s) each). "
        f"✓: the top finding of the report is the planted problem. Step: loop time per step after "
        f"{WARMUP_STEPS} warm-up steps, including work the chip finished after the host moved on. Load average "
        f"at the end: {load} on {os.cpu_count()} cores shared with other work, so ratios near 1 are noise.\n\n"
        "The chips here are virtual XLA CPU devices on those same cores (no TPU on this machine), which limits "
        "what a fix can show: padding and float32 precision cost time on a TPU's MXU, not on a CPU, so their "
        "fixes are not expected to be faster here (a bfloat16 or 1024-wide matmul can be slower on a CPU); "
        "removing a host sync lets the host queue the next step while the chip runs, which only pays when the "
        "chip is not the host's own busy cores."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant (the fastest counts)")
    parser.add_argument("--only", nargs="*", choices=sorted(PROBLEMS), default=None)
    parser.add_argument("--no-write", action="store_true", help="print the table without writing RESULTS.md")
    args = parser.parse_args()
    names = args.only or list(PROBLEMS)
    rows = [
        "| problem | top finding before | finding after `--fixed` | step before | step after | after/before |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="tputrace-problems-") as directory:
        for name in names:
            analyzer = PROBLEMS[name]
            runs = [(record(name, False, args.steps, Path(directory)), record(name, True, args.steps, Path(directory)))
                    for _ in range(max(args.repeat, 1))]
            before = min((pair[0] for pair in runs), key=lambda measured: measured.step_ns)
            after = min((pair[1] for pair in runs), key=lambda measured: measured.step_ns)
            top = before.report.findings[0] if before.report.findings else None
            top_text = f"{top.analyzer} ({top.severity})" + (" ✓" if top.analyzer == analyzer else " ✗") if top else "none"
            remaining = [finding for finding in after.report.findings if finding.analyzer == analyzer]
            after_text = "gone" if not remaining else f"still there ({remaining[0].severity})"
            ratio = after.step_ns / before.step_ns if before.step_ns else float("nan")
            row = (f"| {name} | {top_text} | {after_text} | {before.step_ns / 1e6:.1f} ms | "
                   f"{after.step_ns / 1e6:.1f} ms | {ratio:.2f} |")
            rows.append(row)
            print(row, flush=True)
    body = section_body(rows, args.steps, args.repeat)
    if not args.no_write:
        write_section(SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
