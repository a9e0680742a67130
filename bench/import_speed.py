"""Import throughput and memory of `tputrace import`: events per second and peak RSS, per format, at two
capture sizes (so that one can see whether memory grows with the capture).

Captures are real, made here: `jax.profiler.trace` of N steps of a jitted function (XProf `xplane.pb`)
and torch.profiler's Chrome JSON of N training steps of a small CPU model. Each import runs in a fresh
process; its peak RSS is that process's `ru_maxrss` (the interpreter and tputrace included).

Run: `python bench/import_speed.py [--steps N]`; writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from results import write_section

SECTION = "Import throughput and memory (bench/import_speed.py)"

JAX_CAPTURE = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp

    @jax.jit
    def step(w, x):
        return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)

    w, x = jnp.ones((32, 32)), jnp.ones((8, 32))
    step(w, x).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i in range(int(sys.argv[2])):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, x)
        w.block_until_ready()
""")

TORCH_CAPTURE = textwrap.dedent("""
    import sys, torch
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
        for _ in range(int(sys.argv[2])):
            model(x).sum().backward()
    prof.export_chrome_trace(sys.argv[1])
""")

IMPORT = textwrap.dedent("""
    import json, resource, sys, time
    import tputrace
    from tputrace.importers.run import import_captures

    started = time.perf_counter()
    result = import_captures([sys.argv[1]], sys.argv[2])
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rows": result.rows, "seconds": seconds, "peak_mib": peak_mib}))
""")


def _capture(script: str, target: Path, steps: int, folder: Path) -> None:
    path = folder / "capture.py"
    path.write_text(script)
    subprocess.run([sys.executable, str(path), str(target), str(steps)], check=True, capture_output=True)


def _import(capture: Path, output: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", IMPORT, str(capture), str(output)], check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps in the larger captures (the smaller: a tenth)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as temp:
        folder = Path(temp)
        for fmt, script, name in (("XProf xplane.pb (jax.profiler)", JAX_CAPTURE, "logdir"),
                                  ("torch.profiler JSON", TORCH_CAPTURE, "profile.json")):
            for steps in (args.steps // 10, args.steps):
                capture = folder / f"{steps}-{name}"
                _capture(script, capture, steps, folder)
                size = sum(file.stat().st_size for file in ([capture] if capture.is_file() else capture.rglob("*")))
                measured = _import(capture, folder / f"{steps}-{name}.tptrace")
                rate = measured["rows"] / measured["seconds"]
                rows.append(f"| {fmt} | {steps} | {size / 2**20:.1f} MiB | {measured['rows']:,} | "
                            f"{measured['seconds']:.2f} s | {rate:,.0f} | {measured['peak_mib']:.0f} MiB |")
                print(rows[-1], flush=True)
    body = "\n".join([
        "Rows written per second by `tputrace import` (one row per imported event), and the import process's peak",
        "RSS, for captures of a tenth and all of `--steps` steps. Memory that stays put as the capture grows is",
        "what streaming buys; XProf files are parsed one plane at a time, so a capture's largest plane bounds it.",
        "",
        "| format | steps | capture | rows | import time | rows/s | peak RSS |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ])
    write_section(SECTION, body)


if __name__ == "__main__":
    main()
