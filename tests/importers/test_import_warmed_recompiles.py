"""A jitted function compiled before `jax.profiler.trace` starts (a warm-up call) and again inside it for a new input
shape is a recompile, though the capture holds only the second compile: JAX writes the HLO of every program the
process compiled, and the earlier one of the name has the same scopes. `jax.jit(jax.grad(f))`, also named `jit_f`,
is another function (its scopes differ from `jax.jit(f)`'s): its first compile is no recompile."""

from __future__ import annotations

import textwrap
from pathlib import Path

import tputrace
from tputrace.cli.main import main

WARMED = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp

    def f(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    w, x = jnp.ones((32, 32)), jnp.ones((16, 32))
    small = jnp.ones((4, 32))
    jax.jit(f)(w, x).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i in range(2):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                jax.jit(f)(w, x).block_until_ready()
        with jax.profiler.StepTraceAnnotation("train", step_num=2):
            jax.jit(f)(w, small).block_until_ready()
        with jax.profiler.StepTraceAnnotation("train", step_num=3):
            jax.jit(jax.grad(f))(w, x).block_until_ready()
""")


def test_a_compile_of_a_function_warmed_before_the_trace_is_a_recompile(tmp_path: Path) -> None:
    from captures import _capture

    logdir = _capture(tmp_path, "warmed.py", WARMED, "logdir")
    output = tmp_path / "warmed.tptrace"
    assert main(["import", str(logdir), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        compiles = sorted((row for row in trace.records("compiles") if row.name == "jit_f"),
                          key=lambda row: row.start_ns)
    assert [(row.step, row.reason) for row in compiles] == [(2, "recompile"), (3, "first")]
