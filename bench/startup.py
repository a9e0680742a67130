"""Startup benchmark: how long fresh processes take to load the tpu backend.

Times, as the wall time of fresh processes (medians of `--rounds`):

- `import tputrace.backend` (`python -c`), and `import torch, jax, jax.numpy` as the floor;
- `tputrace run` of a tiny script (one op on the tpu, its trace written);
- a host-only spawn child (`multiprocessing` spawn context; the script imports torch, the child does
  nothing), as its parent times `start()` to `join()`, under plain Python and under `tputrace run`
  (whose spawn children load the backend before the script is re-imported);
- a script's first tpu op, a first MLP training step (its SGD update written out, or AdamW) and the
  GPT example's first forward and backward in each eager mode: the whole process, and beside it what the
  script times itself from after its imports to `loss.item()`, with the modules that part loads;
- the time to a first report: `tputrace run` of a small training script (a one-layer
  `nn.TransformerEncoderLayer` text classifier with a padding mask and dropout, AdamW, three steps) and
  then `tputrace report` of its trace, one process after the other, with the report's own share.

With `--base DIR` (another checkout, e.g. a worktree of an older commit) every case also runs there,
interleaved with this tree's in each round, so the two columns share the host's state. Results go to
the `## Startup` section of bench/RESULTS.md. Beside the wall time of a whole process, its CPU time (user +
system, its children included) is given: on a host shared with other work it varies less.

    python bench/startup.py [--base DIR] [--rounds N] [--only TEXT ...] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from results import write_section

REPO_ROOT = Path(__file__).resolve().parent.parent

TINY_SCRIPT = """\
import torch
print((torch.ones(3, device="tpu") * 2).sum().item())
"""

SPAWN_SCRIPT = """\
import multiprocessing
import sys
import time

import torch  # a training script's imports: the child imports them again


def child() -> None:
    pass


if __name__ == "__main__":
    process = multiprocessing.get_context("spawn").Process(target=child)
    start = time.perf_counter()
    process.start()
    process.join()
    elapsed = time.perf_counter() - start
    if process.exitcode != 0:
        sys.exit(f"the spawn child exited with {process.exitcode}")
    with open(sys.argv[1], "w") as out:
        out.write(str(elapsed))
"""

# A script's first steps on the tpu, after its imports: what they take and the modules they load go to
# argv[1] as JSON.
FIRST_STEPS_SCRIPT = """\
import json
import sys
import time

import torch
import tputrace.backend

case = sys.argv[2]
modules_before = len(sys.modules)
start, cpu_start = time.perf_counter(), time.process_time()
if case == "op":
    x = torch.ones(4, 4, device="tpu")
    print(((x + 1) @ x).sum().item())
elif case in ("mlp_sgd", "mlp_adamw"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3) if case == "mlp_adamw" else None
    inputs, labels = torch.randn(32, 64).to("tpu"), torch.randint(0, 10, (32,)).to("tpu")
    loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()
    if optimizer is None:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= 1e-3 * parameter.grad
    else:
        optimizer.step()
    print(loss.item())
else:
    sys.path.insert(0, "examples")
    import gpt_train

    torch.tpu.set_eager_mode(case.removeprefix("gpt_"))
    torch.manual_seed(0)
    config = gpt_train.GPTConfig()
    model = gpt_train.GPT(config).to("tpu")
    tokens, targets = gpt_train.synthetic_batches(config, 4, 1)[0]
    loss = model(tokens.to("tpu"), targets.to("tpu"))[1]
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    print(loss.item())
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
with open(sys.argv[1], "w") as out:
    json.dump({"seconds": elapsed, "cpu_seconds": cpu, "modules": len(sys.modules) - modules_before}, out)
"""

# A small training script: a text classifier (embedding, one encoder layer, mean over the unpadded tokens).
CLASSIFIER_SCRIPT = REPO_ROOT / "bench" / "text_classifier.py"

TPUTRACE_MAIN = "import sys; from tputrace.cli.main import main; sys.exit(main(sys.argv[1:]))"
FIRST_REPORT = "first report: `tputrace run` of a text classifier's 3 training steps, then `tputrace report`"


def _environment(root: Path) -> dict[str, str]:
    """The environment of a process that imports tputrace from `root` first."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    return environment


