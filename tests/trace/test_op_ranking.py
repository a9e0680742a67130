"""Ops ranked by host dispatch without the flushes and compiles that ran inside a call."""

from __future__ import annotations

from pathlib import Path

from tputrace.analysis.target import target_chip
from tputrace.derived.op_ranking import rank_ops
from tputrace.store.reader import open_trace
from tputrace.store.writer import TraceWriter

MS = 1_000_000


def _trace_with_a_flush_inside_an_op(path: Path) -> Path:
    """`aten.mul_` dispatches for 750 ms, of which a flush took 720 ms and its compile (inside the
    flush) 700 ms; `aten.bmm` dispatches twice for 20 ms each."""
    with TraceWriter(path) as writer:
        writer.set_run(world_size=1, script="train.py", argv=[], platform="cpu", eager_mode="DEFER_AND_FUSE")
        mul, bmm = writer.intern("aten._foreach_mul_.Scalar"), writer.intern("aten.bmm.default")
        writer.append("ops", (1, 0, bmm, None, None, 0, 0, 20 * MS, None, None, 1, None, None))
        writer.append("ops", (2, 0, bmm, None, None, 0, 30 * MS, 20 * MS, None, None, 1, None, None))
        writer.append("ops", (3, 0, mul, None, None, 0, 60 * MS, 750 * MS, None, None, 1, None, None))
        writer.append("flushes", (1, 0, None, "step", None, 2, 0, 0, 70 * MS, 720 * MS, 0, 0, 1))
        writer.append("compiles", (1, 0, None, "fused", None, None, 0, 75 * MS, 700 * MS, None, 1, "first", None, None))
    return path


def test_flushes_and_compiles_inside_a_call_are_not_its_dispatch(tmp_path: Path) -> None:
    with open_trace(_trace_with_a_flush_inside_an_op(tmp_path / "nested.tptrace")) as trace:
        ranking = rank_ops(trace, 0)
    by_name = {op.op: op for op in ranking.ops}
    assert ranking.ops[0].op == "aten.bmm.default"
    assert by_name["aten.bmm.default"].self_dispatch_ns == 40 * MS
    assert by_name["aten._foreach_mul_.Scalar"].dispatch_ns == 750 * MS
    assert by_name["aten._foreach_mul_.Scalar"].self_dispatch_ns == 30 * MS
    assert ranking.nested_ns == 720 * MS
    assert abs(by_name["aten.bmm.default"].self_dispatch_share - 40 / 70) < 1e-9


def test_chip_time_shares_add_up_on_the_sample_trace(sample_trace_path: Path) -> None:
    with open_trace(sample_trace_path) as trace:
        ranking = rank_ops(trace, 0, target_chip("v5e"))
    assert ranking.target == "v5e" and ranking.chip_ns > 0
    assert abs(sum(op.chip_share for op in ranking.ops) - 1.0) < 1e-6
    assert [op.self_dispatch_ns for op in ranking.ops] == sorted((op.self_dispatch_ns for op in ranking.ops), reverse=True)
