"""What the sharding records cost, and what the sharding problems' fixes save: each sharding problem of
`examples/problems/` recorded with the sharding records on and off (bench/sharding_records_off.py), in
interleaved pairs, and recorded again with `--fixed`.

    python bench/sharding_records.py [--steps N] [--pairs N] [--only NAME ...] [--no-write]

Step time is the median of rank 0's steps from the third on (the first two compile). The records' cost is
the median over the pairs of (on - off) / off; each pair runs on, then off, so that load changes on the
shared host hit both alike. Before/after compares the problem's runs with the records on against its
`--fixed` run. The section "Sharding records: cost and fixes" of bench/RESULTS.md is rewritten.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from results import write_section  # noqa: E402

from tputrace.analysis import analyze_path  # noqa: E402
from tputrace.store.reader import open_trace  # noqa: E402

PROBLEMS = {"sharding_tp_plan": 2, "sharding_ddp_buckets": 2, "sharding_fsdp_unwrapped": 2, "sharding_2d_mesh": 4}  # name: ranks
SECTION = "Sharding records: cost and fixes"
WARMUP_STEPS = 2


def step_ns(trace: Path) -> float:
    """Rank 0's median step after the warm-up steps."""
    with open_trace(trace) as opened:
        loop = [step for step in opened.step_times(rank=0) if step.source != "end"]
    later = loop[WARMUP_STEPS:] if len(loop) > WARMUP_STEPS else loop
    return statistics.median(step.end_ns - step.start_ns for step in later)


def record(name: str, ranks: int, steps: int, out: Path, *, records: bool = True, fixed: bool = False) -> Path:
    script = ROOT / "examples" / "problems" / f"{name}.py"
    trace = out / f"{name}-{'on' if records else 'off'}{'-fixed' if fixed else ''}.tptrace"
    target = [str(script)] if records else [str(ROOT / "bench" / "sharding_records_off.py"), str(script)]
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--nproc", str(ranks), "-o", str(trace), *target, "--steps", str(steps)]
    if fixed:
        command.append("--fixed")
    completed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if completed.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{completed.stderr[-3000:]}")
    return trace


def top_sharding(trace: Path) -> str:
    """The first sharding finding's severity and title, or `none`."""
    findings = [finding for finding in analyze_path(trace).findings if finding.analyzer == "sharding" and finding.severity != "info"]
    return f"{findings[0].severity}: {findings[0].title}" if findings else "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--only", nargs="*", choices=sorted(PROBLEMS))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    names = args.only or list(PROBLEMS)
    cost_rows = ["| problem | ranks | step, records on | step, records off | cost (median of pairs) | pairs |", "|---|---|---|---|---|---|"]
    fix_rows = ["| problem | step before | step after `--fixed` | after/before | sharding finding (warning or worse) before | after |",
                "|---|---|---|---|---|---|"]
    costs: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory)
        for name in names:
            ranks = PROBLEMS[name]
            on_ns, off_ns, shares = [], [], []
            for _ in range(args.pairs):
                on = step_ns(on_trace := record(name, ranks, args.steps, out))
                off = step_ns(record(name, ranks, args.steps, out, records=False))
                on_ns.append(on)
                off_ns.append(off)
                shares.append((on - off) / off)
            fixed_trace = record(name, ranks, args.steps, out, fixed=True)
            after = step_ns(fixed_trace)
            cost = statistics.median(shares)
            costs.append(cost)
            before = statistics.median(on_ns)
            cost_rows.append(f"| {name} | {ranks} | {before / 1e6:.1f} ms | {statistics.median(off_ns) / 1e6:.1f} ms | {cost:+.1%} | {args.pairs} |")
            fix_rows.append(f"| {name} | {before / 1e6:.1f} ms | {after / 1e6:.1f} ms | {after / before:.2f} | {top_sharding(on_trace)} "
                            f"| {top_sharding(fixed_trace)} |")
            print(cost_rows[-1], fix_rows[-1], sep="\n", flush=True)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    body = "\n".join([
        *cost_rows, "",
        f"Each problem run with `tputrace run --nproc N` for {args.steps} steps with the sharding records on (the product as shipped) "
        f"and off (bench/sharding_records_off.py: no causes, placements or meshes), in {args.pairs} interleaved pairs "
        f"(`python bench/sharding_records.py --steps {args.steps} --pairs {args.pairs}`). Step: rank 0's median step after "
        f"{WARMUP_STEPS} warm-up steps. Median cost over the problems: {statistics.median(costs):+.1%}. Load average at the end: "
        f"{load} on {os.cpu_count()} cores shared with other work, where the ranks are virtual chips on those same cores: "
        f"differences of a few percent between single runs are noise.",
        "",
        *fix_rows, "",
        "Before: the problem's runs with the records on (median); after: one run with `--fixed`.",
    ])
    print(body)
    if not args.no_write:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