@dataclass(frozen=True)
class Timing:
    """One fresh process: its wall time, and where measured its CPU time and what the script timed itself."""

    wall: float
    cpu: float | None = None
    in_script: float | None = None  # the script's own timing of its first steps, after its imports
    in_script_cpu: float | None = None  # their CPU time (all the process's threads)
    modules: int | None = None  # the modules those steps loaded
    last_wall: float | None = None  # of the wall time, the last of several processes' (a report after its run)
    last_cpu: float | None = None


def _run(command: list[str], root: Path) -> Timing:
    """Wall and CPU time of a fresh process (and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, env=_environment(root), cwd=root, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} ... failed in {root}: {result.stderr.strip().splitlines()[-1:]}")
    return Timing(wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))


def _spawn_child(command_prefix: list[str], root: Path, work: Path) -> Timing:
    """The spawn child's start to exit, as its parent times it."""
    script, out = work / "spawn_child.py", work / "spawn_child.txt"
    _run([*command_prefix, str(script), str(out)], root)
    return Timing(float(out.read_text()))


def _first_steps(case: str, root: Path, work: Path) -> Timing:
    """A script's first steps on the tpu: the whole process, and the steps as the script times them."""
    out = work / "first_steps.json"
    process = _run([sys.executable, str(work / "first_steps.py"), str(out), case], root)
    measured = json.loads(out.read_text())
    return Timing(process.wall, process.cpu, measured["seconds"], measured["cpu_seconds"], measured["modules"])


def _first_report(root: Path, work: Path) -> Timing:
    """`tputrace run` of the classifier script, then `tputrace report` of its trace: both processes' sum."""
    trace = str(work / "classifier.tptrace")
    run = _run([sys.executable, "-c", TPUTRACE_MAIN, "run", "--no-summary", "--force", "-o", trace, str(CLASSIFIER_SCRIPT)], root)
    report = _run([sys.executable, "-c", TPUTRACE_MAIN, "report", trace], root)
    return Timing(run.wall + report.wall, (run.cpu or 0.0) + (report.cpu or 0.0), last_wall=report.wall, last_cpu=report.cpu)


def _cases(work: Path) -> dict[str, Callable[[Path], Timing]]:
    (work / "tiny.py").write_text(TINY_SCRIPT)
    (work / "spawn_child.py").write_text(SPAWN_SCRIPT)
    (work / "first_steps.py").write_text(FIRST_STEPS_SCRIPT)
    trace = str(work / "tiny.tptrace")
    run_prefix = [sys.executable, "-c", TPUTRACE_MAIN, "run", "--no-summary", "-o", str(work / "spawn.tptrace")]
    return {
        "`import torch, jax, jax.numpy` (floor)": lambda root: _run([sys.executable, "-c", "import torch, jax, jax.numpy"], root),
        "`import tputrace.backend`": lambda root: _run([sys.executable, "-c", "import tputrace.backend"], root),
        "`tputrace run` of a one-op script (trace written)": lambda root: _run(
            [sys.executable, "-c", TPUTRACE_MAIN, "run", "--no-summary", "-o", trace, str(work / "tiny.py")], root
        ),
        "host-only spawn child, plain Python": lambda root: _spawn_child([sys.executable], root, work),
        "host-only spawn child, under `tputrace run`": lambda root: _spawn_child(run_prefix, root, work),
        "a script's first tpu op (`(x + 1) @ x`, `.item()`)": lambda root: _first_steps("op", root, work),
        "a first MLP training step, SGD update written out": lambda root: _first_steps("mlp_sgd", root, work),
        "a first MLP training step, AdamW": lambda root: _first_steps("mlp_adamw", root, work),
        "GPT example's first forward and backward, DEFER_NEVER": lambda root: _first_steps("gpt_DEFER_NEVER", root, work),
        "GPT example's first forward and backward, DEFER_AND_FUSE": lambda root: _first_steps("gpt_DEFER_AND_FUSE", root, work),
        FIRST_REPORT: lambda root: _first_report(root, work),
    }


