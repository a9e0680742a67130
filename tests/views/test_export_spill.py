"""Perfetto export in bounded memory: a chip's programs and ops are written as text as they come and
moved to a temporary file past a threshold. Forcing a tiny threshold (everything spills) gives the same
file, byte for byte, as keeping it all in memory, on real traces in both eager modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tputrace
from fixtures.make_traces import build_sample_trace
from tputrace.viewers.export.perfetto import export_perfetto
from views.test_export import _small_trace, check_trace_event_json


def _both_ways(trace_path: Path, out: Path) -> tuple[bytes, bytes]:
    with tputrace.open(trace_path) as trace:
        in_memory = export_perfetto(trace, out / "memory.json", spill_lines=10**9)
        spilled = export_perfetto(trace, out / "spilled.json", spill_lines=3)
    assert (in_memory.slices, in_memory.flows) == (spilled.slices, spilled.flows)
    return in_memory.path.read_bytes(), spilled.path.read_bytes()


def test_spilled_perfetto_export_equals_the_in_memory_one(tmp_path: Path) -> None:
    trace_path = build_sample_trace(tmp_path / "sample.tptrace")
    in_memory, spilled = _both_ways(trace_path, tmp_path)
    assert spilled == in_memory
    events = json.loads(spilled)["traceEvents"]
    op_slices = [event for event in events if event.get("cat") == "aten op"]
    assert len(op_slices) > 3  # more than the threshold: they went through the file
    assert check_trace_event_json(tmp_path / "spilled.json")["flows"] > 0


@pytest.mark.parametrize("strict", [False, True], ids=["defer", "strict"])
def test_spilled_export_keeps_flows_and_nesting_in_both_modes(tmp_path: Path, strict: bool) -> None:
    trace_path = _small_trace(tmp_path / "small.tptrace", strict=strict)
    in_memory, spilled = _both_ways(trace_path, tmp_path)
    assert spilled == in_memory
    found = check_trace_event_json(tmp_path / "spilled.json")
    assert found["flows"] > 0
