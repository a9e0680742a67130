"""JAX captures whose loop marks its iterations with a TraceMe range and no step number
(`jax.profiler.TraceAnnotation("train_step")`, `StepTraceAnnotation` without `step_num`): the range repeated at the
top level of the main Python thread makes the steps, as a repeated `record_function` does in a torch.profiler
capture; JAX's own ranges (`PjitFunction(step)`, `…::ExecuteHelper…`) never do."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest

import tputrace
from tputrace.cli.main import main

TRACEME_LOOP = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp

    @jax.jit
    def step(w, x):
        return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)

    w = jnp.ones((512, 512))
    step(w, jnp.ones((256, 512))).block_until_ready()
    kind = sys.argv[2]
    with jax.profiler.trace(sys.argv[1]):
        for i in range(4):
            if kind == "annotation":
                with jax.profiler.TraceAnnotation("load"):
                    x = jnp.ones((256, 512)) * i
                with jax.profiler.TraceAnnotation("train_step"):
                    with jax.profiler.TraceAnnotation("update"):
                        w = step(w, x)
                    w.block_until_ready()
            elif kind == "step":
                with jax.profiler.StepTraceAnnotation("train"):
                    w = step(w, jnp.ones((256, 512)))
                    w.block_until_ready()
            else:
                w = step(w, jnp.ones((256, 512)))
                w.block_until_ready()
""")


def _import(tmp_path: Path, kind: str) -> tputrace.Trace:
    from captures import _capture

    logdir = _capture(tmp_path, "loop.py", TRACEME_LOOP, f"{kind}_logdir", kind)
    output = tmp_path / f"{kind}.tptrace"
    assert main(["import", str(logdir), "-o", str(output)]) == 0
    return tputrace.open(output)


@pytest.mark.parametrize(("kind", "name"), [("annotation", "train_step"), ("step", "train")])
def test_a_repeated_traceme_around_each_iteration_makes_the_steps(tmp_path: Path, kind: str, name: str) -> None:
    with _import(tmp_path, kind) as trace:
        steps = [step for step in trace.records("steps") if step.source == "imported"]
        (source,) = json.loads(trace.meta["imported"])
        ranges = sorted((row.start_ns, row.start_ns + row.dur_ns) for row in trace.records("annotations")
                        if row.name == name)
        step_ops = Counter(op.step for op in trace.records("ops") if (op.module or "").startswith("jit(step)/"))
    assert (source["step_source"], source["step_range"]) == ("traceme", name)
    assert [step.step for step in steps] == [1, 2, 3, 4]
    # `train_step`, not the shorter `load` before it nor the `update` inside it; each step ends with its range and
    # starts where the step before it ended (the first: with its range).
    starts = [ranges[0][0]] + [end for _, end in ranges[:-1]]
    assert len(ranges) == 4 and [(step.start_ns, step.end_ns) for step in steps] == [
        (start, end) for start, (_, end) in zip(starts, ranges)]
    # Each step holds its iteration's run of `step`.
    assert len(set(step_ops.values())) == 1 and sorted(step_ops) == [1, 2, 3, 4]


def test_jaxs_own_ranges_are_no_steps(tmp_path: Path) -> None:
    with _import(tmp_path, "none") as trace:
        (source,) = json.loads(trace.meta["imported"])
        steps = list(trace.records("steps"))
        names = {row.name for row in trace.records("annotations")}
    # `PjitFunction(step)` and `CommonPjRtBuffer::Await` repeat once an iteration at the top level of the main thread.
    assert "PjitFunction(step)" in names
    assert "step_source" not in source and steps == []
