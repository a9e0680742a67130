"""What the sharding records cost, and what the sharding problems' fixes save: each sharding problem of
`examples/problems/` recorded with the time in the records' hooks summed per step
(bench/sharding_records_timed.py), with the records on and off (bench/sharding_records_off.py) in
interleaved pairs, and with `--fixed`.

    python bench/sharding_records.py [--steps N] [--pairs N] [--only NAME ...] [--no-write]

Step time is rank 0's step from the third on (the first two compile). The records' cost is the median over
those steps of the hooks' time in the step over the step's time (on every rank, the largest), measured in
the process, so that it does not depend on how busy the host is; the pairs' (on - off) / off, medians over
the pairs (each runs on, then off, so that load changes hit both alike), check it where the host is quiet
enough. Before/after compares the timed run against the `--fixed` run. The section "Sharding records:
cost and fixes" of bench/RESULTS.md is rewritten.
"""

from __future__ import annotations

import argparse
import json
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


def steps_ns(trace: Path, rank: int = 0) -> dict[int, int]:
    """A rank's step durations after the warm-up steps, by step index."""
    with open_trace(trace) as opened:
        loop = [step for step in opened.step_times(rank=rank) if step.source != "end"]
    later = loop[WARMUP_STEPS:] if len(loop) > WARMUP_STEPS else loop
    return {step.step: step.end_ns - step.start_ns for step in later}


def step_ns(trace: Path) -> float:
    """Rank 0's median step after the warm-up steps."""
    return statistics.median(steps_ns(trace).values())


def hook_share(trace: Path, times: Path, ranks: int) -> tuple[float, float]:
    """(median hook time per steady step, median share of the step) on the rank where the share is largest."""
    worst = (0.0, 0.0)
    for rank in range(ranks):
        by_step = json.loads((times / f"rank{rank}.json").read_text())
        durations = steps_ns(trace, rank)
        hooks = [by_step.get(str(step), [0, 0])[0] for step in durations]
        share = statistics.median(by_step.get(str(step), [0, 0])[0] / duration for step, duration in durations.items())
        if share >= worst[1]:
            worst = (statistics.median(hooks), share)
    return worst


def record(name: str, ranks: int, steps: int, out: Path, *, records: str = "on", fixed: bool = False) -> Path:
    """A run of the problem with the records `on`, `off` or `timed`."""
    script = ROOT / "examples" / "problems" / f"{name}.py"
    trace = out / f"{name}-{records}{'-fixed' if fixed else ''}.tptrace"
    wrapper = {"on": [], "off": [str(ROOT / "bench" / "sharding_records_off.py")], "timed": [str(ROOT / "bench" / "sharding_records_timed.py")]}
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--nproc", str(ranks), "-o", str(trace), *wrapper[records], str(script),
               "--steps", str(steps)]
    if fixed:
        command.append("--fixed")
    times = out / f"{name}-times"
    times.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore", SHARDING_HOOK_TIMES=str(times))
    completed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
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
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--only", nargs="*", choices=sorted(PROBLEMS))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    names = args.only or list(PROBLEMS)
    cost_rows = ["| problem | ranks | step | in the records' hooks per step | share of the step | pairs: step on / off | pairs: (on - off) / off |",
                 "|---|---|---|---|---|---|---|"]
    fix_rows = ["| problem | step before | step after `--fixed` | after/before | sharding finding (warning or worse) before | after |",
                "|---|---|---|---|---|---|"]
    costs: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory)
        for name in names:
            ranks = PROBLEMS[name]
            timed_trace = record(name, ranks, args.steps, out, records="timed")
            hooks_ns, share = hook_share(timed_trace, out / f"{name}-times", ranks)
            costs.append(share)
            on_ns, off_ns, pair_costs = [], [], []
            for _ in range(args.pairs):
                on = step_ns(record(name, ranks, args.steps, out))
                off = step_ns(record(name, ranks, args.steps, out, records="off"))
                on_ns.append(on)
                off_ns.append(off)
                pair_costs.append((on - off) / off)
            fixed_trace = record(name, ranks, args.steps, out, fixed=True)
            before, after = step_ns(timed_trace), step_ns(fixed_trace)
            cost_rows.append(f"| {name} | {ranks} | {before / 1e6:.1f} ms | {hooks_ns / 1e3:.0f} µs | {share:.2%} "
                             f"| {statistics.median(on_ns) / 1e6:.1f} / {statistics.median(off_ns) / 1e6:.1f} ms | {statistics.median(pair_costs):+.1%} |")
            fix_rows.append(f"| {name} | {before / 1e6:.1f} ms | {after / 1e6:.1f} ms | {after / before:.2f} | {top_sharding(timed_trace)} "
                            f"| {top_sharding(fixed_trace)} |")
            print(cost_rows[-1], fix_rows[-1], sep="\n", flush=True)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    body = "\n".join([
        *cost_rows, "",
        f"Each problem run with `tputrace run --nproc N` for {args.steps} steps (`python bench/sharding_records.py --steps {args.steps} "
        f"--pairs {args.pairs}`). Step: rank 0's median step after {WARMUP_STEPS} warm-up steps. In the hooks: the time the records' "
        f"hooks took in each steady step (telling causes, round trips and repeated reductions, recording placements; "
        f"bench/sharding_records_timed.py), median over the steps, on the rank where its share of the step is largest; the "
        f"largest share over the problems is {max(costs):.2%}. Pairs: {args.pairs} interleaved run(s) with the records on (as "
        f"shipped) and off (bench/sharding_records_off.py: no causes, placements or meshes). Load average at the end: {load} on "
        f"{os.cpu_count()} cores shared with other work, where the ranks are virtual chips on those same cores, so the "
        f"wall-clock pairs differ by more than the records cost (noise); the in-process share is the measure.",
        "",
        *fix_rows, "",
        "Before: the timed run; after: one run with `--fixed`. On virtual chips that share the host's cores, collectives are "
        "host work, so the fixes that remove collectives (the plans, the bucket cap) show in the step; the FSDP2 wrap "
        "changes when parameters are gathered, which overlap on a TPU could hide and here cannot. A finding's severity "
        "follows its share of the measured step, so on a loaded host a run can rate a problem info (`none` in the table).",
    ])
    print(body)
    if not args.no_write:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
