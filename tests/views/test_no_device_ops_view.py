"""The TUI overview's run facts say loudly that no op ran on the tpu device, and only then."""

from __future__ import annotations

from pathlib import Path

import pytest

import tputrace
from tputrace.derived.run_facts import run_facts
from tputrace.store.writer import TraceWriter
from tputrace.summary import NO_DEVICE_OPS_TEXT

pytest.importorskip("textual")

START_UNIX_NS = 1_700_000_000_000_000_000


def _trace(path: Path, *, with_op: bool) -> Path:
    with TraceWriter(path, created_unix_ns=START_UNIX_NS) as writer:
        writer.set_run(rank=0, world_size=1, script="/x/train.py", argv=[], host="box", chips=1, platform="cpu",
                       eager_mode="DEFER_AND_FUSE", start_unix_ns=START_UNIX_NS)
        if with_op:
            frame = writer.frame("/x/train.py", 7, "step")
            writer.append("ops", (1, 0, writer.intern("aten.add.Tensor"), writer.intern("f32[4]"), writer.intern("f32[4]"),
                                  0, 1_000, 2_000, frame, None, 0, None, None))
        writer.update_run(end_ns=10_000, exit_status=0)
    return path


@pytest.mark.parametrize("with_op", [False, True])
def test_overview_facts_flag_a_run_without_tpu_ops(tmp_path: Path, with_op: bool) -> None:
    from tputrace.tui.overview import facts_text

    with tputrace.open(_trace(tmp_path / "run.tptrace", with_op=with_op)) as trace:
        text = facts_text(run_facts(trace)).plain
    assert (NO_DEVICE_OPS_TEXT in text) is not with_op
