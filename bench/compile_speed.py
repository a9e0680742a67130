"""XLA:CPU compile time of the fused programs of three small training scripts, this checkout's lowerings against
another checkout's (`--base-python`), side by side.

    python bench/compile_speed.py --base-python /work/main/.venv/bin/python [--rounds 3] [--models classifier gpt cnn]
    python bench/compile_speed.py --base-xla-flags=--xla_backend_extra_options= [--new-xla-flags FLAGS] [--rounds 3]
    python bench/compile_speed.py --options default= split1=xla_cpu_parallel_codegen_split_count=1 [--rounds 3]
    python bench/compile_speed.py --origins [--models classifier cnn]

Each round starts one worker process per side, in alternating order: the worker imports the backend its
Python finds (the base Python's own checkout, or this one), runs each model's first steps in DEFER_AND_FUSE,
keeping every fused program's function and inputs, then traces, lowers and compiles each program again from
scratch, one at a time, timing each with process CPU time (XLA's compile threads included) and wall time, and
the compiled program's call (the median process CPU time of a call on inputs already on the chip). It also gives the wall and CPU time from the worker's start to the end of each model's first step. Programs are
paired by model and compile order. `--base-xla-flags` and `--new-xla-flags` add flags to a side's `XLA_FLAGS`
(options XLA reads only from there, such as `--xla_backend_extra_options`); without `--base-python` both sides
are this checkout. The models: a one-layer `nn.TransformerEncoderLayer` text classifier with
a padding mask and dropout (AdamW), `examples/gpt_train.py`'s GPT (6 layers, width 256, AdamW, clipping),
`examples/cnn_train.py`'s ResNet (SGD with momentum) and a sequence tagger (an embedding, a two-layer
bidirectional `nn.LSTM` of width 128 over 20 tokens and a linear head, Adam).

With `--origins` it counts each program's kernels on this checkout by kind (loop fusions, which XLA:CPU compiles
through LLVM, against library fusions such as YNNPACK's) and by the ATen op whose lowering made them (the op named
in the fusion's metadata, its root's), to show which lowerings make a program's kernels.

With `--options NAME=OPTION=VALUE,...` it compares XLA compile options on this checkout instead: each round's
worker captures the programs once, then compiles each program under every option set in turn (the order
alternating from program to program), passing the options to that compile only (`Lowered.compile`), and
times the compile (process CPU and wall) and the compiled program's run (the median wall time of a call on
inputs already on the chip), so that an option's compile saving and its run-time cost are read side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
EXAMPLES = BENCH.parent / "examples"
MODELS = ("classifier", "gpt", "cnn", "tagger")
STEPS = 3
WORKER_START = time.perf_counter()
WORKER_START_CPU = time.process_time()


def _classifier_steps(steps: int) -> None:
    import text_classifier

    def done(step: int, loss: Any) -> None:
        loss.item()
        _first_step_done("classifier", step)

    text_classifier.train(steps, done)


def _gpt_steps(steps: int) -> None:
    import gpt_train
    import torch

    config = gpt_train.GPTConfig()
    torch.manual_seed(0)
    model = gpt_train.GPT(config).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    for step, (tokens, targets) in enumerate(gpt_train.synthetic_batches(config, 4, steps)):
        gpt_train.train_step(model, model, optimizer, tokens.to("tpu"), targets.to("tpu")).item()
        _first_step_done("gpt", step)


def _cnn_steps(steps: int) -> None:
    import cnn_train
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = cnn_train.SmallResNet().to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step, (images, labels) in enumerate(cnn_train.synthetic_batches(steps)):
        loss = F.cross_entropy(model(images.to("tpu")), labels.to("tpu"))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()
        _first_step_done("cnn", step)


def _tagger_steps(steps: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self, vocab: int = 1000, width: int = 128, tags: int = 17) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, 64)
            self.lstm = nn.LSTM(64, width, num_layers=2, batch_first=True, bidirectional=True)
            self.head = nn.Linear(2 * width, tags)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.lstm(self.embed(tokens))[0])

    torch.manual_seed(0)
    model = Tagger().to("tpu")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(steps):
        tokens, tags = torch.randint(0, 1000, (16, 20)).to("tpu"), torch.randint(0, 17, (16, 20)).to("tpu")
        loss = F.cross_entropy(model(tokens).flatten(0, 1), tags.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()
        _first_step_done("tagger", step)


RUNNERS: dict[str, Callable[[int], None]] = {
    "classifier": _classifier_steps, "gpt": _gpt_steps, "cnn": _cnn_steps, "tagger": _tagger_steps,
}
_first_steps: dict[str, tuple[float, float]] = {}
# Per model, the process CPU its first step spent making programs: (tracing and lowering, XLA's compile).
_first_step_programs: dict[str, list[float]] = {}
_program_cpu = [0.0, 0.0]


def _first_step_done(model: str, step: int) -> None:
    if step == 0:
        _first_steps[model] = (time.perf_counter() - WORKER_START, time.process_time() - WORKER_START_CPU)
        _first_step_programs[model] = list(_program_cpu)


def _capture(model: str) -> list[tuple[str, Callable[..., Any], list[Any]]]:
    """Run `model`'s first steps; each fused program compiled, in order: its name, function and inputs."""
    import numpy as np
    from tputrace.backend.compat.device_module import EagerMode, set_eager_mode
    from tputrace.backend.eager import deferred

    from tputrace.backend.core import compile_cache

    captured: list[tuple[str, Callable[..., Any], list[Any]]] = []
    compile_program, compile_lowered = deferred.compile_program, compile_cache.compile_lowered

    def capturing(fn: Callable[..., Any], dynamic: Sequence[Any], chip: int, name: str, **options: Any) -> Any:
        captured.append((name, fn, [np.asarray(value) if hasattr(value, "shape") else value for value in dynamic]))
        start = time.process_time()
        try:
            return compile_program(fn, dynamic, chip, name, **options)
        finally:
            _program_cpu[0] += time.process_time() - start

    def timed_compile(lowered: Any) -> Any:
        start = time.process_time()
        try:
            return compile_lowered(lowered)
        finally:
            spent = time.process_time() - start
            _program_cpu[0] -= spent
            _program_cpu[1] += spent

    deferred.compile_program, compile_cache.compile_lowered = capturing, timed_compile
    _program_cpu[:] = [0.0, 0.0]
    set_eager_mode(EagerMode.DEFER_AND_FUSE)
    try:
        RUNNERS[model](STEPS)
    finally:
        deferred.compile_program, compile_cache.compile_lowered = compile_program, compile_lowered
    return captured


