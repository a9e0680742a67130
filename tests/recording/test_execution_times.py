"""The execution watcher records a program's end when the program has run, though its outputs may be gone before it
has: the next DeferAndFuse program takes them as donated inputs (deleting them) or the script frees them, and a
watcher that polled the outputs alone took a program whose outputs were gone as over. With the program's own `done`
output, which only the watcher holds, the end stays right."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import tputrace
from tputrace.recording.executions import ExecutionWatcher
from tputrace.store import TraceWriter

jax = pytest.importorskip("jax")


def _slow_program() -> tuple[object, object]:
    """A program that runs for a while on XLA:CPU, launched: its output and its `done` byte."""
    import jax.numpy as jnp

    def chain(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        y = jax.lax.fori_loop(0, 24, lambda _, value: jnp.tanh(value @ value), x)
        return y, jnp.zeros((), jnp.int8)

    compiled = jax.jit(chain).lower(jnp.ones((768, 768), jnp.float32)).compile()
    return compiled(jnp.full((768, 768), 1e-3, jnp.float32))


@pytest.mark.parametrize("gone", ["deleted", "freed"])
def test_an_execution_whose_outputs_are_gone_ends_when_it_has_run(tmp_path: Path, gone: str) -> None:
    path = tmp_path / "executions.tptrace"
    writer = TraceWriter(path)
    watcher = ExecutionWatcher(writer, rank=0, t0=0)
    launch_ns = time.perf_counter_ns()
    output, done = _slow_program()
    watcher.launched(1, 0, launch_ns, None, 0, [output], done=done)
    if gone == "deleted":
        output.delete()  # as donation to the next program does
    del output
    done.block_until_ready()
    ran_ns = time.perf_counter_ns() - launch_ns
    del done
    watcher.stop()
    writer.close()
    with tputrace.open(path) as trace:
        ((dur_ns,),) = trace.sql("SELECT dur_ns FROM executions")
    assert dur_ns >= ran_ns // 2, (dur_ns, ran_ns)
