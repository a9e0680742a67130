"""The training steps of bench/workloads.py under two revisions of the code, measured in alternating processes:
the working tree against a git revision (`--base`, HEAD by default), in torch's CPU eager, DEFER_NEVER and
DEFER_AND_FUSE.

The base revision is exported (`git archive`) to a temporary directory and its package imported in place of the
working tree's by a meta path finder installed before `tputrace` is first imported; the workloads and examples are
the working tree's on both sides. Each round runs one process per revision, in
an order that alternates from round to round; a process builds each mode's step, warms it up, and measures
windows of steady-state steps with the modes interleaved, so load from other processes falls on both revisions
and on every mode alike. A window gives wall time, the process's CPU time and the main thread's CPU time per
step. The table gives medians over every window of a revision, and for DEFER_AND_FUSE and DEFER_NEVER the median
over rounds of base / working tree (above 1: the working tree is faster) with its range. Pin the whole run to
fixed cores (`taskset -c 0,1`) to compare like with like. Writes the table to bench/RESULTS.md.
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

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
MODES = ("cpu eager", "DEFER_NEVER", "DEFER_AND_FUSE")
FIGURES = ("wall", "process", "main")
# Where each top-level name of the installed package lives in a source tree (pyproject's package-dir).
PACKAGE_DIRS = {"tputrace.backend": "backend", "tputrace.tui": "tui", "tputrace.viewers": "viewers", "tputrace": "tputrace"}


def install_tree(tree: Path) -> None:
    """Import `tputrace` from `tree` (an exported revision) instead of the installed working tree: a finder
    ahead of every other one looks each module of the package up in the tree's folder for it."""
    from importlib.machinery import ModuleSpec, PathFinder

    class TreeFinder:
        @staticmethod
        def find_spec(fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
            package = next((name for name in PACKAGE_DIRS if fullname == name or fullname.startswith(name + ".")), None)
            if package is None:
                return None
            inner = fullname[len(package) + 1:].split(".")[:-1] if fullname != package else None
            folder = tree / PACKAGE_DIRS[package]
            # The last part of the name is looked up in its parent folder (a package's own folder has its name).
            parent = folder.parent if inner is None else folder.joinpath(*inner)
            return PathFinder.find_spec(fullname, [str(parent)])

    sys.meta_path.insert(0, TreeFinder)


def measure(model: str, windows: int, window_ms: float) -> dict[str, dict[str, list[float]]]:
    """One process's windows: per mode, per figure, ms per step."""
    import time
    import warnings

    import torch

    import tputrace.backend  # noqa: F401 - registers the tpu device
    import workloads
    from tputrace.backend.compat.device_module import EagerMode, set_eager_mode

    warnings.simplefilter("ignore")
    steps = {mode: workloads.build(model, "cpu" if mode == "cpu eager" else "tpu") for mode in MODES}

    def enter(mode: str) -> None:
        if mode != "cpu eager":
            set_eager_mode(EagerMode[mode])

    def run(mode: str, count: int, start: int) -> None:
        loss = None
        for index in range(start, start + count):
            loss = steps[mode](index)
        assert loss is not None
        loss.item()
        if mode != "cpu eager":
            torch.tpu.synchronize()

    counts = {}
    for mode in MODES:
        enter(mode)
        run(mode, 3, 0)  # compiles, optimizer state
        begin = time.perf_counter()
        run(mode, 2, 3)
        counts[mode] = max(2, round(window_ms / ((time.perf_counter() - begin) / 2 * 1e3)))
    result: dict[str, dict[str, list[float]]] = {mode: {figure: [] for figure in FIGURES} for mode in MODES}
    for window in range(windows):
        for mode in MODES if window % 2 == 0 else reversed(MODES):
            enter(mode)
            count = counts[mode]
            wall, process, main = time.perf_counter(), time.process_time(), time.thread_time()
            run(mode, count, 5 + window * count)
            figures = result[mode]
            figures["wall"].append((time.perf_counter() - wall) / count * 1e3)
            figures["process"].append((time.process_time() - process) / count * 1e3)
            figures["main"].append((time.thread_time() - main) / count * 1e3)
    return result


def child(args: argparse.Namespace) -> None:
    if args.tree:
        install_tree(Path(args.tree))
    sys.path.insert(0, str(BENCH))
    print(json.dumps(measure(args.model, args.windows, args.window_ms)))


def export(revision: str, folder: Path) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)