def _compile_times(fn: Callable[..., Any], inputs: list[Any]) -> dict[str, float]:
    """Trace, lower and compile `fn` afresh (a new function object, so no JAX cache answers)."""
    import warnings

    import jax

    def fresh(*args: Any) -> Any:
        return fn(*args)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu, wall = time.process_time(), time.perf_counter()
        lowered = jax.jit(fresh).lower(*inputs)
        lower_cpu = time.process_time() - cpu
        compiled = lowered.compile()
        compile_cpu, compile_wall = time.process_time() - cpu - lower_cpu, time.perf_counter() - wall
    text = compiled.as_text()
    entry = text[text.index("\nENTRY"):]
    run, run_cpu = _call_times(compiled, inputs)
    return {"lower_cpu": lower_cpu, "compile_cpu": compile_cpu, "wall": compile_wall, "run": run, "run_cpu": run_cpu,
            "hlo_lines": sum(1 for line in entry.splitlines() if " = " in line), "kernels": entry.count(" fusion(")}


def _call_seconds(compiled: Any, inputs: list[Any], calls: int = 15) -> float:
    """The median wall time of one call of `compiled` on inputs already on the chip."""
    return _call_times(compiled, inputs, calls)[0]


def _call_times(compiled: Any, inputs: list[Any], calls: int = 15) -> tuple[float, float]:
    """The median wall time and process CPU time (XLA's threads included) of one call of `compiled` on inputs
    already on the chip."""
    import jax

    arguments = [jax.device_put(value) if hasattr(value, "shape") else value for value in inputs]
    jax.block_until_ready(compiled(*arguments))
    walls, cpus = [], []
    for _ in range(calls):
        start, start_cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(compiled(*arguments))
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - start_cpu)
    return statistics.median(walls), statistics.median(cpus)


def _option_times(fn: Callable[..., Any], inputs: list[Any], option_sets: dict[str, dict[str, bool | int | str]], reverse: bool) -> dict[str, dict[str, float]]:
    """Lower `fn` once and compile it under each option set: compile CPU and wall, kernels, and a call's time."""
    import warnings

    import jax

    def fresh(*args: Any) -> Any:
        return fn(*args)

    times = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lowered = jax.jit(fresh).lower(*inputs)
        for name in (reversed(list(option_sets)) if reverse else list(option_sets)):
            cpu, wall = time.process_time(), time.perf_counter()
            compiled = lowered.compile(option_sets[name] or None)
            compile_cpu, compile_wall = time.process_time() - cpu, time.perf_counter() - wall
            text = compiled.as_text()
            times[name] = {"compile_cpu": compile_cpu, "wall": compile_wall, "kernels": text[text.index("\nENTRY"):].count(" fusion("),
                           "run": _call_seconds(compiled, inputs)}
    return times


