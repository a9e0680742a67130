"""Where the DEFER_AND_FUSE GPT step's XLA programs spend their time, per HLO instruction.

Runs `examples/gpt_train.py`'s step in DEFER_AND_FUSE until the programs repeat, keeps each fused
program's function and inputs as they were compiled, then runs every program on its own (async
dispatch off, so a call returns when the program finished) under `jax.profiler`. XLA:CPU's runtime
names each thunk after its HLO instruction; the optimized HLO gives the instruction's shape and the
ATen op it came from (`jax.named_scope`). Prints per program: wall and process CPU time per call,
the thunk time by ATen op and by instruction kind, matmul throughput, and the slowest instructions.

    python bench/step_profile.py [--iters 10] [--top 25] [--programs 635,112] [--hlo-dir DIR]

Thunk times are wall times on the thread that ran them; thunks without dependencies between them
run concurrently on XLA's threads, so their sum can exceed the call's wall time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

jax.config.update("jax_cpu_enable_async_dispatch", False)

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import tputrace.backend  # noqa: E402,F401 - registers the tpu device
from tputrace.backend.compat.device_module import EagerMode, set_eager_mode  # noqa: E402
from tputrace.backend.eager import deferred  # noqa: E402

_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+|\(.*?\)) ([\w\-]+)\((.*)")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")


@dataclass(frozen=True)
class CapturedProgram:
    """A fused program's function and the inputs it was compiled for."""

    name: str
    fn: Callable[..., tuple]
    inputs: list[Any]


@dataclass(frozen=True)
class Instruction:
    """One instruction of a computation in optimized HLO text."""

    shape: str
    opcode: str
    operands: str
    aten: str
    calls: str | None


def capture_gpt_programs(steps: int) -> dict[str, CapturedProgram]:
    """Run the GPT step `steps` times in DEFER_AND_FUSE; every fused program compiled, by name."""
    import gpt_train

    captured: dict[str, CapturedProgram] = {}
    compile_program = deferred.compile_program

    def capturing(fn: Callable, dynamic: Sequence[Any], chip: int, name: str, **options: Any) -> Any:
        captured[name] = CapturedProgram(name, fn, [np.asarray(value) if hasattr(value, "shape") else value for value in dynamic])
        return compile_program(fn, dynamic, chip, name, **options)

    deferred.compile_program = capturing
    try:
        set_eager_mode(EagerMode.DEFER_AND_FUSE)
        config = gpt_train.GPTConfig()
        torch.manual_seed(0)
        model = gpt_train.GPT(config).to("tpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        batches = [(tokens.to("tpu"), targets.to("tpu")) for tokens, targets in gpt_train.synthetic_batches(config, 4, 4)]
        for index in range(steps):
            gpt_train.train_step(model, model, optimizer, *batches[index % len(batches)])
            torch.tpu.synchronize()
    finally:
        deferred.compile_program = compile_program
    return captured


def parse_hlo(hlo_text: str) -> dict[str, dict[str, Instruction]]:
    """Every computation's instructions by name; the entry computation is under 'ENTRY'."""
    computations: dict[str, dict[str, Instruction]] = {}
    current: dict[str, Instruction] | None = None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = computations.setdefault("ENTRY" if line.startswith("ENTRY") else header.group(1), {})
            continue
        match = _INSTRUCTION.match(line)
        if match and current is not None:
            name, shape, opcode, rest = match.groups()
            op_name = re.search(r'op_name="([^"]*)"', rest)
            calls = re.search(r"calls=%([\w.\-]+)", rest)
            current[name] = Instruction(shape, opcode, rest, _aten_name(op_name.group(1) if op_name else ""), calls.group(1) if calls else None)
    return computations


def _aten_name(op_name: str) -> str:
    parts = [part for part in op_name.split("/") if part.startswith(("aten.", "prims.", "tputrace."))]
    return parts[0] if parts else (op_name.split("/")[-1] or "(none)")


def _dims(shape: str) -> list[int]:
    match = re.match(r"\w+\[([\d,]*)\]", shape)
    return [int(size) for size in match.group(1).split(",") if size] if match else []


def dot_flops(computation: dict[str, Instruction], instruction: Instruction) -> int:
    """2 * output elements * contracted size of a dot instruction."""
    operand = re.findall(r"%([\w.\-]+)", instruction.operands.split(")")[0])[0]
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instruction.operands)
    lhs = _dims(computation[operand].shape)
    contracted = int(np.prod([lhs[int(dim)] for dim in contracting.group(1).split(",") if dim])) if contracting else 1
    return 2 * int(np.prod(_dims(instruction.shape))) * contracted