def measure(roots: dict[str, Path], rounds: int, only: list[str] | None = None) -> dict[str, dict[str, list[Timing]]]:
    """Each case's timings per checkout (the cases whose name contains one of `only`, if given), the
    checkouts alternating within each round."""
    times: dict[str, dict[str, list[Timing]]] = {}
    with tempfile.TemporaryDirectory() as directory:
        cases = {case: run for case, run in _cases(Path(directory)).items() if not only or any(text in case for text in only)}
        if not cases:
            raise SystemExit(f"--only {only}: no case's name contains one of them")
        for case in cases:
            times[case] = {name: [] for name in roots}
        for round_number in range(rounds):
            order = list(roots.items())
            if round_number % 2:
                order.reverse()
            for case, run in cases.items():
                for name, root in order:
                    times[case][name].append(run(root))
            print(f"round {round_number + 1}/{rounds} done", file=sys.stderr)
    return times


def _cell(timings: list[Timing]) -> str:
    walls = [timing.wall for timing in timings]
    parts = [f"{statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f})"]
    cpus = [timing.cpu for timing in timings if timing.cpu is not None]
    if cpus:
        parts.append(f"CPU {statistics.median(cpus):.2f} s")
    in_script = [timing.in_script for timing in timings if timing.in_script is not None]
    if in_script:
        in_script_cpu = statistics.median(timing.in_script_cpu for timing in timings if timing.in_script_cpu is not None)
        parts.append(f"in script {statistics.median(in_script):.2f} s ({min(in_script):.2f}-{max(in_script):.2f}), CPU {in_script_cpu:.2f} s")
    modules = [timing.modules for timing in timings if timing.modules is not None]
    if modules:
        parts.append(f"{statistics.median(modules):.0f} modules")
    last_walls = [timing.last_wall for timing in timings if timing.last_wall is not None]
    last_cpus = [timing.last_cpu for timing in timings if timing.last_cpu is not None]
    if last_walls and last_cpus:
        parts.append(f"of which the report {statistics.median(last_walls):.2f} s, CPU {statistics.median(last_cpus):.2f} s")
    return "; ".join(parts)


def render(times: dict[str, dict[str, list[Timing]]], rounds: int, load: float) -> str:
    names = list(next(iter(times.values())))
    header = "| case | " + " | ".join(f"{name}: wall median (range)" for name in names) + " |"
    lines = [header, "|---" * (len(names) + 1) + "|"]
    for case, per_root in times.items():
        lines.append(f"| {case} | " + " | ".join(_cell(timings) for timings in per_root.values()) + " |")
    notes = (
        f"Fresh processes, {rounds} rounds, the checkouts alternating within each round; CPU: median user + "
        "system time of the process and its children; in script: what a script timed itself from after its "
        "imports to `.item()` (wall, and CPU of all its threads), with the modules loaded in that time. 1-minute load average "
        f"{load:.1f} at the start (2 cores shared with other work)."
    )
    return "\n".join([*lines, "", notes])


def _label(checkout: Path) -> str:
    """A checkout's column title: its commit where git knows it, else its path."""
    result = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f"base {result.stdout.strip()}" if result.returncode == 0 else f"base {checkout}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="another checkout to time beside this one (its tputrace importable from it)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", action="append", help="run only the cases whose name contains this text (repeatable)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    arguments = parser.parse_args()
    if arguments.rounds < 1:
        parser.error("--rounds must be at least 1")
    roots = {"this tree": REPO_ROOT}
    if arguments.base is not None:
        if not (arguments.base / "tputrace" / "__init__.py").is_file():
            parser.error(f"--base {arguments.base}: no tputrace package there")
        roots = {_label(arguments.base): arguments.base.resolve(), **roots}
    load = os.getloadavg()[0]
    body = render(measure(roots, arguments.rounds, arguments.only), arguments.rounds, load)
    print(body)
    if not arguments.no_write:
        write_section("Startup", body)


if __name__ == "__main__":
    main()