def options_worker(models: Sequence[str], option_sets: dict[str, dict[str, bool | int | str]]) -> None:
    """One round of `--options`: capture each model's programs, compile each under every option set, print one JSON line."""
    sys.path.insert(0, str(EXAMPLES))
    import tputrace.backend  # noqa: F401 - registers the tpu device

    programs = []
    for model in models:
        for order, (name, fn, inputs) in enumerate(_capture(model)):
            programs.append({"model": model, "order": order, "name": name, "options": _option_times(fn, inputs, option_sets, reverse=len(programs) % 2 == 1)})
    print("RESULT " + json.dumps({"programs": programs}), flush=True)


def parse_option_sets(specs: Sequence[str]) -> dict[str, dict[str, bool | int | str]]:
    """`NAME=OPTION=VALUE,OPTION=VALUE` (or `NAME=` for XLA's defaults) -> {NAME: {OPTION: VALUE}}."""
    option_sets: dict[str, dict[str, bool | int | str]] = {}
    for spec in specs:
        name, equals, options = spec.partition("=")
        if not name or not equals:
            raise ValueError(f"option set {spec!r} is not NAME=OPTION=VALUE,... (or NAME= for XLA's defaults)")
        pairs = [option.partition("=") for option in options.split(",") if option]
        if any(not value for _, _, value in pairs):
            raise ValueError(f"option set {spec!r}: each option needs a value (OPTION=VALUE)")
        option_sets[name] = {option.removeprefix("--"): _option_value(value) for option, _, value in pairs}
    return option_sets


def _option_value(text: str) -> bool | int | str:
    """An option's value as XLA takes it: a bool, an int, or the text (an enum's name)."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def compare_options(option_sets: dict[str, dict[str, bool | int | str]], models: Sequence[str], rounds: int) -> str:
    samples = []
    for index in range(rounds):
        samples.append(_run_worker(sys.executable, models, ["--options", *(f"{name}=" + ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options.items()) for name, options in option_sets.items())]))
        print(f"round {index + 1}/{rounds} done", file=sys.stderr, flush=True)
    names = list(option_sets)
    reference = names[0]
    lines = [
        "XLA compile options, each passed to one compile of the same lowered program (medians over rounds; compile CPU = "
        "process CPU of XLA's compile, all threads; run = median wall time of one call; kernels = fusions of the optimized "
        f"entry computation; ratios against `{reference}`):", "",
        "| option set | options |", "|---|---|",
        *(f"| {name} | {', '.join(f'`{k}={v}`' for k, v in option_sets[name].items()) or 'XLA defaults'} |" for name in names), "",
        "| model | program | option set | kernels | compile CPU s | compile wall s | run ms | compile CPU / ref | run / ref |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    totals = {name: [0.0, 0.0] for name in names}
    for key in [(p["model"], p["order"]) for p in samples[0]["programs"]]:
        per_round = [next(p for p in sample["programs"] if (p["model"], p["order"]) == key) for sample in samples]
        medians = {name: {field: statistics.median(p["options"][name][field] for p in per_round) for field in ("compile_cpu", "wall", "run", "kernels")}
                   for name in names}
        for name in names:
            median = medians[name]
            totals[name][0] += median["compile_cpu"]
            totals[name][1] += median["wall"]
            lines.append(
                f"| {key[0]} | {per_round[0]['name']} | {name} | {median['kernels']:.0f} | {median['compile_cpu']:.2f} | {median['wall']:.2f} | "
                f"{median['run'] * 1e3:.2f} | {median['compile_cpu'] / medians[reference]['compile_cpu']:.2f} | {median['run'] / medians[reference]['run']:.2f} |"
            )
    lines += ["", "All programs' compile: " + "; ".join(f"{name} {cpu:.2f} s CPU, {wall:.2f} s wall" for name, (cpu, wall) in totals.items()) + ".",
              "", f"{rounds} rounds, each one worker process; the option sets' order alternates from program to program."]
    return "\n".join(lines)


def origins_worker(models: Sequence[str]) -> None:
    """`--origins`: capture each model's programs, compile each, print its kernels by kind and origin as one JSON line."""
    import collections
    import re
    import warnings

    import jax

    sys.path.insert(0, str(EXAMPLES))
    import tputrace.backend  # noqa: F401 - registers the tpu device

    kind_of, op_name_of = re.compile(r"\bkind=(k\w+)"), re.compile(r'op_name="([^"]*)"')
    programs = []
    for model in models:
        for name, fn, inputs in _capture(model):
            def fresh(*args: Any, fn: Callable[..., Any] = fn) -> Any:
                return fn(*args)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                text = jax.jit(fresh).lower(*inputs).compile().as_text() or ""
            kinds: collections.Counter[str] = collections.Counter()
            origins: collections.Counter[str] = collections.Counter()
            for line in text[text.index("\nENTRY"):].splitlines():
                if " fusion(" not in line:
                    continue
                kind, op_name = kind_of.search(line), op_name_of.search(line)
                kinds[kind.group(1) if kind else "?"] += 1
                parts = [part for part in (op_name.group(1) if op_name else "").split("/") if part.startswith(("aten.", "prims.", "tputrace."))]
                origins[parts[0] if parts else "(no op metadata)"] += 1
            programs.append({"model": model, "name": name, "kernels": sum(kinds.values()), "loop": kinds["kLoop"], "library": kinds["kCustom"],
                             "origins": origins.most_common()})
    print("RESULT " + json.dumps({"programs": programs}), flush=True)


