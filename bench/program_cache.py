"""Memory of a run whose shapes never repeat, with the program cache bounded and (nearly) unbounded.

    python bench/program_cache.py [--shapes N] [--limit K] [--mode DEFER_NEVER|DEFER_AND_FUSE] [--no-write]

Each run is its own process: it computes `(x * 2 + 1).sum().item()` for x of lengths 1..N (a new
program per op and length) and reports the process's memory maps (`/proc/self/maps` lines: XLA:CPU
maps memory regions per program it keeps, and Linux stops a process at 65,530) and resident memory
at the start and the end, with `TPUTRACE_MAX_PROGRAMS=K` and with a limit above anything the run
compiles. The two runs alternate twice; the section "Program cache" of bench/RESULTS.md is rewritten.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from results import write_section  # noqa: E402

SECTION = "Program cache"
UNBOUNDED = 10**9

_CHILD = """
import gc, json, sys, time
import torch, tputrace.backend
from tputrace.backend.core import program_cache
torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, sys.argv[1]))

def usage():
    gc.collect()
    with open("/proc/self/maps") as maps:
        count = sum(1 for _ in maps)
    with open("/proc/self/statm") as statm:
        resident = int(statm.read().split()[1]) * 4096
    return count, resident

x = torch.ones(3, device="tpu")
(x + x).cpu()
maps_start, rss_start = usage()
start = time.perf_counter()
for length in range(1, int(sys.argv[2]) + 1):
    (torch.ones(length, device="tpu") * 2 + 1).sum().item()
seconds = time.perf_counter() - start
maps_end, rss_end = usage()
print(json.dumps({"maps_start": maps_start, "maps_end": maps_end, "rss_start": rss_start, "rss_end": rss_end,
                  "seconds": seconds, "kept": program_cache.kept_count(), "evictions": program_cache.evictions()}))
"""


def measure(limit: int, shapes: int, mode: str) -> dict:
    environment = {**os.environ, "TPUTRACE_MAX_PROGRAMS": str(limit)}
    completed = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(shapes)], env=environment, capture_output=True, text=True, check=True
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=300)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--mode", default="DEFER_NEVER", choices=("DEFER_NEVER", "DEFER_AND_FUSE"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = []
    for _ in range(2):
        for limit in (args.limit, UNBOUNDED):
            result = measure(limit, args.shapes, args.mode)
            rows.append((limit, result))
            print(f"limit {'unbounded' if limit == UNBOUNDED else limit}: {json.dumps(result)}", flush=True)
    lines = [
        f"{args.shapes} lengths, each a new program per op, `{args.mode}`, one process per run, runs alternating "
        f"(`python bench/program_cache.py --shapes {args.shapes} --limit {args.limit} --mode {args.mode}`):",
        "",
        "| TPUTRACE_MAX_PROGRAMS | programs kept | evicted | memory maps start → end | resident MiB start → end | loop s |",
        "|---|---|---|---|---|---|",
    ]
    for limit, result in rows:
        lines.append(
            f"| {'unbounded' if limit == UNBOUNDED else limit} | {result['kept']} | {result['evictions']} | "
            f"{result['maps_start']} → {result['maps_end']} | {result['rss_start'] / 2**20:.0f} → "
            f"{result['rss_end'] / 2**20:.0f} | {result['seconds']:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    if not args.no_write:
        write_section(SECTION, table)


if __name__ == "__main__":
    main()
