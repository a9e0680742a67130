"""Where an XProf capture's compiles come from: JAX's Python tracer records its trace of each jitted function's body
just before the compile, also where the function is called at a script's top level (no frame of the user's is around
that call: the tracer records none already running when it started)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import tputrace
from tputrace.cli.main import main

TOP_LEVEL_COMPILES = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp

    def step(w, x):
        return jnp.tanh(x @ w).sum()

    def gradient(w, x):
        return jax.jit(jax.grad(step))(w, x)

    w, x, rows = jnp.ones((32, 32)), jnp.ones((8, 32)), jnp.ones((4, 32))
    scaled = jnp.ones((4, 4)) * 5  # JAX's `multiply` compiled before the trace, at this line
    with jax.profiler.trace(sys.argv[1]):
        jax.jit(step)(w, x).block_until_ready()
        gradient(w, x).block_until_ready()
        jax.jit(lambda a: a * 2 + 1)(x).block_until_ready()
        (jnp.ones((8, 32)) * 3).block_until_ready()
        jax.jit(step)(w, rows).block_until_ready()
""")


def test_each_compile_is_placed_at_the_function_it_compiled(tmp_path: Path) -> None:
    from captures import _capture

    logdir = _capture(tmp_path, "top_level.py", TOP_LEVEL_COMPILES, "logdir")
    output = tmp_path / "top_level.tptrace"
    assert main(["import", str(logdir), "-o", str(output)]) == 0
    lines = TOP_LEVEL_COMPILES.splitlines()
    step_line = lines.index("def step(w, x):") + 1
    lambda_line = next(number for number, text in enumerate(lines, 1) if "lambda a:" in text)
    multiply_line = next(number for number, text in enumerate(lines, 1) if "* 3" in text)
    with tputrace.open(output) as trace:
        compiles = sorted(trace.records("compiles"), key=lambda row: row.start_ns)
    # `step` at the top level, then its gradient inside `gradient`, then the lambda: each at its function's `def`
    # line in the script (its full path, from the programs' HLO), not JAX's own `<lambda>` in cache_key.py; and JAX's
    # own `multiply`, called at the top level, at the line that called it in the trace (from its program's HLO: the
    # last of that name's, not the one compiled before the trace at another line).
    assert [row.name for row in compiles] == ["jit_step", "jit_step", "jit__lambda", "jit_multiply", "jit_step"]
    script = str(tmp_path / "top_level.py")
    assert [(row.source.file, row.source.line, row.source.function) if row.source else None for row in compiles] == [
        (script, step_line, "step"), (script, step_line, "step"), (script, lambda_line, "<lambda>"),
        (script, multiply_line, "<module>"), (script, step_line, "step")]
    # The gradient's program is another function named `jit_step` (its HLO's scopes are `jvp()` and `transpose(jvp())`),
    # not a recompile of `step`; `step` for 4 rows is one, and so is JAX's `multiply` for new shapes, compiled before
    # the trace for others (its earlier proto says so).
    assert [row.reason for row in compiles] == ["first", "first", "first", "recompile", "recompile"]