def origins_table(models: Sequence[str], shown: int = 8) -> str:
    """`--origins`' table: per program, its kernels by kind and the ATen ops whose lowerings made the most."""
    sample = _run_worker(sys.executable, models, ["--origins"])
    lines = [
        "Each fused program's kernels (fusions of the optimized entry computation) by kind (loop: compiled through LLVM; "
        f"library: YNNPACK's fusions) and by the ATen op its metadata names (its root's), the {shown} most:", "",
        "| model | program | kernels | loop | library | origins |", "|---|---|---|---|---|---|",
    ]
    for program in sample["programs"]:
        origins = ", ".join(f"{origin.removeprefix('aten.')} {count}" for origin, count in program["origins"][:shown])
        lines.append(f"| {program['model']} | {program['name']} | {program['kernels']} | {program['loop']} | {program['library']} | {origins} |")
    return "\n".join(lines)


def worker(models: Sequence[str]) -> None:
    """One side of a round: capture each model's programs, compile each again, print one JSON line."""
    sys.path.insert(0, str(EXAMPLES))
    import tputrace.backend  # noqa: F401 - registers the tpu device

    programs = []
    for model in models:
        for order, (name, fn, inputs) in enumerate(_capture(model)):
            programs.append({"model": model, "order": order, "name": name, **_compile_times(fn, inputs)})
    first_steps = {model: {"wall": wall, "cpu": cpu, "lower_cpu": _first_step_programs[model][0], "compile_cpu": _first_step_programs[model][1]}
                   for model, (wall, cpu) in _first_steps.items()}
    print("RESULT " + json.dumps({"programs": programs, "first_steps": first_steps}), flush=True)


def _run_worker(python: str, models: Sequence[str], extra: Sequence[str] = (), xla_flags: str = "") -> dict[str, Any]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    if xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    result = subprocess.run([python, str(Path(__file__).resolve()), "--worker", *models, *extra], capture_output=True, text=True, env=env, cwd="/", check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"worker {python} failed ({result.returncode}): {result.stderr.strip().splitlines()[-1:] or ''}")
    return json.loads(lines[-1][len("RESULT "):])


