"""Import throughput and memory of `tputrace import`: capture events per CPU second and peak RSS, per format,
at capture sizes ten times apart (so that one sees whether memory grows with the capture).

Captures are real, made here, then scaled: `jax.profiler.trace` of some steps of a jitted training step
(XProf `xplane.pb`, XLA:CPU), the same of a step sharded over 4 XLA:CPU devices whose gradient goes through 16
all-reduces (collectives held until the rank ends, to match each chip's calls) and torch.profiler's Chrome JSON of
some training steps of a small CPU model;
each capture's events are repeated, shifted by the capture's span each time, until it holds the wanted
number of events (ProfilerStep numbers keep counting, XLA program runs get run ids of their own). Each import runs in a fresh process; its CPU time
is that process's user + system time (the writer's thread included), its wall time the import call's, its
peak RSS its `VmHWM` (the interpreter and tputrace included; Linux only), and the time its main thread
waited for a CPU the run-queue delay of `/proc/self/task/<id>/schedstat`. Each is the median of
`--repeats` imports (other work on the host makes single runs noisy). With `--baseline REF`, the code of
that git ref (exported to a temporary folder) imports the same captures in the same run, for a before and
after, and the tables the two write are compared row by row.

Where an XProf event's CPU time goes, on the capture of 10^6 events, each stage in a fresh process (the imports
without inserts and without indexes the median of `--repeats` runs, as the whole import's): reading
the file's events (the walk that finds each event's bytes, then that and the decoding into columns), the
import with the rows built but not inserted (the writer's inserts skipped), the import without the indexes
built at its end, and the whole import. Likewise for a torch.profiler JSON event: the importer's first pass over
the raw text, decoding the events as the second pass does, then the same three imports.

Run: `python bench/import_speed.py [--events 100000 1000000] [--more-xprof-events 10000000] [--repeats 3]
[--baseline main]`; writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path
from typing import Any

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

# The same on 4 virtual XLA:CPU devices, the gradient through 16 all-reduces a step (a collective in about 30 events).
JAX_CHIPS_CAPTURE = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(jax.devices(), ("d",))

    @jax.jit
    def step(w, x):
        def shard(w, x):
            grad = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)
            for _ in range(16):
                grad = jnp.tanh(jax.lax.psum(grad, "d"))
            return w - 0.1 * grad
        return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P("d")), out_specs=P())(w, x)

    w, x = jnp.ones((32, 32)), jnp.ones((32, 32))
    step(w, x).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i in range(int(sys.argv[2])):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, x)
        w.block_until_ready()
""")
CHIPS_ENV = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}

TORCH_CAPTURE = textwrap.dedent("""
    import sys, torch
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True,
                 profile_memory=True) as prof:
        for _ in range(int(sys.argv[2])):
            model(x).sum().backward()
    prof.export_chrome_trace(sys.argv[1])
""")

# Run in a fresh process: the import, then its CPU time, peak RSS, and how long its main thread waited for a CPU.
IMPORT = textwrap.dedent("""
    import json, resource, sys, threading, time
    from tputrace.importers.run import import_captures

    def waited_s():  # the main thread's time runnable but not running (/proc/.../schedstat's second field)
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as stat:
            return int(stat.read().split()[1]) / 1e9

    started, waited = time.perf_counter(), waited_s()
    result = import_captures([sys.argv[1]], sys.argv[2])
    wall_s, waited = time.perf_counter() - started, waited_s() - waited
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # VmHWM: this process's own peak (ru_maxrss would carry over the parent's peak across exec on Linux).
    status = open("/proc/self/status").read().split("VmHWM:")[1].split()
    print(json.dumps({"rows": result.rows, "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall_s,
                      "waited_s": waited, "peak_mib": int(status[0]) / 1024}))
""")
# Run in a fresh process: CPU time of one pass over an xplane.pb's events, walking only or decoding too; and of
# the second pass's decoding, which reads a line's stats only where it holds an XLA op (an event with an `hlo_op`).
READ_EVENTS = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from tputrace.importers.wire import XSpaceFile
    from tputrace.importers.xevents import decode_run
    from tputrace.xplane_proto import messages

    classes = messages()
    with XSpaceFile(Path(sys.argv[1])) as space:
        lines = []
        for span in space.planes():
            plane, spans = space.plane(span, classes["XPlane"])
            op_stats = {key for key, meta in plane.stat_metadata.items() if meta.name == "hlo_op"}
            lines += [(space.line_head(line), op_stats) for line in spans]
        start = time.process_time()
        events = sum(len(run.fields) for line, _ in lines for run in space.event_runs(line))
        walk_s = time.process_time() - start
        with_ops = set()
        start = time.process_time()
        for line, op_stats in lines:
            for run in space.event_runs(line):
                if len(decode_run(run, classes["XLine"], classes["XEvent"]).with_stat(op_stats)):
                    with_ops.add(line.span)
        read_s = time.process_time() - start
        start = time.process_time()
        for line, _ in lines:
            for run in space.event_runs(line):
                decode_run(run, classes["XLine"], classes["XEvent"], line.span in with_ops)
        print(json.dumps({"events": events, "walk_s": walk_s, "read_s": read_s,
                          "second_read_s": time.process_time() - start}))
