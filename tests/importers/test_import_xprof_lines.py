"""XProf lines beyond a chip's `XLA Modules` and `XLA Ops`, as libtpu and XProf write them: the ops of a chip's
SparseCores (a plane `/device:TPU:n SparseCore m`, its `Sparse Core Ops` line), an asynchronous op's span in flight
(the `Async XLA Ops` line: `copy-start` to `copy-done`), and counter samples (a `_counters_` line: zero-length
events named for their counter, the value a stat), on a chip's plane and on the host's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tputrace
from tputrace.cli.main import main
from tputrace.xplane_proto import messages

CLASSES = messages()
START_NS = 1_700_000_000_000_000_000
MS_PS = 10**9
STATS = ("device_type_string", "hlo_category", "program_id", "run_id", "hlo_op", "value", "step_num")


def _named_stats(plane: Any) -> dict[str, int]:
    for number, name in enumerate(STATS, start=1):
        plane.stat_metadata[number].id = number
        plane.stat_metadata[number].name = name
    return {name: number for number, name in enumerate(STATS, start=1)}


def _event_metadata(plane: Any, key: int, name: str, display_name: str = "", **stats: Any) -> None:
    stat_ids = _named_stats(plane)
    metadata = plane.event_metadata[key]
    metadata.id, metadata.name, metadata.display_name = key, name, display_name
    for stat, value in stats.items():
        field = "str_value" if isinstance(value, str) else "uint64_value"
        metadata.stats.add(metadata_id=stat_ids[stat], **{field: value})


def _capture(path: Path) -> Path:
    """One TPU v6e chip running `jit_step` twice (a fusion, then a host-offload copy's `copy-start` and `copy-done`,
    the copy 3 ms in flight), its SparseCore running a gather in each run, an HBM counter sampled three times, and the
    host's steps and a counter of its own; the SparseCore's plane has its own steps line."""
    space = CLASSES["XSpace"]()
    chip = space.planes.add(id=1, name="/device:TPU:0")
    stat_ids = _named_stats(chip)
    chip.stats.add(metadata_id=stat_ids["device_type_string"], str_value="TPU v6 Lite")
    _event_metadata(chip, 1, "jit_step(7)")
    _event_metadata(chip, 2, "%fusion.1 = f32[8] fusion(...)", "fusion.1", hlo_category="loop fusion", program_id=7)
    _event_metadata(chip, 3, "%copy-start.1 = (f32[8]{0:S(5)}, u32[]) copy-start(f32[8]{0} %p)", "copy-start.1",
                    hlo_category="copy-start", program_id=7)
    _event_metadata(chip, 4, "%copy-done.1 = f32[8]{0:S(5)} copy-done(%copy-start.1)", "copy-done.1",
                    hlo_category="copy-done", program_id=7)
    _event_metadata(chip, 5, "%copy-start.1 = (f32[8]{0:S(5)}, u32[]) copy-start(f32[8]{0} %p)", "async-copy",
                    hlo_category="copy-start", program_id=7)
    _event_metadata(chip, 6, "HBM used (bytes)")
    modules = chip.lines.add(id=1, name="XLA Modules", timestamp_ns=START_NS)
    ops = chip.lines.add(id=2, name="XLA Ops", timestamp_ns=START_NS)
    in_flight = chip.lines.add(id=3, name="Async XLA Ops", timestamp_ns=START_NS)
    counters = chip.lines.add(id=4, name="_counters_", timestamp_ns=START_NS)
    sparse = space.planes.add(id=2, name="/device:TPU:0 SparseCore 0")
    _named_stats(sparse)
    _event_metadata(sparse, 1, "jit_step(7)")
    _event_metadata(sparse, 2, "%gather.3 = f32[64,8] gather(...)", "gather.3", hlo_category="gather", program_id=7)
    sparse_modules = sparse.lines.add(id=1, name="Sparse Core Modules", timestamp_ns=START_NS)
    sparse_ops = sparse.lines.add(id=2, name="Sparse Core Ops", timestamp_ns=START_NS)
    _event_metadata(sparse, 3, "SparseCore step")
    sparse_steps = sparse.lines.add(id=3, name="Sparse Core Steps", timestamp_ns=START_NS)
    for run in range(2):
        at = run * 10 * MS_PS
        modules.events.add(metadata_id=1, offset_ps=at, duration_ps=5 * MS_PS).stats.add(
            metadata_id=stat_ids["run_id"], uint64_value=run + 1)
        ops.events.add(metadata_id=2, offset_ps=at, duration_ps=MS_PS)
        ops.events.add(metadata_id=3, offset_ps=at + MS_PS, duration_ps=MS_PS // 10)
        ops.events.add(metadata_id=4, offset_ps=at + 4 * MS_PS, duration_ps=MS_PS // 2)
        in_flight.events.add(metadata_id=5, offset_ps=at + MS_PS, duration_ps=3 * MS_PS).stats.add(
            metadata_id=stat_ids["hlo_op"], str_value="copy-done.1")
        sparse_modules.events.add(metadata_id=1, offset_ps=at, duration_ps=2 * MS_PS)
        sparse_ops.events.add(metadata_id=2, offset_ps=at + MS_PS // 2, duration_ps=MS_PS)
        sparse_steps.events.add(metadata_id=3, offset_ps=at + MS_PS // 2, duration_ps=MS_PS).stats.add(
            metadata_id=stat_ids["step_num"], uint64_value=100 + run)
    for sample, used in enumerate((1 << 30, 3 << 30, 2 << 30)):
        counters.events.add(metadata_id=6, offset_ps=sample * 8 * MS_PS).stats.add(
            metadata_id=stat_ids["value"], uint64_value=used)
    host = space.planes.add(id=3, name="/host:CPU")
    host_stats = _named_stats(host)
    _event_metadata(host, 1, "train")
    _event_metadata(host, 2, "Host memory (bytes)")
    main_thread = host.lines.add(id=1, name="main/1", timestamp_ns=START_NS)
    host_counters = host.lines.add(id=2, name="_counters_", timestamp_ns=START_NS)
    for run in range(2):
        main_thread.events.add(metadata_id=1, offset_ps=run * 10 * MS_PS, duration_ps=9 * MS_PS).stats.add(
            metadata_id=host_stats["step_num"], uint64_value=run)
        host_counters.events.add(metadata_id=2, offset_ps=run * 10 * MS_PS).stats.add(
            metadata_id=host_stats["value"], uint64_value=(run + 1) << 20)
    path.write_bytes(space.SerializeToString())
    return path


def test_sparsecore_ops_async_spans_and_counters_are_read(tmp_path: Path) -> None:
    output = tmp_path / "imported.tptrace"
    assert main(["import", str(_capture(tmp_path / "t1v-n-0.xplane.pb")), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        ops = trace.sql("SELECT s.text, ops.chip, ops.step FROM ops JOIN strings s ON s.id = ops.op_sid "
                        "ORDER BY ops.start_ns, s.text")
        # The SparseCore's gathers are the chip's ops; the copy in flight is no op of its own.
        assert [name for name, _, _ in ops] == ["fusion.1", "gather.3", "copy-start.1", "copy-done.1"] * 2
        assert {(chip, step) for _, chip, step in ops} == {(0, 0), (0, 1)}
        assert trace.sql("SELECT chips FROM runs") == [(1,)]
        # The host's steps: the SparseCore's own `Sparse Core Steps` (its step numbers) are not the loop's.
        assert trace.sql("SELECT step, source FROM steps ORDER BY step") == [(0, "imported"), (1, "imported")]
        assert trace.count("executions") == 2  # the SparseCore's module spans are the same runs
        assert trace.sql("SELECT s.text, a.start_ns, a.dur_ns, a.step FROM annotations a JOIN strings s "
                         "ON s.id = a.name_sid WHERE a.source = 'xla_async' ORDER BY a.start_ns") == [
            ("async-copy copy-start.1", 1_000_000, 3_000_000, 0), ("async-copy copy-start.1", 11_000_000, 3_000_000, 1)]
        assert not trace.sql("SELECT 1 FROM annotations a JOIN strings s ON s.id = a.name_sid "
                             "WHERE s.text LIKE '%memory%' OR s.text LIKE 'HBM%'")  # counters are no spans
        (source,) = json.loads(trace.meta["imported"])
    assert source["counters"] == {
        "/device:TPU:0": {"HBM used (bytes)": {"samples": 3, "min": 1 << 30, "max": 3 << 30, "last": 2 << 30}},
        "/host:CPU": {"Host memory (bytes)": {"samples": 2, "min": 1 << 20, "max": 2 << 20, "last": 2 << 20}}}
