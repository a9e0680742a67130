"""XProf compiles carry their program's input signature, read from its HLO proto's program shape (`f32[64,64],
f32[37,64]`): a jitted step compiled again for each new sequence length is a recompilation storm the report names,
with the dimension that changed and the buckets that would stop it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import tputrace
from tputrace.analysis import analyze_path
from tputrace.cli.main import main

LENGTHS = (37, 52, 41, 60, 45)
VARYING_LENGTHS = textwrap.dedent(f"""
    import sys, jax, jax.numpy as jnp

    @jax.jit
    def step(w, tokens):
        return w - 0.01 * (tokens.T @ jnp.tanh(tokens @ w)) / tokens.shape[0]

    w = jnp.ones((64, 64))
    step(w, jnp.ones((8, 64))).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i, n in enumerate({LENGTHS}):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, jnp.ones((n, 64)))
                w.block_until_ready()
""")


def test_compiles_for_new_lengths_carry_signatures_and_are_a_storm(tmp_path: Path) -> None:
    from captures import _capture

    logdir = _capture(tmp_path, "lengths.py", VARYING_LENGTHS, "logdir")
    output = tmp_path / "lengths.tptrace"
    assert main(["import", str(logdir), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        compiles = sorted((row for row in trace.records("compiles") if row.name == "jit_step"),
                          key=lambda row: row.start_ns)
        signatures = {row.id: row.signature for row in trace.records("programs")}
    assert [row.signature for row in compiles] == [f"f32[64,64], f32[{n},64]" for n in LENGTHS]
    assert [signatures[row.program_id] for row in compiles] == [row.signature for row in compiles]
    (storm,) = [finding for finding in analyze_path(output).findings if "Recompilation storm" in finding.title]
    assert "jit_step compiled 5 times" in storm.title and "52" in storm.explanation
