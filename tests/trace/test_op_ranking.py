"""Ops ranked by host dispatch without the flushes and compiles that ran inside a call."""

from __future__ import annotations

from pathlib import Path

from fixtures.make_traces import MS, build_trace_with_a_flush_inside_an_op
from tputrace.analysis.target import target_chip
from tputrace.derived.op_ranking import rank_ops
from tputrace.store.reader import open_trace


def test_flushes_and_compiles_inside_a_call_are_not_its_dispatch(tmp_path: Path) -> None:
    with open_trace(build_trace_with_a_flush_inside_an_op(tmp_path / "nested.tptrace")) as trace:
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