def run_child(model: str, tree: str | None, windows: int, window_ms: float) -> dict[str, dict[str, list[float]]]:
    command = [sys.executable, __file__, "--child", "--model", model, "--windows", str(windows), "--window-ms", str(window_ms)]
    if tree:
        command += ["--tree", tree]
    output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=str(BENCH)).stdout
    return json.loads(output.strip().splitlines()[-1])


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}"


def _ratio(base_rounds: list[float], new_rounds: list[float]) -> str:
    ratios = sorted(before / after for before, after in zip(base_rounds, new_rounds))
    return f"{statistics.median(ratios):.3f} ({ratios[0]:.2f}…{ratios[-1]:.2f})"


def table(models: list[str], rounds: dict[str, list[tuple[dict, dict]]], revision: str) -> str:
    import workloads

    rows = [
        "| model | mode | revision | ms/step | process CPU ms/step | main-thread CPU ms/step | vs torch CPU (wall) | vs DEFER_NEVER (wall) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in models:
        pairs = rounds[model]
        for label, side in ((revision, 0), ("working tree", 1)):
            merged = {mode: {figure: [value for pair in pairs for value in pair[side][mode][figure]] for figure in FIGURES} for mode in MODES}
            cpu = statistics.median(merged["cpu eager"]["wall"])
            strict = statistics.median(merged["DEFER_NEVER"]["wall"])
            for mode in MODES:
                figures = merged[mode]
                wall = statistics.median(figures["wall"])
                rows.append(f"| {workloads.describe(model)} | {mode} | {label} | {wall:.2f} | {_median(figures['process'])} | {_median(figures['main'])} | "
                            f"{wall / cpu:.2f}x the time | {strict / wall:.2f}x faster |")
        for mode in MODES[1:]:
            per_round = {side: {figure: [statistics.median(pair[side][mode][figure]) for pair in pairs] for figure in FIGURES} for side in (0, 1)}
            rows.append(f"| {workloads.describe(model)} | {mode} | {revision} / working tree | {_ratio(per_round[0]['wall'], per_round[1]['wall'])} | "
                        f"{_ratio(per_round[0]['process'], per_round[1]['process'])} | {_ratio(per_round[0]['main'], per_round[1]['main'])} | | |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="the git revision to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=6, help="rounds (one process per revision each)")
    parser.add_argument("--windows", type=int, default=4, help="windows per mode in each process")
    parser.add_argument("--window-ms", type=float, default=300, help="about how long a window runs")
    parser.add_argument("--models", nargs="+", default=["small_lm", "mid_lm", "classifier"])
    parser.add_argument("--no-write", action="store_true", help="print the table, leave bench/RESULTS.md alone")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    sys.path.insert(0, str(BENCH))
    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], check=True, capture_output=True, text=True).stdout.strip()
    rounds: dict[str, list[tuple[dict, dict]]] = {model: [] for model in args.models}
    with tempfile.TemporaryDirectory(prefix="revision-pairs-") as folder:
        export(args.base, Path(folder))
        for round_index in range(args.rounds):
            for model in args.models:
                order = (folder, None) if round_index % 2 == 0 else (None, folder)
                results = {tree: run_child(model, tree, args.windows, args.window_ms) for tree in order}
                rounds[model].append((results[folder], results[None]))
                print(f"round {round_index + 1}/{args.rounds} {model} done", file=sys.stderr)
    text = table(args.models, rounds, revision)
    print(text)
    if args.no_write:
        return
    from results import write_section

    write_section(
        "Revision pairs (bench/revision_pairs.py)",
        f"The working tree against revision {revision}: {args.rounds} rounds of one process per revision, in alternating order; "
        f"in each process {args.windows} windows of about {args.window_ms:.0f} ms of steady-state steps per mode, the modes "
        f"interleaved; {os.cpu_count()} CPUs, shared with other work while measured. ms/step and CPU: medians over all "
        "windows of a revision; the `/ working tree` rows: the median over rounds of the base revision's figure over the "
        "working tree's (above 1: the working tree is faster), with the range.\n\n"
        f"{text}",
    )


if __name__ == "__main__":
    main()
