"""An XProf capture of collectives over several virtual XLA:CPU devices: the events carry no sizes, so each collective's
message size and dtype are read from its instruction's shapes in the program's HLO, and the TUI says the waits are
for the capture's other chips."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest

import tputrace
from captures import _capture, four_device_env
from fixtures.make_tui_fixture import make_session, settle
from tputrace.analysis import analyze_path
from tputrace.analysis.collectives import CollectivesData
from tputrace.cli.main import main
from tputrace.summary import render_text, summarize
from views.test_tui import screen_text

# Each of 4 devices holds a (64, 128) block: a psum of an i32 (64, 32) array, an all-gather to (256, 128) and a ring
# ppermute of its block, in a shard_map.
COLLECTIVES = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("ring",))

    @jax.jit
    def layer(x):
        def shard(x):
            summed = jax.lax.psum(jnp.tanh(x[:, :32] @ x[:32, :32]).astype(jnp.int32), "ring")
            gathered = jax.lax.all_gather(x, "ring", tiled=True)
            shifted = jax.lax.ppermute(x, "ring", [(i, (i + 1) % 4) for i in range(4)])
            return x + summed[:, :1].astype(x.dtype) + gathered[:x.shape[0]] + shifted
        return jax.shard_map(shard, mesh=mesh, in_specs=P("ring"), out_specs=P("ring"))(x)

    x = jnp.ones((256, 128))
    layer(x).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i in range(3):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                x = layer(x).block_until_ready()
""")


@pytest.fixture(scope="module")
def collectives_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("jax", reason="making a capture needs jax (pip install -e .[backend])")
    folder = tmp_path_factory.mktemp("collective_sizes")
    capture = _capture(folder, "collectives.py", COLLECTIVES, "logdir", env=four_device_env())
    output = folder / "collectives.tptrace"
    assert main(["import", str(capture), "-o", str(output)]) == 0
    return output


def test_collectives_are_sized_from_their_hlo_shapes(collectives_trace: Path) -> None:
    with tputrace.open(collectives_trace) as trace:
        sizes = trace.sql("SELECT kind, bytes, dtype, COUNT(*) FROM collectives GROUP BY kind, bytes, dtype ORDER BY kind")
        summary = render_text(summarize(trace))
    # 3 calls on 4 devices each: the all-gather's output, the psum's i32 operand, the permuted block.
    assert sizes == [("all_gather", 256 * 128 * 4, "f32", 12), ("all_reduce", 64 * 32 * 4, "i32", 12),
                     ("collective_permute", 64 * 128 * 4, "f32", 12)]
    table = summary.split("\ncollectives (", 1)[1].split("\n\n", 1)[0]  # the title's rest, the columns, the rows
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:]}
    assert set(rows) == {"all_gather", "all_reduce", "collective_permute"}
    # Every kind is sized; a permute's chips each wait for their own source, not a group, so its waits stay unknown.
    assert all(row[-1] != "unknown" for kind, row in rows.items() if kind != "collective_permute"), table
    assert rows["collective_permute"][-1] == "unknown" and all("unknown" not in row[:-1] for row in rows.values()), table
    data = analyze_path(collectives_trace).data(CollectivesData)
    assert data is not None
    assert {kind.kind: kind.bytes_known for kind in data.kinds} == {
        "all_gather": True, "all_reduce": True, "collective_permute": True}


def test_the_collectives_view_says_the_waits_are_for_the_captures_other_chips(collectives_trace: Path) -> None:
    from tputrace.tui.app import TraceApp

    shown: dict[str, Any] = {}

    async def drive() -> None:
        app = TraceApp(make_session(collectives_trace))
        async with app.run_test(size=(160, 45)) as pilot:
            await settle(pilot)
            await pilot.press("6")
            await settle(pilot)
            shown["screen"] = screen_text(app)

    asyncio.run(drive())
    assert "waiting for other chips (" in shown["screen"]
    assert "other ranks" not in shown["screen"]
