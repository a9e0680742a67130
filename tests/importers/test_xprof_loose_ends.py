"""XProf captures of JAX programs over several virtual XLA:CPU devices: a jitted function compiled again because its
arrays were placed another way (another sharding, another device) is named for the placement, and the collectives
each device ran carry each device's wait for the others of its replica group."""

from __future__ import annotations

import textwrap
from collections import defaultdict
from pathlib import Path

import tputrace
from captures import _capture, four_device_env
from tputrace.analysis import analyze_path
from tputrace.cli.main import main

# `shard_step` gets its input with another sharding at each step, `device_step` its inputs on another device.
PLACEMENTS = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(jax.devices()[:2], ("d",))

    @jax.jit
    def shard_step(w, x):
        return w - 0.1 * jnp.tanh(x @ w)

    @jax.jit
    def device_step(w, x):
        return w - 0.1 * jnp.sum(jnp.tanh(x @ w))

    w = jnp.ones((64, 64))
    with jax.profiler.trace(sys.argv[1]):
        for i, spec in enumerate([P("d"), P(None, "d"), P(), P("d", None)]):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                x = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, spec))
                w = shard_step(w, x).block_until_ready()
                device = jax.devices()[i % 4]
                v = jax.device_put(jnp.ones((16, 16)), device)
                device_step(v, jax.device_put(jnp.ones((4, 16)), device)).block_until_ready()
""")

# A psum over the `b` axis of a 2x2 mesh: devices 0 and 1 reduce together, and 2 and 3.
GROUP_PSUM = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))

    @jax.jit
    def f(x):
        def shard(x):
            return x + jax.lax.psum(jnp.sum(jnp.tanh(x @ x.T)), "b")
        return jax.shard_map(shard, mesh=mesh, in_specs=P(("a", "b")), out_specs=P(("a", "b")))(x)

    x = jnp.ones((256, 128))
    f(x).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i in range(3):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                x = f(x).block_until_ready()
""")

def test_recompiles_for_another_sharding_or_device_are_named_for_the_placement(tmp_path: Path) -> None:
    capture = _capture(tmp_path, "placements.py", PLACEMENTS, "logdir", env=four_device_env())
    output = tmp_path / "placements.tptrace"
    assert main(["import", str(capture), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        compiles = trace.sql(
            "SELECT n.text, s.text, d.text FROM compiles c JOIN strings n ON n.id = c.name_sid "
            "LEFT JOIN strings s ON s.id = c.signature_sid LEFT JOIN strings d ON d.id = c.diff_sid "
            "WHERE n.text IN ('jit_shard_step', 'jit_device_step') ORDER BY c.start_ns")
    shard_compiles = [row for row in compiles if row[0] == "jit_shard_step"]
    device_compiles = [row for row in compiles if row[0] == "jit_device_step"]
    assert len(shard_compiles) >= 3 and len(device_compiles) == 4
    # The arrays the function was called with, not a device's share of them.
    assert {signature for _, signature, _ in shard_compiles} == {"f32[64,64], f32[64,64]"}
    assert any("arg 1 sharding: {devices=[2,1]" in (diff or "") and "{devices=[1,2]" in (diff or "")
               for _, _, diff in shard_compiles)
    assert [diff for _, _, diff in device_compiles[1:]] == ["devices: [0] -> [1]", "devices: [1] -> [2]",
                                                            "devices: [2] -> [3]"]
    findings = {finding.title.split(":")[1].split()[0]: finding for finding in analyze_path(output).findings
                if finding.analyzer == "recompiles"}
    shard, device = findings["jit_shard_step"], findings["jit_device_step"]
    assert "placement changed (arg 1 sharding took {devices=[2,1]" in shard.title, shard.title
    assert "{replicated}" in shard.title and "pad" not in shard.suggestion.lower()
    assert "devices took [0], [1], [2], [3]" in device.title, device.title
    for finding in (shard, device):
        assert "in_shardings" in finding.suggestion and "jitted anew" not in finding.explanation


def test_each_devices_collective_waits_for_the_last_of_its_replica_group(tmp_path: Path) -> None:
    capture = _capture(tmp_path, "group_psum.py", GROUP_PSUM, "logdir", env=four_device_env())
    output = tmp_path / "group_psum.tptrace"
    assert main(["import", str(capture), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        calls = trace.sql(
            "SELECT o.chip, o.start_ns, c.dur_ns, c.wait_ns FROM collectives c JOIN ops o ON o.rank = c.rank "
            "AND o.start_ns = c.start_ns JOIN strings s ON s.id = o.op_sid WHERE s.text LIKE 'psum%' ORDER BY o.start_ns")
        ((collectives, with_waits),) = trace.sql("SELECT COUNT(*), COUNT(wait_ns) FROM collectives")
    assert collectives == with_waits == len(calls) == 12
    by_chip: dict[int, list[tuple[int, int, int | None]]] = defaultdict(list)
    for chip, start_ns, dur_ns, wait_ns in calls:
        by_chip[chip].append((start_ns, dur_ns, wait_ns))
    assert sorted(by_chip) == [0, 1, 2, 3] and len({len(own) for own in by_chip.values()}) == 1
    for group in ((0, 1), (2, 3)):
        for matched in zip(*(by_chip[chip] for chip in group)):
            last = max(start for start, _, _ in matched)
            assert [wait for _, _, wait in matched] == [min(last - start, dur) for start, dur, _ in matched]
