"""Each planted problem of `examples/problems/` recorded before and after `--fixed`: the top finding,
whether it is gone after the fix, and the step time before/after.

    python bench/problems.py [--steps N] [--repeat N] [--only NAME ...] [--no-write]
                             [--platform gpu --scale K]

Step time is the loop's time per step after two warm-up steps (the first compiles the step, the
second what its first run could not share, e.g. momentum buffers an optimizer fills in its first
update): from the start of step 2 to the end of the
loop's last step, over the steps from 2 on. The loop ends when its last step has ended on the host
and every program launched in the loop has finished on the chip, so work the chip finishes after the
host has moved on (an asynchronous step) is counted, and the script's epilogue after the loop (reading
the final loss) is not. Compiles inside that window are counted too: a compile after warm-up is paid
by every step's average. With `--repeat`, the fastest of the repeats. The section "Diagnoses:
problems before/after" of bench/RESULTS.md is rewritten with the table.

`--platform` runs the chips on another XLA platform (`TPUTRACE_PLATFORM`, e.g. `gpu`) and writes its own
section, named after the device; `--scale K` multiplies the sizes of the problems that take `--scale`
(the matmul-bound ones), so that a real accelerator's step is bound by its matrix units.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from results import write_section  # noqa: E402

from tputrace.analysis import Report, analyze_path  # noqa: E402
from tputrace.analysis.host_bound import HostBoundData  # noqa: E402
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
SCALABLE = {"fp32_matmul", "tile_padding"}
WARMUP_STEPS = 2


@dataclass
class Measured:
    step_ns: float
    compiles: int
    steady_ns: float  # step_ns without the compile time inside the window
    launch_ns: float  # median host time of a cached flush (compile-free launch) after warm-up
    run_ns: float  # median launch-to-ready time of the programs those flushes launched
    report: Report


def record(name: str, fixed: bool, steps: int, out_dir: Path, scale: int, platform: str | None) -> Measured:
    script = ROOT / "examples" / "problems" / f"{name}.py"
    trace = out_dir / f"{name}{'-fixed' if fixed else ''}.tptrace"
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace), str(script), "--steps", str(steps)]
    if fixed:
        command.append("--fixed")
    if name in SCALABLE and scale != 1:
        command += ["--scale", str(scale)]
    env = {**os.environ, "TPUTRACE_PLATFORM": platform} if platform else None
    completed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    if completed.returncode != 0:
        raise SystemExit(f"{name}{' --fixed' if fixed else ''} failed:\n{completed.stderr[-2000:]}")
    with open_trace(trace) as opened:
        loop = [step for step in opened.step_times() if step.source != "end"]
        later = loop[WARMUP_STEPS:] if len(loop) > WARMUP_STEPS + 1 else loop
        start_ns, last_step = later[0].start_ns, loop[-1].step
        chip_done_ns = [row.start_ns + row.dur_ns for row in opened.records("executions") if row.step <= last_step]
        end_ns = max([loop[-1].end_ns, *chip_done_ns])
        in_window = [row.dur_ns for row in opened.records("compiles") if start_ns <= row.start_ns < end_ns]
        flushes = {row.id: row.dur_ns for row in opened.records("flushes") if row.cache_hit and row.start_ns >= start_ns}
        runs = [row.dur_ns for row in opened.records("executions") if row.flush_id in flushes]
    launch_ns = statistics.median(flushes.values()) if flushes else float("nan")
    run_ns = statistics.median(runs) if runs else float("nan")
    window_ns = end_ns - start_ns
    return Measured(window_ns / len(later), len(in_window), (window_ns - sum(in_window)) / len(later), launch_ns, run_ns,
                    analyze_path(trace))


def matmul_rows(platform: str | None, scale: int, repeats: int = 30) -> list[str]:
    """`jax.jit(jnp.dot)` of two n x n matrices on the chips' XLA platform at the backend's full
    precision, float32 against bfloat16 and n = 1000 against 1024 (times `scale`), interleaved so that
    load changes hit every case alike: what the tile-padding and float32-matmul fixes can gain there."""
    import jax
    import jax.numpy as jnp

    device = jax.devices(platform)[0] if platform else jax.devices("cpu")[0]
    dot = jax.jit(lambda left, right: jnp.dot(left, right, precision=jax.lax.Precision.HIGHEST))
    cases: dict[tuple[int, str], tuple[object, object, list[float]]] = {}
    for size in (1000 * scale, 1024 * scale):
        for dtype in (jnp.float32, jnp.bfloat16):
            left = jax.device_put(jax.random.normal(jax.random.PRNGKey(0), (size, size)).astype(dtype), device)
            right = jax.device_put(jax.random.normal(jax.random.PRNGKey(1), (size, size)).astype(dtype), device)
            dot(left, right).block_until_ready()
            cases[(size, jnp.dtype(dtype).name)] = (left, right, [])
    for _ in range(repeats):
        for left, right, times in cases.values():
            start = time.perf_counter()
            dot(left, right).block_until_ready()
            times.append(time.perf_counter() - start)
    rows = ["| n | dtype | fastest | median | GFLOP/s (fastest) |", "|---|---|---|---|---|"]
    for (size, dtype_name), (_, _, times) in cases.items():
        rows.append(f"| {size} | {dtype_name} | {min(times) * 1e3:.1f} ms | {statistics.median(times) * 1e3:.1f} ms "
                    f"| {2 * size ** 3 / min(times) / 1e9:.1f} |")
    return rows


def overlap_note(before: Measured, after: Measured) -> str:
    """What the host-sync fix can overlap: the step's host dispatch against its chip time, and how
    long a launch takes against its program, from the traces."""
    data = before.report.data(HostBoundData)
    dispatch, chip = (data.median_dispatch_ns, data.median_chip_ns) if data is not None else (None, None)
    shares = ""
    if dispatch and chip:
        shares = (f" Before the fix its median step dispatches ops for {dispatch / 1e6:.1f} ms against "
                  f"{chip / 1e6:.1f} ms of chip time.")
    return (f" In host_sync after the fix, a flush returns after {after.launch_ns / 1e6:.2f} ms (median) and its "
            f"program is ready {after.run_ns / 1e6:.1f} ms after launch, so the launch is asynchronous.{shares}")


def _load_average() -> str:
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())


def accelerator_body(rows: list[str], matmuls: list[str], command: str, device: str, scale: int) -> str:
    """The section for chips on an accelerator platform: the table, how it was run, the same run's matmuls."""
    load = _load_average()
    return "\n".join(rows) + (
        f"\n\nThe chips ran on {device} (`{command}`): each problem script run with `tputrace run`, then "
        f"with `--fixed`; the matmul-bound problems ({', '.join(sorted(SCALABLE))}) with every size times "
        f"{scale}. Step and compile columns as in the section above. Load average at the end: {load} on "
        f"{os.cpu_count()} host cores. The same run's matmuls at the backend's full float32 precision "
        "(`Precision.HIGHEST`, as torch's default):\n\n" + "\n".join(matmuls)
    )


