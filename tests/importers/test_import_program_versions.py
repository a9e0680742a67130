"""XLA:CPU's ops of a program compiled several times under one name (`jit_f` for new shapes, or `jax.jit(f)` and
`jax.jit(jax.grad(f))`): each op's line and scope come from the HLO of the program that ran it (its `program_id`), not
from the first program of that name."""

from __future__ import annotations

import textwrap
from pathlib import Path

import tputrace
from tputrace.cli.main import main

SAME_NAME_PROGRAMS = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp

    def f(w, x):
        if x.shape[0] > 4:
            y = x @ w  # wide batches
        else:
            y = x @ w  # narrow batches
        return jnp.tanh(y).sum()

    w = jnp.ones((64, 64))
    with jax.profiler.trace(sys.argv[1]):
        for rows in (8, 4, 8, 4):
            jax.jit(f)(w, jnp.ones((rows, 64))).block_until_ready()
        jax.jit(jax.grad(f))(w, jnp.ones((8, 64))).block_until_ready()
""")


def test_ops_take_lines_and_scopes_from_the_program_that_ran(tmp_path: Path) -> None:
    from captures import _capture

    logdir = _capture(tmp_path, "same_name.py", SAME_NAME_PROGRAMS, "logdir")
    output = tmp_path / "same_name.tptrace"
    assert main(["import", str(logdir), "-o", str(output)]) == 0
    lines = SAME_NAME_PROGRAMS.splitlines()
    wide = next(number for number, text in enumerate(lines, 1) if "# wide" in text)
    narrow = next(number for number, text in enumerate(lines, 1) if "# narrow" in text)
    script = str(tmp_path / "same_name.py")
    with tputrace.open(output) as trace:
        ops = sorted(trace.records("ops"), key=lambda row: row.start_ns)
    matmuls = [op for op in ops if op.module and op.module.endswith("dot_general")]
    # The forward calls' matmuls in call order (8, 4, 8, 4 rows), each at the line its shape traced.
    forward = [op for op in matmuls if op.module == "jit(f)/dot_general"]
    assert [(op.source.file, op.source.line) if op.source else None for op in forward] == [
        (script, wide), (script, narrow), (script, wide), (script, narrow)]
    # The gradient's program (also `jit_f`) ran last, after its input's `jnp.ones`: its ops are named by its own
    # HLO's scopes (`jvp()`, `transpose(jvp())`), not by the forward program's.
    last_input = max(op.start_ns for op in ops if op.module == "jit(broadcast_in_dim)/broadcast_in_dim")
    gradient = [op for op in ops if op.start_ns > last_input and op.module]
    assert gradient and all("jvp()" in op.module for op in gradient)
    assert any(op.module.startswith("jit(f)/transpose(jvp())") for op in gradient)


THREE_SHAPES = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp

    @jax.jit
    def f(w, x):
        return jnp.tanh(x @ w).sum()

    w = jnp.ones((64, 64))
    with jax.profiler.trace(sys.argv[1]):
        for i in range(2):
            for rows in (8, 16, 32):
                f(w, jnp.ones((rows, 64))).block_until_ready()
""")


def test_each_compile_of_a_name_is_its_own_program(tmp_path: Path) -> None:
    """`jit_f` compiled for 3 shapes is 3 programs (`jit_f(N)`, structure `jit_f`), each with its compile, its 2 runs
    and the ops of those runs, not one program holding every shape's runs."""
    from captures import _capture

    logdir = _capture(tmp_path, "three_shapes.py", THREE_SHAPES, "logdir")
    output = tmp_path / "three_shapes.tptrace"
    assert main(["import", str(logdir), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        programs = {row.id: row for row in trace.records("programs") if row.structure == "jit_f"}
        compiles = sorted((row for row in trace.records("compiles") if row.name == "jit_f"), key=lambda row: row.start_ns)
        runs = sorted((row for row in trace.records("executions") if row.program_id in programs),
                      key=lambda row: row.start_ns)
        ops = [row for row in trace.records("ops") if row.program_id in programs]
    assert len(programs) == 3 and len({row.name for row in programs.values()}) == 3
    assert all(row.name.startswith("jit_f(") for row in programs.values())
    # Each compile built the program that ran next: the shapes' runs in call order are the compiles' programs twice.
    assert [row.reason for row in compiles] == ["first", "recompile", "recompile"]
    order = [row.program_id for row in compiles]
    assert len(set(order)) == 3 and [row.program_id for row in runs] == order * 2
    # Each program's ops are those of its own runs: the same 4 ops, twice.
    for program_id, program in programs.items():
        mine = [op for op in ops if op.program_id == program_id]
        assert program.n_ops == len({op.op for op in mine}) and len(mine) == 2 * program.n_ops


def test_a_program_run_in_two_sessions_is_one_program(tmp_path: Path) -> None:
    """Each profiling session of a process writes the HLO protos of all it compiled: the second session's copy of
    `jit_step`'s proto is not another module of the name, so `jit_step` stays one program, without an id."""
    from captures import jax_two_sessions_capture

    output = tmp_path / "sessions.tptrace"
    assert main(["import", str(jax_two_sessions_capture(tmp_path)), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        assert [program.name for program in trace.records("programs")] == ["jit_step"]