""")
# Run in a fresh process: the import with its rows built and queued, but not inserted into SQLite.
IMPORT_WITHOUT_INSERTS = textwrap.dedent("""
    import json, resource, sys
    from tputrace.store.writer import TraceWriter
    TraceWriter._insert = lambda self, connection, table, rows: None
    from tputrace.importers.run import import_captures

    import_captures([sys.argv[1]], sys.argv[2])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps(usage.ru_utime + usage.ru_stime))
""")
# Run in a fresh process: the import without building the indexes at its end.
IMPORT_WITHOUT_INDEXES = textwrap.dedent("""
    import json, resource, sys
    import tputrace.store.writer
    tputrace.store.writer.build_indexes = lambda connection, statements, budget_s: []
    from tputrace.importers.run import import_captures

    import_captures([sys.argv[1]], sys.argv[2])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps(usage.ru_utime + usage.ru_stime))
""")
# Run in a fresh process: CPU time of the torch.profiler importer's first pass over a JSON capture's raw text, and of
# decoding its events (`json.loads` of each block, then freeing them), as the second pass does.
READ_JSON = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from tputrace.importers import chrome_scan, kineto
    from tputrace.importers.json_events import event_lists, read_head
    from tputrace.importers.window_ranges import WindowRanges

    path = Path(sys.argv[1])
    parse_float = kineto.exact_or_float(kineto.exact_offset(read_head(path)))
    start = time.process_time()
    chrome_scan.scan_text(path, parse_float, WindowRanges(), set(), {}, set())
    scan_s = time.process_time() - start
    start = time.process_time()
    events = sum(len(events) for events in event_lists(path, parse_float=parse_float))
    print(json.dumps({"events": events, "scan_s": scan_s, "decode_s": time.process_time() - start}))
""")
STAGE_EVENTS = 1_000_000
# The interpreter and tputrace's imports alone, subtracted from each import's CPU time.
STARTUP = "import resource, json, tputrace.importers.run; u = resource.getrusage(resource.RUSAGE_SELF); " \
          "print(json.dumps(u.ru_utime + u.ru_stime))"

SEED_STEPS = 20
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _capture(script: str, target: Path, steps: int, folder: Path, env: dict[str, str] | None = None) -> None:
    path = folder / "capture.py"
    path.write_text(script)
    subprocess.run([sys.executable, str(path), str(target), str(steps)], check=True, capture_output=True,
                   env={**os.environ, **(env or {})})


def scale_chrome_json(seed: Path, target: Path, events: int) -> int:
    """Write `target`: the seed's events repeated (shifted by its span) up to `events` timed events."""
    document = json.loads(seed.read_text())
    header = {key: value for key, value in document.items() if key != "traceEvents"}
    untimed = [event for event in document["traceEvents"] if event.get("ph") == "M"]
    timed = [event for event in document["traceEvents"] if event.get("ph") != "M"]
    start = min(event["ts"] for event in timed)
    span = max(event["ts"] + event.get("dur", 0) for event in timed) - start + 1
    steps = sum(str(event.get("name", "")).startswith("ProfilerStep#") for event in timed)
    written = 0
    with target.open("w") as stream:
        stream.write(json.dumps(header, indent=2)[:-2] + ',\n  "traceEvents": [\n')
        parts = [json.dumps(event, indent=2) for event in untimed]
        repeat = 0
        while written < events:
            for event in timed[: events - written]:
                copy = dict(event, ts=event["ts"] + repeat * span)
                name = str(copy.get("name", ""))
                if name.startswith("ProfilerStep#"):
                    copy["name"] = f"ProfilerStep#{int(name[13:]) + repeat * steps}"
                parts.append(json.dumps(copy, indent=2))
                written += 1
            stream.write(",\n".join(parts))
            parts = [""]
            repeat += 1
        stream.write("\n]}\n")
    return written + len(untimed)


