"""The Sharding view's detail lines for each cause group: a DDP bucket's index, size and parameters, a
redistribution's placements, shape and op, with the trace's strings escaped."""

from __future__ import annotations

from pathlib import Path

from tputrace.store import open_trace
from tputrace.store.writer import TraceWriter
from tputrace.tui.queries.sharding import sharding_tables

SCRIPT = "/proj/train.py"


def _write(path: Path) -> Path:
    writer = TraceWriter(path, rank=0, created_unix_ns=1_700_000_000_000_000_000)
    writer.set_run(world_size=2, script=SCRIPT, argv=[], platform="cpu", host="one-host", eager_mode="DEFER_NEVER",
                   start_unix_ns=1_700_000_000_000_000_000)
    line = writer.frame(SCRIPT, 12, "<module>")
    group, ranks = writer.intern("0"), writer.intern("0,1")
    causes = []
    for index, parameters in enumerate(("module.2.bias, module.2.weight", "module.0.bias, module.0.weight\x1b[31m")):
        cause_id = writer.next_id("collective_causes")
        writer.append("collective_causes", (cause_id, 0, "ddp_bucket", "backward", writer.intern("DistributedDataParallel"), writer.intern(parameters),
                                            None, None, None, None, None, None, index, 52428, None, line))
        causes.append((cause_id, 66048 + index))
    redistribute = writer.next_id("collective_causes")
    writer.append("collective_causes", (redistribute, 0, "redistribute", "forward", None, None, writer.intern("aten._softmax.default"), None,
                                        "Shard(1)", "Replicate()", "32,384", "32,192", None, None, None, None))
    causes.append((redistribute, 49152))
    for step in range(2):
        writer.append("steps", (0, step, step * 1000, step * 1000 + 900, "optimizer"))
        for cause_id, nbytes in causes:
            writer.append("collectives", (0, "all_reduce", nbytes, "f32", group, ranks, line, step * 1000 + 10, 100, None, "gloo:ring", None, step, cause_id))
    writer.update_run(end_ns=2000, exit_status=0)
    writer.close()
    return path


def test_bucket_and_redistribution_details(tmp_path: Path) -> None:
    with open_trace(_write(tmp_path / "details.tptrace")) as trace:
        tables = sharding_tables(trace, 0)
    (buckets,) = [group for group in tables.causes if group.cause == "ddp_bucket"]
    assert buckets.count == 4
    assert buckets.details[0] == "bucket 0: 64.5 KiB · module.2.bias, module.2.weight"
    assert buckets.details[1].startswith("bucket 1: 64.5 KiB · module.0.bias, module.0.weight") and "\x1b" not in buckets.details[1]
    (redistribution,) = [group for group in tables.causes if group.cause == "redistribute"]
    assert redistribution.details == ("Shard(1) -> Replicate(), shape 32,384, aten._softmax.default",)
