"""Each collective's recorded cause in the exports: args of the Perfetto slices, stats of the XProf events."""

from __future__ import annotations

from pathlib import Path

import test_export as export_checks

import tputrace
from tputrace.cli.main import main

CAUSE_ARGS = {"cause": "ddp_bucket", "cause_phase": "backward", "cause_module": "DistributedDataParallel"}


def _caused_collectives(trace_path: Path) -> int:
    with tputrace.open(trace_path) as trace:
        ((count,),) = trace.sql("SELECT COUNT(*) FROM collectives WHERE cause_id IS NOT NULL")
    return count


def test_perfetto_collectives_carry_their_cause(sample_trace_path: Path, tmp_path: Path) -> None:
    output = tmp_path / "sample.json"
    assert main(["export", str(sample_trace_path), "--perfetto", str(output)]) == 0
    found = export_checks.check_trace_event_json(output)
    collectives = [args for (pid, tid), items in found["slices"].items() if found["threads"][(pid, tid)] == "Collectives"
                   for _, _, _, args in items]
    caused = [args for args in collectives if "cause" in args]
    assert len(caused) == _caused_collectives(sample_trace_path) > 0
    assert all(args.items() >= CAUSE_ARGS.items() and args["cause_line"].endswith("train.py:19") for args in caused)
    assert all("cause_placements" not in args for args in caused)  # a DDP bucket has no placements
    assert any("cause" not in args for args in collectives)  # the user's own broadcast has none


def test_xprof_collectives_carry_their_cause(sample_trace_path: Path, tmp_path: Path) -> None:
    assert main(["export", str(sample_trace_path), "--tensorboard", str(tmp_path), "--run", "sample"]) == 0
    caused = 0
    for rank in (0, 1):
        space = export_checks._xspace(tmp_path / "plugins" / "profile" / "sample" / f"tpu-vm-{rank}.xplane.pb")
        host = space.planes[-1]
        line = next(line for line in host.lines if line.name == "Collectives")
        stats = [export_checks._stats(host, host.event_metadata[event.metadata_id].stats) for event in line.events]
        with_cause = [event_stats for event_stats in stats if "cause" in event_stats]
        assert all(event_stats.items() >= CAUSE_ARGS.items() and event_stats["cause_line"].endswith("train.py:19")
                   for event_stats in with_cause)
        caused += len(with_cause)
    assert caused == _caused_collectives(sample_trace_path)