def scale_xplane(seed: Path, target: Path, events: int) -> int:
    """Write `target`: every line's events repeated (shifted by the capture's span) up to `events` events; each repeat's
    program runs get run ids of their own (as a longer capture's runs have)."""
    from tputrace.xplane_proto import messages

    space = messages()["XSpace"]()
    space.ParseFromString(seed.read_bytes())
    lines = [line for plane in space.planes for line in plane.lines if line.events]
    total = sum(len(line.events) for line in lines)
    ends = [line.timestamp_ns * 1000 + event.offset_ps + event.duration_ps for line in lines for event in line.events]
    starts = [line.timestamp_ns * 1000 + event.offset_ps for line in lines for event in line.events]
    span_ps = max(ends) - min(starts) + 1
    run_stats = [{key for key, meta in plane.stat_metadata.items() if meta.name == "run_id"} for plane in space.planes]
    run_span = 1 + max((getattr(stat, stat.WhichOneof("value")) for plane, ids in zip(space.planes, run_stats)
                        for line in plane.lines for event in line.events for stat in event.stats
                        if stat.metadata_id in ids and stat.WhichOneof("value") in ("int64_value", "uint64_value")),
                       default=0)
    repeats = -(-events // total)
    for plane, ids in zip(space.planes, run_stats):
        for line in plane.lines:
            originals = [(event.SerializeToString(), event.offset_ps) for event in line.events]
            for repeat in range(1, repeats):
                for data, offset in originals:
                    copy = line.events.add()
                    copy.ParseFromString(data)
                    copy.offset_ps = offset + repeat * span_ps
                    for stat in copy.stats:
                        kind = stat.WhichOneof("value")
                        if stat.metadata_id in ids and kind in ("int64_value", "uint64_value"):
                            setattr(stat, kind, getattr(stat, kind) + repeat * run_span)
    target.write_bytes(space.SerializeToString())
    return total * repeats


def _median_s(code: str, capture: Path, output: Path, repeats: int, startup_s: float) -> float:
    """The median CPU time of `repeats` runs of `code` on `capture`, start-up taken off (as the imports' own)."""
    return statistics.median(_run_json(code, str(capture), str(output)) for _ in range(repeats)) - startup_s


def _stages(capture: Path, output: Path, events: int, import_s: float, startup_s: float, repeats: int) -> list[str]:
    """Table rows: the CPU time per event of each stage of importing `capture` (whose import took `import_s`)."""
    read = _run_json(READ_EVENTS, str(capture))
    built_s = _median_s(IMPORT_WITHOUT_INSERTS, capture, output, repeats, startup_s)
    unindexed_s = _median_s(IMPORT_WITHOUT_INDEXES, capture, output, repeats, startup_s)
    walk_us = read["walk_s"] / read["events"] * 1e6
    decode_us = (read["read_s"] - read["walk_s"]) / read["events"] * 1e6
    second_decode_us = (read["second_read_s"] - read["walk_s"]) / read["events"] * 1e6
    built_us = built_s / events * 1e6
    unindexed_us = unindexed_s / events * 1e6
    total_us = import_s / events * 1e6
    parts = [
        ("finding each event's bytes (the line walk), 2 passes", 2 * walk_us),
        ("decoding the events into columns, first pass", decode_us),
        ("decoding the events into columns, second pass (stats only of lines with XLA ops)", second_decode_us),
        ("the rest of building rows (metadata, steps, XLA ops, queueing)",
         built_us - 2 * walk_us - decode_us - second_decode_us),
        ("SQLite: inserting the rows (in the writer's thread)", unindexed_us - built_us),
        ("SQLite: building the indexes at the end", total_us - unindexed_us),
    ]
    return [f"| {name} | {us:.2f} | {us / total_us:.0%} |" for name, us in parts] + \
        [f"| the whole import | {total_us:.2f} | 100% |"]


def _json_stages(capture: Path, output: Path, events: int, import_s: float, startup_s: float,
                 repeats: int) -> list[str]:
    """Table rows: the CPU time per event of each stage of importing the torch.profiler JSON `capture`."""
    read = _run_json(READ_JSON, str(capture))
    built_s = _median_s(IMPORT_WITHOUT_INSERTS, capture, output, repeats, startup_s)
    unindexed_s = _median_s(IMPORT_WITHOUT_INDEXES, capture, output, repeats, startup_s)
    scan_us, decode_us = read["scan_s"] / events * 1e6, read["decode_s"] / events * 1e6
    built_us, unindexed_us, total_us = built_s / events * 1e6, unindexed_s / events * 1e6, import_s / events * 1e6
    parts = [
        ("the first pass over the raw text (start, steps, user frames, ranges)", scan_us),
        ("decoding the events (`json.loads` of each block, and freeing them)", decode_us),
        ("the rest of building rows (nesting, shapes, frames, modules, queueing)", built_us - scan_us - decode_us),
        ("SQLite: inserting the rows (in the writer's thread)", unindexed_us - built_us),
        ("SQLite: building the indexes at the end", total_us - unindexed_us),
    ]
    return [f"| {name} | {us:.2f} | {us / total_us:.0%} |" for name, us in parts] + \
        [f"| the whole import | {total_us:.2f} | 100% |"]


def differing_table(first: Path, second: Path) -> str | None:
    """The first table (by name) in which two traces do not hold the same rows in the same order, None where none
    does; `meta` (which holds when each was made) is left out."""
    import sqlite3

    connections = [sqlite3.connect(path) for path in (first, second)]
    try:
        tables = [[name for (name,) in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'meta' ORDER BY name")]
            for connection in connections]
        if tables[0] != tables[1]:
            return "sqlite_master"
        for table in tables[0]:
            counts = [connection.execute(f"SELECT count(*) FROM {table}").fetchone() for connection in connections]
            rows = [connection.execute(f"SELECT * FROM {table} ORDER BY rowid") for connection in connections]
            if counts[0] != counts[1] or any(left != right for left, right in zip(*rows)):
                return table
        return None
    finally:
        for connection in connections:
            connection.close()


def _run_json(code: str, *args: str, root: Path = ROOT) -> Any:
    environment = {**ENV, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True,
                          env=environment, cwd=root)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _export(ref: str, folder: Path) -> Path:
    """The `tputrace` package of git ref `ref`, written under `folder` (the root to import it from)."""
    archive = subprocess.run(["git", "archive", "--format=tar", ref, "tputrace"], check=True, capture_output=True,
                             cwd=ROOT).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def _imports(capture: Path, output: Path, repeats: int, startup_s: float, root: Path) -> dict[str, float]:
    """The median CPU time (start-up taken off), wall time and peak RSS of `repeats` imports of `capture`."""
    runs = [_run_json(IMPORT, str(capture), str(output), root=root) for _ in range(repeats)]
    return {"rows": runs[0]["rows"], "cpu_s": statistics.median(run["cpu_s"] for run in runs) - startup_s,
            "wall_s": statistics.median(run["wall_s"] for run in runs),
            "waited_s": statistics.median(run.get("waited_s", 0.0) for run in runs),
            "peak_mib": statistics.median(run["peak_mib"] for run in runs)}


def _row(fmt: str, events: int, capture: Path, measured: dict[str, float], code: str) -> str:
    cpu_s, wall_s = measured["cpu_s"], measured["wall_s"]
    return (f"| {fmt} | {code} | {events:,} | {capture.stat().st_size / 2**20:,.0f} MiB | {measured['rows']:,} | "
            f"{cpu_s:.2f} s | {cpu_s / events * 1e6:.2f} | {events / cpu_s:,.0f} | {wall_s:.2f} s | "
            f"{measured['waited_s']:.2f} s | {events / wall_s:,.0f} | {events / (wall_s - measured['waited_s']):,.0f} | "
            f"{measured['peak_mib']:.0f} MiB |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, nargs="+", default=[100_000, 1_000_000],
                        help="capture sizes in events")
    parser.add_argument("--more-xprof-events", type=int, nargs="*", default=[],
                        help="further sizes for the XProf captures only (a JSON capture of 10^7 events is ~4 GB)")
    parser.add_argument("--repeats", type=int, default=3, help="imports per capture and code (medians are shown)")
    parser.add_argument("--baseline", help="git ref whose importer also imports each capture (before and after)")
    args = parser.parse_args()
    rows = []
    stages: list[str] = []
    json_stages: list[str] = []
    differing: list[str] = []  # the captures whose tables the baseline's import and this tree's write differently
    startup_s = min(_run_json(STARTUP) for _ in range(3))
    with tempfile.TemporaryDirectory() as temp:
        folder = Path(temp)
        codes = [("this tree", ROOT)]
        if args.baseline:
            baseline = _export(args.baseline, folder / "baseline")
            codes.insert(0, (f"`{args.baseline}`", baseline))
        _capture(JAX_CAPTURE, folder / "seed-logdir", SEED_STEPS, folder)
        _capture(JAX_CHIPS_CAPTURE, folder / "chips-logdir", SEED_STEPS, folder, CHIPS_ENV)
        _capture(TORCH_CAPTURE, folder / "seed.json", SEED_STEPS, folder)
        seed_xplane = next((folder / "seed-logdir").rglob("*.xplane.pb"))
        for fmt, seed, scale, name in (
                ("XProf xplane.pb (jax.profiler)", seed_xplane, scale_xplane, "host.xplane.pb"),
                ("XProf xplane.pb, 4 chips, all-reduces", next((folder / "chips-logdir").rglob("*.xplane.pb")),
                 scale_xplane, "chips.xplane.pb"),
                ("torch.profiler JSON", folder / "seed.json", scale_chrome_json, "profile.json")):
            for wanted in args.events + (args.more_xprof_events if scale is scale_xplane else []):
                capture = folder / f"{wanted}-{name}"
                events = scale(seed, capture, wanted)
                outputs = []
                for index, (code, root) in enumerate(codes):
                    outputs.append(folder / f"out-{index}.tptrace")
                    measured = _imports(capture, outputs[-1], args.repeats, startup_s, root)
                    rows.append(_row(fmt, events, capture, measured, code))
                    print(rows[-1], flush=True)
                table = differing_table(*outputs) if len(outputs) > 1 else None
                if table:
                    differing.append(f"{fmt}, {events:,} events (`{table}`)")
                if fmt.endswith("(jax.profiler)") and wanted == STAGE_EVENTS:
                    stages = _stages(capture, outputs[-1], events, measured["cpu_s"], startup_s, args.repeats)
                if scale is scale_chrome_json and wanted == STAGE_EVENTS:
                    json_stages = _json_stages(capture, outputs[-1], events, measured["cpu_s"], startup_s, args.repeats)
                capture.unlink()
    body = "\n".join([
        "Capture events imported per CPU second by `tputrace import` (the process's user + system time, its",
        f"{startup_s:.2f} s of interpreter and module start-up taken off) and per wall second, and the import",
        f"process's peak RSS; each the median of {args.repeats} imports. Captures are real ones of a few steps,",
        "their events repeated up to the size shown. Memory that stays put as the capture grows tenfold is what",
        "streaming buys." + (f" The `{args.baseline}` rows are that ref's importer on the same captures, in the same"
                             " run; the tables the two write (every row, in order; `meta` aside) are "
                             + (f"not the same for: {'; '.join(differing)}." if differing else "the same for every capture.")
                             if args.baseline else ""),
        "Waiting for a CPU: the time the import's main thread was ready to run while the host's cores ran other",
        "work (from `/proc/.../schedstat`). The wall time less it is a rough figure for an idle host: the writer",
        "thread's waits for a core are not taken off (the main thread may be waiting on that thread meanwhile).",
        "",
        "| format | code | events | capture | rows written | CPU time | CPU µs/event | events/CPU s | wall time "
        "| waiting for a CPU | events/wall s | events/wall s less waiting | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        *([
            "",
            f"Where an XProf event's CPU time goes ({STAGE_EVENTS:,} events; µs per event; the walk and the",
            "decoding run once per pass, and the import makes two: the first for the step markers and compiles;",
            "the second decodes a host line's stats only where the first found an XLA op on it):",
            "",
            "| stage | µs per event | share |",
            "|---|---|---|",
            *stages,
        ] if stages else []),
        *([
            "",
            f"Where a torch.profiler JSON event's CPU time goes ({STAGE_EVENTS:,} events; µs per event; the first pass",
            "reads the raw text with regular expressions, the second decodes every event and builds the rows):",
            "",
            "| stage | µs per event | share |",
            "|---|---|---|",
            *json_stages,
        ] if json_stages else []),
    ])
    write_section(SECTION, body)


if __name__ == "__main__":
    main()
