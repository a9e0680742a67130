"""A JAX step sharded over 4 virtual XLA:CPU devices, its gradients reduced by XLA's all-reduces: its collectives'
share is a finding whose advice is JAX's (`psum`/`pmean` after a scan of micro-batches, sharding), not torch's DDP
buckets or `no_sync`."""

from __future__ import annotations

from pathlib import Path

from tputrace.analysis import analyze_path
from tputrace.cli.main import main


def test_a_sharded_jax_steps_collectives_get_jax_advice(tmp_path: Path) -> None:
    from captures import jax_sharded_capture

    output = tmp_path / "imported.tptrace"
    assert main(["import", str(jax_sharded_capture(tmp_path)), "-o", str(output)]) == 0
    findings = [finding for finding in analyze_path(output).findings if finding.analyzer == "collectives"]
    assert findings
    for finding in findings:
        assert "DDP" not in finding.suggestion and "no_sync" not in finding.suggestion, finding.suggestion
    assert any("pmean" in finding.suggestion for finding in findings)
