"""Collective bandwidth on `tpu` next to plain gloo on CPU tensors, and what tracing adds to a collective.

    python bench/collectives.py [--ranks 2 4] [--max-mb 64] [--quick]

For 2 and 4 ranks (processes on this host) it times all-reduce and all-gather from 4 KB to 64 MB,
on tpu tensors through the "tpu" process group and on CPU tensors through a gloo group created in
the same run, and reports bus bandwidth (nccl-tests' convention: message size x ring factor / time;
all-gather counts the gathered size). Each timed call starts after a barrier; a call's time is the
slowest rank's, and the figure is the median over calls.

Tracing overhead, two ways. End to end: the tpu all-reduce runs with a recorder active, its
collective rows on and off (`recorder.enabled`) on the two calls of each pair (which one goes first
alternates), so machine noise hits both alike; the overhead is the median of the paired differences
over the untraced median (still noisy on a shared machine). Direct: the time tracing's own
steps take inside each traced collective (opening its row: the user's source line and step;
stamping arrival and end and writing the row), timed where they run, against the untraced
collective's time. (The trace writer inserts rows on its own thread, off the collective path.) Writes the `## Collectives` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
OVERHEAD_SIZES = [4 << 10, 64 << 10, 1 << 20]
OVERHEAD_CALLS = 400


def bus_factor(kind: str, ranks: int) -> float:
    return 2.0 * (ranks - 1) / ranks if kind == "all_reduce" else (ranks - 1) / ranks


def calls_for(size: int, quick: bool) -> int:
    calls = 30 if size <= (256 << 10) else 10 if size <= (4 << 20) else 4
    return max(3, calls // 3) if quick else calls


# ----------------------------------------------------------------- one rank (a worker process)
def worker(out_path: str, sizes: list[int], quick: bool) -> None:
    import torch
    import torch.distributed as dist

    import tputrace.backend  # noqa: F401 - registers the tpu device and the "tpu" process group backend
    from tputrace.recording import lifecycle

    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")

    def slowest(seconds: list[float]) -> list[float]:
        times = torch.tensor(seconds, dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=gloo)
        return times.tolist()

    def timed(call: object, calls: int, group: object) -> float:
        call()  # warm-up (and, for tpu, the first compile of the staging programs)
        seconds = []
        for _ in range(calls):
            dist.barrier(group=group)
            start = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - start)
        return statistics.median(slowest(seconds))

    rows = []
    for size in sizes:
        elements = size // 4
        calls = calls_for(size, quick)
        for device, group in (("tpu", None), ("cpu", gloo)):
            tensor = torch.zeros(elements, device=device)
            gathered = torch.empty(elements, device=device)
            shard = torch.zeros(elements // world, device=device)

            def all_reduce() -> None:
                dist.all_reduce(tensor, group=group)

            def all_gather() -> None:
                dist.all_gather_single(gathered, shard, group=group)

            rows.append({"kind": "all_reduce", "device": device, "size": size, "seconds": timed(all_reduce, calls, group)})
            rows.append({"kind": "all_gather", "device": device, "size": size, "seconds": timed(all_gather, calls, group)})

    overhead = []
    trace_dir = tempfile.mkdtemp(prefix="tputrace-bench-")
    active = lifecycle.start(os.path.join(trace_dir, f"rank{rank}.tptrace"), script="bench/collectives.py", argv=[], mode="strict")
    try:
        for size in OVERHEAD_SIZES:
            tensor = torch.zeros(size // 4, device="tpu")
            dist.all_reduce(tensor)
            seconds, traced_calls = [], []
            in_path = _InPathTimer()
            for call in range(OVERHEAD_CALLS):
                traced = (call % 2 == 0) == ((call // 2) % 2 == 0)  # pairs alternate which goes first
                active.enabled = traced
                traced_calls.append(traced)
                dist.barrier(group=gloo)
                start = time.perf_counter()
                dist.all_reduce(tensor)
                seconds.append(time.perf_counter() - start)
            active.enabled = True
            slowest_seconds = slowest(seconds)
            pairs = [(slowest_seconds[index], slowest_seconds[index + 1]) for index in range(0, OVERHEAD_CALLS, 2)]
            differences = [(a - b) if traced_calls[2 * pair] else (b - a) for pair, (a, b) in enumerate(pairs)]
            untraced = statistics.median(value for value, traced in zip(slowest_seconds, traced_calls) if not traced)
            traced_median = statistics.median(value for value, traced in zip(slowest_seconds, traced_calls) if traced)
            in_path.stop()
            overhead.append(
                {"size": size, "untraced": untraced, "traced": traced_median, "paired": statistics.median(differences), "recording": in_path.per_call()}
            )
    finally:
        active.enabled = True
        lifecycle.stop(0)
    if rank == 0:
        Path(out_path).write_text(json.dumps({"ranks": world, "rows": rows, "overhead": overhead}))
    dist.destroy_process_group()


class _InPathTimer:
    """Times what tracing does inside each traced collective (opening its row; stamping and writing
    it), wherever it runs, by wrapping those two steps for the duration of the measurement."""

    def __init__(self) -> None:
        from tputrace.backend.distributed import tracing

        self._tracing = tracing
        self._open, self._finished = tracing.open_call, tracing.CollectiveCall.finished
        self.total_ns = 0
        self.calls = 0

        def open_call(*args: object) -> object:
            start = time.perf_counter_ns()
            call = self._open(*args)
            if call is not None:
                self.total_ns += time.perf_counter_ns() - start
                self.calls += 1
            return call

        def finished(call: object) -> None:
            start = time.perf_counter_ns()
            self._finished(call)
            self.total_ns += time.perf_counter_ns() - start

        tracing.open_call, tracing.CollectiveCall.finished = open_call, finished

    def stop(self) -> None:
        self._tracing.open_call, self._tracing.CollectiveCall.finished = self._open, self._finished

    def per_call(self) -> float:
        return self.total_ns / max(self.calls, 1) / 1e9


# ----------------------------------------------------------------- the driver
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(ranks: int, sizes: list[int], quick: bool) -> dict:
    out = Path(tempfile.mkdtemp(prefix="tputrace-bench-")) / "result.json"
    port = free_port()
    processes = []
    for rank in range(ranks):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks), TPUTRACE_CHIPS="1", PYTHONWARNINGS="ignore")
        command = [sys.executable, __file__, "--worker", str(out), "--sizes", *map(str, sizes)] + (["--quick"] if quick else [])
        processes.append(subprocess.Popen(command, env=env))
    codes = [process.wait() for process in processes]
    if any(codes):
        raise SystemExit(f"a rank failed: exit codes {codes}")
    return json.loads(out.read_text())


def format_size(size: int) -> str:
    return f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB"


def bandwidth(kind: str, size: int, ranks: int, seconds: float) -> float:
    return size * bus_factor(kind, ranks) / seconds / 1e9


def render(results: list[dict]) -> str:
    lines = [
        "Bus bandwidth in GB/s (nccl-tests convention) and median time per call, the slowest rank's; "
        "`tpu` is the \"tpu\" process group on tpu tensors (staged through host memory, gloo underneath), "
        "`gloo` a gloo group on CPU tensors in the same processes. An all-gather's size is the gathered output.",
        "",
        "| op | size | ranks | tpu GB/s | gloo GB/s | tpu time | gloo time | tpu/gloo |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        ranks = result["ranks"]
        by_key = {(row["kind"], row["device"], row["size"]): row["seconds"] for row in result["rows"]}
        for kind in ("all_reduce", "all_gather"):
            for size in sorted({row["size"] for row in result["rows"]}):
                tpu, cpu = by_key[(kind, "tpu", size)], by_key[(kind, "cpu", size)]
                lines.append(
                    f"| {kind} | {format_size(size)} | {ranks} | {bandwidth(kind, size, ranks, tpu):.3f} | {bandwidth(kind, size, ranks, cpu):.3f} | "
                    f"{tpu * 1e6:,.0f} µs | {cpu * 1e6:,.0f} µs | {tpu / cpu:.2f}x |"
                )
    lines += [
        "",
        "Tracing overhead on the tpu all-reduce (target ≤ 5%). End to end: "
        f"{OVERHEAD_CALLS // 2} pairs of calls, one with the collective row on and one with it off under one "
        "recorder (the order alternates); the median paired difference over the untraced median (within the machine's noise). "
        "Direct: the time tracing's own steps take inside each traced call (its row opened, stamped and handed to the trace writer), "
        "over the untraced time.",
        "",
        "| ranks | size | untraced | traced | end-to-end | tracing cost | direct overhead |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for row in result["overhead"]:
            change = row["paired"] / row["untraced"]
            direct = row["recording"] / row["untraced"]
            lines.append(
                f"| {result['ranks']} | {format_size(row['size'])} | {row['untraced'] * 1e6:,.0f} µs | {row['traced'] * 1e6:,.0f} µs | "
                f"{change:+.1%} | {row['recording'] * 1e6:.1f} µs | {direct:.2%} |"
            )
    loads = ", ".join(f"{load:.1f}" for load in os.getloadavg())
    lines += ["", f"Load average at the end ({os.cpu_count()} CPUs): {loads}; other work on the machine shows up as noise in every column."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--max-mb", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="fewer calls per size")
    parser.add_argument("--no-write", action="store_true", help="print the table without writing RESULTS.md")
    parser.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=int, nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.sizes, args.quick)
        return
    sizes = [size for size in SIZES if size <= args.max_mb << 20]
    if not sizes:
        parser.error("--max-mb must be at least 1")
    results = []
    for ranks in args.ranks:
        started = time.perf_counter()
        results.append(run_ranks(ranks, sizes, args.quick))
        print(f"{ranks} ranks: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    table = render(results)
    print(table)
    if not args.no_write:
        sys.path.insert(0, str(BENCH))
        from results import write_section  # type: ignore[import-not-found]

        write_section("Collectives", table + "\n\nWritten by `bench/collectives.py`.")


if __name__ == "__main__":
    main()
