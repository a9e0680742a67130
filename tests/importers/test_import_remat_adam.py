"""Two more kinds of JAX programs read from their `jax.profiler.trace` captures: rematerialized layers
(`jax.checkpoint`) whose loop marks its steps with `TraceAnnotation`, and a hand-written Adam over a parameter pytree
whose gradients a `shard_map` averages over 4 virtual devices, its steps marked by `StepTraceAnnotation` without
`step_num`."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import tputrace
from tputrace.analysis import analyze_path
from tputrace.cli.main import main

REMAT = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp

    def layer(w, x):
        return jnp.tanh(x @ w)

    def loss(ws, x):
        for w in ws:
            x = jax.checkpoint(layer)(w, x)
        return jnp.sum(x ** 2)

    @jax.jit
    def train_step(ws, x):
        grads = jax.grad(loss)(ws, x)
        return [w - 0.01 * g for w, g in zip(ws, grads)]

    ws = [jnp.ones((128, 128)) * 0.01 for _ in range(3)]
    x = jnp.ones((64, 128))
    jax.block_until_ready(train_step(ws, x))
    with jax.profiler.trace(sys.argv[1]):
        for i in range(5):
            with jax.profiler.TraceAnnotation("train_step"):
                ws = train_step(ws, x)
                jax.block_until_ready(ws)
""")

ADAM_SHARD_MAP = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(jax.devices(), ("d",))

    def loss(params, x, y):
        h = jnp.tanh(x @ params["w1"] + params["b1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    def adam(params, grads, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        params = jax.tree_util.tree_map(
            lambda p, m, v: p - lr * (m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t)) + eps), params, m, v)
        return params, m, v

    @jax.jit
    def step(params, m, v, t, x, y):
        def shard_grads(params, x, y):
            grads = jax.grad(loss)(params, x, y)
            return jax.tree_util.tree_map(lambda g: jax.lax.pmean(g, "d"), grads)
        grads = jax.shard_map(shard_grads, mesh=mesh, in_specs=(P(), P("d"), P("d")), out_specs=P())(params, x, y)
        return adam(params, grads, m, v, t)

    params = {"w1": jnp.ones((32, 64)) * 0.1, "b1": jnp.zeros(64), "w2": jnp.ones((64, 8)) * 0.1}
    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    x = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("d")))
    y = jax.device_put(jnp.ones((64, 8)), NamedSharding(mesh, P("d")))
    params, m, v = step(params, m, v, 1, x, y)
    params, m, v = jax.block_until_ready(step(params, m, v, 2, x, y))
    with jax.profiler.trace(sys.argv[1]):
        for t in range(3, 7):
            with jax.profiler.StepTraceAnnotation("train"):
                params, m, v = step(params, m, v, t, x, y)
                jax.block_until_ready(params)
""")


def _line(source: str, text: str) -> int:
    return next(number for number, line in enumerate(source.splitlines(), 1) if text in line)


def test_rematerialized_layers(tmp_path: Path) -> None:
    from captures import _capture

    logdir = _capture(tmp_path, "remat.py", REMAT, "logdir")
    output = tmp_path / "remat.tptrace"
    assert main(["import", str(logdir), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        (source,) = json.loads(trace.meta["imported"])
        steps = [step.step for step in trace.records("steps") if step.source == "imported"]
        ops = list(trace.records("ops"))
    assert (source["step_source"], source["step_range"], steps) == ("traceme", "train_step", [1, 2, 3, 4, 5])
    # Every step runs the same program: the layers' forward, their recomputation in the backward pass (under
    # `rematted_computation`), and the update.
    per_step = Counter(op.step for op in ops)
    assert sorted(per_step) == [1, 2, 3, 4, 5] and len(set(per_step.values())) == 1
    assert any("rematted_computation" in (op.module or "") for op in ops)
    layer_line, update_line = _line(REMAT, "jnp.tanh(x @ w)"), _line(REMAT, "w - 0.01 * g")
    assert {op.source.line for op in ops if op.source} == {layer_line, update_line}


def test_adam_over_a_shard_map(tmp_path: Path) -> None:
    from captures import _capture, four_device_env

    logdir = _capture(tmp_path, "adam.py", ADAM_SHARD_MAP, "logdir", env=four_device_env())
    output = tmp_path / "adam.tptrace"
    assert main(["import", str(logdir), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        (source,) = json.loads(trace.meta["imported"])
        steps = [step.step for step in trace.records("steps") if step.source == "imported"]
        ops = list(trace.records("ops"))
        collectives = list(trace.records("collectives"))
        chips = trace.run.chips
    assert (source["step_source"], source["step_range"], steps) == ("traceme", "train", [1, 2, 3, 4])
    assert chips == 4
    # Each step runs the program once on each of the 4 devices, its all-reduces among its ops.
    per_step = Counter((op.step, op.chip) for op in ops)
    assert set(per_step) == {(step, chip) for step in range(1, 5) for chip in range(4)}
    assert len(set(per_step.values())) == 1
    assert collectives and {row.kind for row in collectives} == {"all_reduce"}
    # The gradients' `pmean` and each of Adam's `tree_map` updates are placed at their lines.
    lines = {op.source.line for op in ops if op.source}
    assert {_line(ADAM_SHARD_MAP, "pmean(g"), _line(ADAM_SHARD_MAP, "b1 * m + (1 - b1) * g"),
            _line(ADAM_SHARD_MAP, "b2 * v + (1 - b2) * g * g"), _line(ADAM_SHARD_MAP, "lambda p, m, v:")} <= lines
    # The rank's collectives are its 4 chips' calls: the finding says its figures by kind and line sum them.
    (finding,) = [finding for finding in analyze_path(output).findings if finding.title.startswith("Collectives take")]
    assert "its 4 chips' together" in finding.explanation, finding.explanation
