"""The fusion finding's advice for steps cut by collectives fits what the collectives are: a model sharded
with FSDP2, whose all-gathers and reduce-scatters are per wrapped group, is told to wrap fewer, larger
groups and prefetch, not DDP's flattened all-reduce, buckets and `no_sync()`."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fresh_distributed import _report, _run
from test_fresh_distributed2 import LEAF_WRAPPED_FSDP

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")


def test_steps_cut_by_fsdp_collectives_are_told_to_wrap_fewer_groups_not_to_use_ddp_buckets(tmp_path: Path) -> None:
    _, trace, _ = _run(tmp_path, "leaf_wrapped_cuts", LEAF_WRAPPED_FSDP)
    findings = _report(trace).findings
    cut = [finding for finding in findings if finding.title.startswith("Fragmented fusion") and "by collective" in finding.title]
    assert cut, [finding.title for finding in findings]
    for finding in cut:
        suggestion = finding.suggestion or ""
        assert "fully_shard" in suggestion and "prefetch" in suggestion, suggestion
        assert "no_sync" not in suggestion and "DDP" not in suggestion and "flattened" not in suggestion, suggestion