def thunk_times(trace_dir: Path, names: set[str]) -> Counter:
    """Total microseconds per thunk name in the profiler trace under `trace_dir`."""
    path = sorted(trace_dir.glob("plugins/profile/*/*.trace.json.gz"))[-1]
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    totals: Counter = Counter()
    for event in events:
        if event.get("ph") == "X" and event["name"] in names:
            totals[event["name"]] += event["dur"]
    return totals


def profile_program(program: CapturedProgram, iters: int, top: int, hlo_dir: Path | None) -> None:
    compiled = jax.jit(program.fn).lower(*program.inputs).compile()
    hlo_text = compiled.as_text()
    if hlo_dir is not None:
        hlo_dir.mkdir(parents=True, exist_ok=True)
        (hlo_dir / f"{program.name}.hlo.txt").write_text(hlo_text)
    arrays = [jax.device_put(value) for value in program.inputs]
    walls, cpus = [], []
    for _ in range(iters + 3):
        cpu, wall = time.process_time(), time.perf_counter()
        jax.block_until_ready(compiled(*arrays))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    computations = parse_hlo(hlo_text)
    entry = computations["ENTRY"]
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        for _ in range(iters):
            jax.block_until_ready(compiled(*arrays))
        jax.profiler.stop_trace()
        totals = thunk_times(Path(trace_dir), set(entry))
    per_call = {name: total / iters / 1e3 for name, total in totals.items()}
    print(f"\n== {program.name}: wall median {statistics.median(walls[3:]) * 1e3:.1f} ms (min {min(walls[3:]) * 1e3:.1f}), "
          f"process CPU median {statistics.median(cpus[3:]) * 1e3:.1f} ms, thunks {sum(per_call.values()):.1f} ms")
    by_aten: Counter = Counter()
    by_kind: Counter = Counter()
    flops: Counter = Counter()
    for name, ms in per_call.items():
        instruction = entry[name]
        kind = instruction.opcode
        dot = instruction if instruction.opcode == "dot" else None
        if instruction.calls is not None:
            called = computations.get(instruction.calls, {})
            dots = [inner for inner in called.values() if inner.opcode == "dot"]
            kind = f"{'ynn ' if name.startswith('ynn') else ''}fusion{' (dot)' if dots else ''}"
            if dots:
                flops[name] = dot_flops(called, dots[0])
        elif dot is not None:
            flops[name] = dot_flops(entry, dot)
        by_aten[instruction.aten] += ms
        by_kind[kind] += ms
    dot_ms = sum(per_call[name] for name in flops)
    print(f"matmuls: {dot_ms:.1f} ms of thunk time, {sum(flops.values()) / 1e9:.2f} GFLOP, {sum(flops.values()) / max(dot_ms, 1e-9) / 1e6:.0f} GFLOP/s")
    print("by instruction kind: " + ", ".join(f"{kind} {ms:.1f}" for kind, ms in by_kind.most_common()))
    print("by ATen op (ms):")
    for aten, ms in by_aten.most_common(top):
        print(f"  {ms:7.2f}  {aten}")
    print("slowest non-matmul instructions (ms):")
    shown = 0
    for name, ms in sorted(per_call.items(), key=lambda item: -item[1]):
        if name in flops:
            continue
        instruction = entry[name]
        print(f"  {ms:7.3f}  {name}  {instruction.shape}  {instruction.aten}")
        shown += 1
        if shown >= top:
            break


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="GPT steps run to compile the programs")
    parser.add_argument("--iters", type=int, default=10, help="profiled calls per program")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--programs", default="", help="comma-separated op counts to profile (default: all)")
    parser.add_argument("--hlo-dir", type=Path, default=None, help="also write each program's optimized HLO here")
    args = parser.parse_args(argv)
    wanted = {f"fused_{count}_ops" for count in args.programs.split(",") if count}
    for name, program in capture_gpt_programs(args.steps).items():
        if not wanted or name in wanted:
            profile_program(program, args.iters, args.top, args.hlo_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