def compare(base_python: str, models: Sequence[str], rounds: int, xla_flags: dict[str, str]) -> str:
    sides: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    pythons = {"base": base_python, "new": sys.executable}
    for index in range(rounds):
        for side in (("base", "new") if index % 2 == 0 else ("new", "base")):
            sides[side].append(_run_worker(pythons[side], models, xla_flags=xla_flags[side]))
            print(f"round {index + 1}/{rounds}: {side} done", file=sys.stderr, flush=True)
    lines = [
        "Per fused program (medians over rounds; CPU = process CPU time of trace+lower and of XLA's compile, all "
        "threads; HLO = instructions of the optimized entry computation, kernels = its fusions; call CPU = process CPU time "
        "of one call of the compiled program, XLA's threads included, median of 15):",
        "",
        "| model | program (base / new) | HLO base | HLO new | kernels base | kernels new | lower CPU base s | lower CPU new s | compile CPU base s | compile CPU new s | new / base | call CPU base ms | call CPU new ms | call new / base |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keyed = {side: [{(p["model"], p["order"]): p for p in sample["programs"]} for sample in samples] for side, samples in sides.items()}
    totals = {"base": 0.0, "new": 0.0}
    for key in sorted(keyed["base"][0], key=lambda k: (models.index(k[0]), k[1])):
        if key not in keyed["new"][0]:
            continue
        base = [sample[key] for sample in keyed["base"]]
        new = [sample[key] for sample in keyed["new"]]
        compile_base, compile_new = statistics.median(p["compile_cpu"] for p in base), statistics.median(p["compile_cpu"] for p in new)
        totals["base"] += compile_base
        totals["new"] += compile_new
        call_base, call_new = (statistics.median(p.get("run_cpu", math.nan) for p in side) for side in (base, new))
        lines.append(
            f"| {key[0]} | {base[0]['name']} / {new[0]['name']} | {base[0]['hlo_lines']} | {new[0]['hlo_lines']} | {base[0]['kernels']} | "
            f"{new[0]['kernels']} | {statistics.median(p['lower_cpu'] for p in base):.2f} | {statistics.median(p['lower_cpu'] for p in new):.2f} | "
            f"{compile_base:.2f} | {compile_new:.2f} | {compile_new / compile_base:.2f} | "
            f"{call_base * 1e3:.2f} | {call_new * 1e3:.2f} | {call_new / call_base:.2f} |"
        )
    lines += ["", f"All programs' compile CPU: base {totals['base']:.2f} s, new {totals['new']:.2f} s ({totals['new'] / totals['base']:.2f}x).", "",
              "From the worker's start (imports included) to the end of each model's first step, run first to third in one process; "
              "of its CPU, what making its programs took (tracing and lowering with JAX, then XLA's compile):", "",
              "| model | wall base s | wall new s | CPU base s | CPU new s | trace+lower CPU base s | trace+lower CPU new s | XLA compile CPU base s | XLA compile CPU new s |",
              "|---|---|---|---|---|---|---|---|---|"]
    for model in models:
        cells = [statistics.median(sample["first_steps"][model].get(field, math.nan) for sample in sides[side])
                 for field in ("wall", "cpu", "lower_cpu", "compile_cpu") for side in ("base", "new")]
        lines.append(f"| {model} | " + " | ".join(f"{cell:.1f}" if field < 2 else f"{cell:.2f}" for field, cell in zip((0, 0, 1, 1, 2, 2, 3, 3), cells)) + " |")
    flags = "".join(f"; {side}'s XLA_FLAGS add `{xla_flags[side]}`" for side in ("base", "new") if xla_flags[side])
    lines += ["", f"{rounds} rounds; base: `{base_python}`, new: this checkout{flags}."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-python", help="the Python whose checkout is the base (its own editable install)")
    parser.add_argument("--base-xla-flags", default="", help="flags added to the base side's XLA_FLAGS")
    parser.add_argument("--new-xla-flags", default="", help="flags added to the new side's XLA_FLAGS")
    parser.add_argument("--options", nargs="+", metavar="NAME=OPTION=VALUE,...",
                        help="compare XLA compile option sets on this checkout instead (the first is the reference; NAME= for XLA's defaults)")
    parser.add_argument("--origins", action="store_true", help="count each program's kernels by kind and by the ATen op that made them, on this checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--worker", nargs="+", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="print the table without writing bench/RESULTS.md")
    args = parser.parse_args()
    try:
        option_sets = parse_option_sets(args.options or ())
    except ValueError as error:
        parser.exit(2, f"compile_speed: {error}\n")
    if args.worker:
        if args.origins:
            origins_worker(args.worker)
        elif option_sets:
            options_worker(args.worker, option_sets)
        else:
            worker(args.worker)
        return
    if args.origins:
        body, title = origins_table(args.models), "XLA:CPU kernels of fused programs by origin"
    elif option_sets:
        body, title = compare_options(option_sets, args.models, args.rounds), "XLA:CPU compile options"
    elif args.base_python is None and not (args.base_xla_flags or args.new_xla_flags):
        parser.exit(2, "compile_speed: give --base-python or --base-xla-flags/--new-xla-flags (compare two sides) or --options (compare XLA options)\n")
    elif args.base_python is not None and not Path(args.base_python).exists():
        parser.exit(2, f"compile_speed: no Python at {args.base_python}\n")
    else:
        flags = {"base": args.base_xla_flags, "new": args.new_xla_flags}
        body, title = compare(args.base_python or sys.executable, args.models, args.rounds, flags), "XLA:CPU compile time of fused programs"
    print(body)
    if not args.no_write:
        sys.path.insert(0, str(BENCH))
        from results import write_section

        write_section(title, body)


if __name__ == "__main__":
    main()