def section_body(rows: list[str], matmuls: list[str], steps: int, repeat: int, overlap: str) -> str:
    """The RESULTS.md section: the table, how to read it, and what virtual CPU chips can show."""
    load = _load_average()
    return "\n".join(rows) + (
        f"\n\nEach problem script run with `tputrace run` for {steps} steps, then with `--fixed` "
        f"(`python bench/problems.py --steps {steps} --repeat {repeat}`; the fastest of {repeat} run(s) each, "
        f"before and after run in turn). ✓: the top finding of the report is the planted problem. Step: loop "
        f"time per step after {WARMUP_STEPS} warm-up steps, up to the moment the last step's programs finished on "
        f"the chip (work the chip finished after the host moved on counts; the epilogue after the loop does "
        f"not). Compiles after warm-up are inside that window and paid by the average; the next column takes "
        f"their compile time out (a recompile the fix does not touch, such as the deferred executor compiling "
        f"a step's graph again, then weighs on neither ratio). Load average at the end: "
        f"{load} on {os.cpu_count()} cores shared with other work, so ratios within about 20% of 1 are noise.\n\n"
        "The chips here are virtual XLA CPU devices on those same cores (no TPU on this machine), which limits "
        "what a fix can show. XLA:CPU has no bfloat16 matmul: the compiled HLO converts bfloat16 operands to "
        "float32, multiplies in float32 and converts back, also under its oneDNN and XNNPACK options "
        "(`--xla_cpu_use_onednn`, `--xla_cpu_experimental_onednn_custom_call`, "
        "`--xla_cpu_experimental_onednn_fusion_type=dot`, `--xla_cpu_experimental_xnn_fusion_type=dot`, checked "
        "with jaxlib 0.10.2), although this CPU has AMX and AVX512_BF16. So the float32-matmul fix (bfloat16 "
        "autocast) adds conversions to the same float32 work, and the tile-padding fix (hidden size 1000 to "
        "1024) adds about 4% FLOPs with no MXU tiles to fill: neither is expected to be faster here (ratios near 1 "
        "are noise), and both findings are about a TPU's MXU. The same run's matmuls:\n\n" + "\n".join(matmuls) + "\n\n"
        "Removing a host sync lets the host queue the next step while the chip runs, but the chip's threads "
        "run on the host's own cores, so the overlap can only fill the host's share of the step." + overlap
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant (the fastest counts)")
    parser.add_argument("--only", nargs="*", choices=sorted(PROBLEMS), default=None)
    parser.add_argument("--no-write", action="store_true", help="print the table without writing RESULTS.md")
    parser.add_argument("--platform", default=None, help="XLA platform for the chips (TPUTRACE_PLATFORM), e.g. gpu")
    parser.add_argument("--scale", type=int, default=1, help=f"size multiplier for {', '.join(sorted(SCALABLE))}")
    args = parser.parse_args()
    names = args.only or list(PROBLEMS)
    rows = [
        "| problem | top finding before | finding after `--fixed` | step before | step after | after/before "
        "| compiles after warm-up, before / after | without their compile time: before / after (ratio) "
        "| load average (1 min) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    overlap = ""
    with tempfile.TemporaryDirectory(prefix="tputrace-problems-") as directory:
        for name in names:
            analyzer = PROBLEMS[name]
            runs = [(record(name, False, args.steps, Path(directory), args.scale, args.platform),
                     record(name, True, args.steps, Path(directory), args.scale, args.platform))
                    for _ in range(max(args.repeat, 1))]
            before = min((pair[0] for pair in runs), key=lambda measured: measured.step_ns)
            after = min((pair[1] for pair in runs), key=lambda measured: measured.step_ns)
            top = before.report.findings[0] if before.report.findings else None
            top_text = f"{top.analyzer} ({top.severity})" + (" ✓" if top.analyzer == analyzer else " ✗") if top else "none"
            remaining = [finding for finding in after.report.findings if finding.analyzer == analyzer]
            after_text = "gone" if not remaining else f"still there ({remaining[0].severity})"
            ratio = after.step_ns / before.step_ns if before.step_ns else float("nan")
            row = (f"| {name} | {top_text} | {after_text} | {before.step_ns / 1e6:.1f} ms | "
                   f"{after.step_ns / 1e6:.1f} ms | {ratio:.2f} | {before.compiles} / {after.compiles} | "
                   f"{before.steady_ns / 1e6:.1f} / {after.steady_ns / 1e6:.1f} ms ({after.steady_ns / before.steady_ns:.2f}) | "
                   f"{os.getloadavg()[0]:.1f} |")
            rows.append(row)
            print(row, flush=True)
            if name == "host_sync":
                overlap = overlap_note(before, after)
    matmuls = matmul_rows(args.platform, args.scale)
    print(*matmuls, sep="\n", flush=True)
    if args.platform and args.platform != "cpu":
        import jax

        device = f"{jax.devices(args.platform)[0].device_kind} (XLA {args.platform}, jax {jax.__version__})"
        command = "python " + " ".join(["bench/problems.py", *sys.argv[1:]])
        title, body = f"{SECTION} on {device}", accelerator_body(rows, matmuls, command, device, args.scale)
    else:
        title, body = SECTION, section_body(rows, matmuls, args.steps, args.repeat, overlap)
    if not args.no_write:
        write_section(title, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
