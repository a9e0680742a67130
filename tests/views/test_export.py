"""TensorBoard (XProf) and Perfetto export: the files, what xprof's own converters and server make of
them, the Perfetto JSON's structure, and the export's contracts (no torch/jax, strings as data).

Traces: `examples/gpt_train.py` and `examples/ddp_train.py` on two ranks, recorded here (once per
module), the two-rank synthetic sample trace (`tests/fixtures/make_traces.py`, which has every kind
of record), and small hand-written traces for strict mode, interleaved flushes and hostile strings.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tputrace
from fixtures.make_traces import START_UNIX_NS, build_sample_trace
from tputrace.cli.main import main
from tputrace.store.writer import TraceWriter
from tputrace.derived import device_runs
from tputrace.derived.op_cost import TIME_ESTIMATE_NOTE, OpCost, op_cost
from tputrace.derived.trace_tables import TraceTables
from tputrace import xplane_proto
from tputrace.analysis.target import DEFAULT_TARGET, target_chip
from tputrace.viewers.export.xplane_device import framework_op

REPO_ROOT = Path(__file__).resolve().parents[2]
CORE_TOOLS = ("trace_viewer", "op_profile", "overview_page", "framework_op_stats")


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two-rank synthetic trace (stands in for a distributed run until one is recorded)."""
    return build_sample_trace(tmp_path_factory.mktemp("sample") / "sample.tptrace")


@pytest.fixture(scope="module")
def ddp_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/ddp_train.py on two ranks (`tputrace run --nproc 2`), merged into one trace."""
    pytest.importorskip("torch", reason="recording an example needs torch (pip install -e .[backend])")
    pytest.importorskip("jax", reason="recording an example needs jax (pip install -e .[backend])")
    trace_path = tmp_path_factory.mktemp("ddp") / "ddp.tptrace"
    result = subprocess.run(
        [sys.executable, "-m", "tputrace.cli.main", "run", "--nproc", "2", "-o", str(trace_path),
         str(REPO_ROOT / "examples" / "ddp_train.py"), "--steps", "3"],
        capture_output=True, text=True, timeout=900, cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return trace_path


@pytest.fixture(scope="module")
def gpt_logdir(gpt_train_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    logdir = tmp_path_factory.mktemp("gpt_logdir")
    assert main(["export", str(gpt_train_trace), "--tensorboard", str(logdir), "--run", "gpt"]) == 0
    return logdir


@pytest.fixture(scope="module")
def sample_logdir(sample_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    logdir = tmp_path_factory.mktemp("sample_logdir")
    assert main(["export", str(sample_trace), "--tensorboard", str(logdir), "--run", "sample"]) == 0
    return logdir


@pytest.fixture(scope="module")
def r2t() -> Any:
    return pytest.importorskip("xprof.convert.raw_to_tool_data", reason="needs xprof (pip install -e .[views])")


def _xspace(path: Path) -> Any:
    return xplane_proto.messages()["XSpace"].FromString(path.read_bytes())


def _tool(r2t: Any, paths: list[Path], tool: str) -> Any:
    data, _ = r2t.xspace_to_tool_data([str(path) for path in paths], tool, {"use_saved_result": False})
    assert data is not None, f"xprof could not convert {tool}"
    return json.loads(data)


# -- what the trace says (expected values come from the trace, not from constants) ------------------


def _device_ops(trace_path: Path) -> tuple[set[str], set[str], set[int]]:
    """ATen ops that ran in programs, the module paths among them, and their source lines."""
    with tputrace.open(trace_path) as trace:
        rows = trace.sql(
            "SELECT DISTINCT s.text, m.text, f.line FROM ops o JOIN strings s ON s.id = o.op_sid "
            "LEFT JOIN strings m ON m.id = o.module_sid LEFT JOIN frames f ON f.id = o.frame_id "
            "WHERE o.program_id IS NOT NULL AND o.flush_id IN (SELECT flush_id FROM executions)"
        )
    return {op for op, _, _ in rows}, {module for _, module, _ in rows if module}, {line for _, _, line in rows if line}


def _op_profile_leaves(node: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """op_profile's ops (leaves) with their source info; an ATen op's position in its program
    (`aten.mm.default.7`) is left out of its name."""
    if not node.get("children"):
        xla = node.get("xla") or {}
        name = re.sub(r"\.\d+$", "", node["name"])
        return [(name, xla.get("sourceInfo", {}))] if xla.get("category") not in (None, "", "IDLE") else []
    return [leaf for child in node["children"] for leaf in _op_profile_leaves(child)]


def _table(tables: list[dict[str, Any]], first_column: str) -> dict[str, Any]:
    """The overview page's table whose first column is `first_column`."""
    return next(table for table in tables if table.get("cols") and table["cols"][0]["id"] == first_column)


def _stats(plane: Any, stats: Any) -> dict[str, Any]:
    """Stats by name, with ref values resolved."""
    names = {metadata_id: metadata.name for metadata_id, metadata in plane.stat_metadata.items()}
    values = {}
    for stat in stats:
        kind = stat.WhichOneof("value")
        value = getattr(stat, kind)
        values[names[stat.metadata_id]] = names[value] if kind == "ref_value" else value
    return values


# -- the XPlane files -------------------------------------------------------------------------------


def test_two_rank_export_writes_one_host_file_per_rank_with_device_and_host_planes(sample_logdir: Path) -> None:
    run_dir = sample_logdir / "plugins" / "profile" / "sample"
    assert sorted(path.name for path in run_dir.glob("*.xplane.pb")) == ["tpu-vm-0.xplane.pb", "tpu-vm-1.xplane.pb"]
    space = _xspace(run_dir / "tpu-vm-1.xplane.pb")
    assert list(space.hostnames) == ["tpu-vm-1"]
    names = [plane.name for plane in space.planes]
    assert names == ["/device:TPU:0", "/device:TPU:1", "/device:TPU:2", "/device:TPU:3", "/host:CPU"]
    device = space.planes[0]
    assert [line.name for line in device.lines] == ["Steps", "XLA Modules", "XLA Ops"]
    chip = target_chip(DEFAULT_TARGET)  # the export's default, v6e
    assert _stats(device, device.stats) == {
        **_stats(device, device.stats),
        "device_type_string": "TPU v6 lite",
        "peak_teraflops_per_second": chip.peak_teraflops_per_second,
        "peak_hbm_bw_gigabytes_per_second": chip.hbm_gigabytes_per_second,
    }
    host = space.planes[-1]
    assert {"Python dispatch", "Flushes", "XLA Compile", "Syncs", "Transfers", "CPU fallbacks", "Collectives"} <= {
        line.name for line in host.lines
    }


def test_every_stat_names_its_plane_stat_metadata(sample_logdir: Path) -> None:
    """Stats that only events carry (a transfer's bytes, a flush's id) are named too, or XProf shows them nameless."""
    run_dir = sample_logdir / "plugins" / "profile" / "sample"
    for path in run_dir.glob("*.xplane.pb"):
        for plane in _xspace(path).planes:
            named = set(plane.stat_metadata)
            used = {stat.metadata_id for stat in plane.stats}
            used |= {stat.metadata_id for metadata in plane.event_metadata.values() for stat in metadata.stats}
            used |= {stat.metadata_id for line in plane.lines for event in line.events for stat in event.stats}
            assert used <= named, (path.name, plane.name, sorted(used - named))
            if plane.name == "/host:CPU":
                lines = {line.name: line for line in plane.lines}
                assert "bytes" in _stats(plane, lines["Transfers"].events[0].stats)
                assert "flush_id" in _stats(plane, lines["Flushes"].events[0].stats)


def test_op_metadata_carries_category_framework_op_source_and_costs(sample_logdir: Path, sample_trace: Path) -> None:
    from xprof.protobuf import op_metrics_pb2  # the real message, to check our hand-written encoding

    space = _xspace(sample_logdir / "plugins" / "profile" / "sample" / "tpu-vm-0.xplane.pb")
    device = space.planes[0]
    ops_line = next(line for line in device.lines if line.name == "XLA Ops")
    used = {event.metadata_id for event in ops_line.events}
    metadata = [device.event_metadata[metadata_id] for metadata_id in used]
    stats = [_stats(device, entry.stats) for entry in metadata]
    keys = set()
    for entry, values in zip(metadata, stats):
        assert {"program_id", "symbol_id", "hlo_category", "tf_op", "flops", "bytes_accessed"} <= values.keys(), entry.name
        keys.add((values["program_id"], values["symbol_id"]))
        scope, _, op_type = values["tf_op"].rpartition(":")
        assert scope.endswith(entry.name.rsplit(".", 1)[0]) and re.fullmatch(r"[a-z_][a-z0-9_]*", op_type), values["tf_op"]
        assert re.fullmatch(r".+\.py:\d+", values["source"])
        breakdown = op_metrics_pb2.MemoryAccessBreakdown.FromString(values["memory_access_breakdown"])
        assert sum(access.bytes_accessed for access in breakdown.memory_accessed) == pytest.approx(values["bytes_accessed"], abs=2)
        assert {access.memory_space for access in breakdown.memory_accessed} == {1}  # HBM
        assert values["time_estimate"] == TIME_ESTIMATE_NOTE  # stored once, referred to by id
    assert len(keys) == len(metadata)  # program_id + symbol_id identify an op
    by_name = {entry.name.rsplit(".", 1)[0]: values for entry, values in zip(metadata, stats)}
    assert by_name["aten.addmm.default"]["hlo_category"] == "matmul"
    assert "GPT.blocks.0.attn.c_attn/aten.addmm.default:addmm" in {values["tf_op"] for values in stats}


def test_ops_nest_in_their_program_and_share_its_flops(sample_logdir: Path, sample_trace: Path) -> None:
    space = _xspace(sample_logdir / "plugins" / "profile" / "sample" / "tpu-vm-0.xplane.pb")
    device = space.planes[0]
    lines = {line.name: line for line in device.lines}
    modules, ops = lines["XLA Modules"].events, lines["XLA Ops"].events
    for line in (modules, ops):
        offsets = [event.offset_ps for event in line]
        assert offsets == sorted(offsets)  # XProf walks lines in time order
    with tputrace.open(sample_trace) as trace:
        program_flops = dict(trace.sql("SELECT id, flops FROM programs"))
    op_index = 0
    for module in modules:
        end = module.offset_ps + module.duration_ps
        program_id = _stats(device, device.event_metadata[module.metadata_id].stats)["program_id"]
        flops = 0
        while op_index < len(ops) and ops[op_index].offset_ps < end:
            op = ops[op_index]
            assert module.offset_ps <= op.offset_ps and op.offset_ps + op.duration_ps <= end + 1
            op_stats = _stats(device, device.event_metadata[op.metadata_id].stats)
            assert op_stats["program_id"] == program_id
            flops += op_stats["flops"]
            op_index += 1
        assert flops == pytest.approx(program_flops[program_id], rel=1e-6, abs=len(ops))
    assert op_index == len(ops)


def test_host_plane_has_compile_reasons_and_what_changed(sample_logdir: Path) -> None:
    space = _xspace(sample_logdir / "plugins" / "profile" / "sample" / "tpu-vm-0.xplane.pb")
    host = space.planes[-1]
    compiles = next(line for line in host.lines if line.name == "XLA Compile")
    reasons = [_stats(host, host.event_metadata[event.metadata_id].stats) for event in compiles.events]
    assert {"first", "recompile", "guard_failure"} <= {stats["reason"] for stats in reasons}
    assert "input 0 dim 1: 128 -> 192" in {stats.get("what_changed") for stats in reasons}


# -- xprof's own converters -------------------------------------------------------------------------


def test_xprof_tools_show_the_gpt_trace_ops_steps_and_lines(gpt_train_trace: Path, gpt_logdir: Path, r2t: Any) -> None:
    files = sorted((gpt_logdir / "plugins" / "profile" / "gpt").glob("*.xplane.pb"))
    assert len(files) == 1
    assert set(CORE_TOOLS) <= {tool.rstrip("@") for tool in r2t.xspace_to_tool_names([str(files[0])])}
    ops, modules, lines = _device_ops(gpt_train_trace)
    with tputrace.open(gpt_train_trace) as trace:
        loop_steps = trace.count("steps", where="source != 'end'")
        steps = trace.count("steps")  # the loop's and an `end` step: the losses are read after the loop
    assert ops and modules and lines and loop_steps == 4

    trace_viewer = _tool(r2t, files, "trace_viewer")
    events = trace_viewer["traceEvents"]
    thread_names = {event["args"]["name"] for event in events if event.get("name") == "thread_name"}
    assert {"Steps", "XLA Modules", "XLA Ops", "Python dispatch", "XLA Compile", "Source code", "Framework Ops"} <= thread_names
    names = {event.get("name") for event in events}
    assert ops <= names | {name.rsplit(".", 1)[0] for name in names if name}
    assert any(re.search(r"gpt_train\.py:\d+", name or "") for name in names)

    op_profile = _tool(r2t, files, "op_profile")
    leaves = _op_profile_leaves(op_profile["byProgram"])
    assert leaves and all(name in ops or name.endswith("fusion") or name.startswith("fused") for name, _ in leaves)
    # op_profile lists at most 100 ops per category (the costliest): nearly all of ours are there.
    assert len(ops & {name for name, _ in leaves}) >= 0.9 * len(ops)
    assert {info["lineNumber"] for _, info in leaves} & lines
    assert any(info["fileName"].endswith("gpt_train.py") for _, info in leaves)

    overview = _tool(r2t, files, "overview_page")
    # The loop's steps: the `end` step, where the losses are read after the loop, is not a training step.
    assert len(_table(overview, "stepnum")["rows"]) == loop_steps < steps
    assert _table(overview, "host_id")["p"]["device_type"] == "TPU v6 lite"  # the default target, v6e
    # No hardware counters were read: XProf says so rather than showing 0.0% MXU and HBM utilization.
    analysis = json.dumps(overview)
    assert '"mxu_utilization_percent": "unknown"' in analysis and '"hbm_utilization_percent": "unknown"' in analysis

    framework = _tool(r2t, files, "framework_op_stats")
    operations = {row["c"][3]["v"] for row in framework[0]["rows"]}
    assert any(operation.startswith("GPT.blocks.") and "/aten." in operation for operation in operations)
    assert {op.split(".")[1] for op in ops} & {row["c"][2]["v"] for row in framework[0]["rows"]}


def test_xprof_reads_both_ranks_together(sample_logdir: Path, sample_trace: Path, r2t: Any) -> None:
    files = sorted((sample_logdir / "plugins" / "profile" / "sample").glob("*.xplane.pb"))
    ops, _, _ = _device_ops(sample_trace)
    overview = _tool(r2t, files, "overview_page")
    assert len(_table(overview, "stepnum")["rows"]) == 6
    assert _table(overview, "host_id")["p"]["host_count"] == "2"
    leaves = _op_profile_leaves(_tool(r2t, files, "op_profile")["byProgram"])
    assert ops == {name for name, _ in leaves}
    framework = json.dumps(_tool(r2t, files, "framework_op_stats"))
    assert "GPT.blocks.1.mlp.c_fc/aten.addmm.default" in framework
    trace_viewer = _tool(r2t, files[1:], "trace_viewer")
    assert "allreduce" in json.dumps(trace_viewer).replace("_", "")


def test_recorded_two_rank_ddp_run_exports_one_file_per_rank_that_xprof_reads(ddp_trace: Path, tmp_path: Path,
                                                                              r2t: Any) -> None:
    logdir = tmp_path / "logdir"
    assert main(["export", str(ddp_trace), "--tensorboard", str(logdir), "--run", "ddp",
                 "--perfetto", str(tmp_path / "ddp.json.gz")]) == 0
    files = sorted((logdir / "plugins" / "profile" / "ddp").glob("*.xplane.pb"))
    with tputrace.open(ddp_trace) as trace:
        # The loop's: the two hosts' `end` steps (losses read after the loop) ran no program, and XProf's overview leaves them out.
        ranks, steps = trace.ranks, trace.count("steps", where="rank = 0 AND source != 'end'")
        executions = trace.count("executions")
    assert ranks == [0, 1] and len(files) == 2
    ops, _, lines = _device_ops(ddp_trace)
    overview = _tool(r2t, files, "overview_page")
    assert len(_table(overview, "stepnum")["rows"]) == steps
    assert _table(overview, "host_id")["p"]["host_count"] == "2"
    leaves = _op_profile_leaves(_tool(r2t, files, "op_profile")["byProgram"])
    assert len(ops & {name for name, _ in leaves}) >= 0.9 * len(ops)
    assert {info["lineNumber"] for _, info in leaves} & lines
    framework = json.dumps(_tool(r2t, files, "framework_op_stats"))
    assert "DistributedDataParallel.module" in framework
    for path in files:
        names = {event.get("name") for event in _tool(r2t, [path], "trace_viewer")["traceEvents"]}
        assert "all_reduce" in names  # the gradient all-reduce, on each rank's host plane
    found = check_trace_event_json(tmp_path / "ddp.json.gz")
    assert len(found["processes"]) == 4 and found["flows"] == executions


# -- served over HTTP -------------------------------------------------------------------------------


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=300) as response:
            body = response.read()
            if response.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            return response.status, body
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_xprof_server_on_localhost_serves_every_tool(sample_logdir: Path) -> None:
    pytest.importorskip("xprof.server", reason="needs xprof (pip install -e .[views])")
    from tputrace.cli.tensorboard import XProfServer

    server = XProfServer(sample_logdir, 0)
    server.start_in_thread()
    try:
        assert server.url.startswith("http://127.0.0.1:")
        base = server.url + "data/plugin/profile"
        status, body = _get(f"{base}/runs")
        assert status == 200 and json.loads(body) == ["sample"]
        status, body = _get(f"{base}/run_tools?run=sample")
        tools = json.loads(body)
        assert set(CORE_TOOLS) <= {tool.rstrip("@") for tool in tools}
        for tool in tools:
            tag = urllib.parse.quote(tool)
            status, body = _get(f"{base}/hosts?run=sample&tag={tag}")
            hosts = [entry["hostname"] for entry in json.loads(body)]
            # Per-host tools list both hosts; the overview lists their aggregate.
            assert {"tpu-vm-0", "tpu-vm-1"} <= set(hosts) or hosts == ["ALL_HOSTS"], (tool, hosts)
            for host in hosts:
                status, body = _get(f"{base}/data?run=sample&tag={tag}&host={urllib.parse.quote(host)}")
                assert status == 200 and body, (tool, host)
                json.loads(body)
                if tool in ("op_profile", "framework_op_stats"):
                    assert b"aten.addmm.default" in body
    finally:
        server.stop()


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_tensorboard_command_prints_the_url_and_stops_on_ctrl_c(sample_trace: Path, stop: signal.Signals) -> None:
    pytest.importorskip("xprof.server", reason="needs xprof (pip install -e .[views])")
    process = subprocess.Popen(
        [sys.executable, "-m", "tputrace.cli.main", "tensorboard", str(sample_trace), "--port", "0"],
        stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
    )
    try:
        url = None
        seen = []
        for line in process.stderr:  # type: ignore[union-attr]
            seen.append(line)
            match = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
            if match:
                url = match.group(1)
                break
        assert url, "".join(seen)[-2000:]
        status, body = _get(url + "data/plugin/profile/runs")
        assert status == 200 and json.loads(body) == ["sample"]
        logdir = re.search(r"exported to (\S+)", "".join(seen))
        assert logdir and Path(logdir.group(1)).is_dir()
        process.send_signal(stop)
        rest = process.communicate(timeout=60)[1]
        assert process.returncode == 0, rest[-2000:]
        assert "stopped" in rest
        # Only tputrace's own lines: no xprof INFO at import, no JSON line per HTTP request.
        assert all(line.startswith("tputrace: ") for line in [*seen, *rest.splitlines()] if line.strip()), seen + [rest]
        assert not Path(logdir.group(1)).exists()  # the temporary logdir is gone
    finally:
        if process.poll() is None:
            process.kill()


# -- Perfetto ---------------------------------------------------------------------------------------


def check_trace_event_json(path: Path) -> dict[str, Any]:
    """Structural check of Chrome trace-event JSON; returns what it counted.

    Units: `ts`/`dur` are microseconds with at most three decimals (whole nanoseconds). Every pid has
    a process name and every thread with slices a thread name. Slices on one thread nest or are
    disjoint. Each flow has one `s` and one `f` (binding to the enclosing slice), same id, name and
    category, and each sits inside a slice on its thread.
    """
    document = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
    assert document["displayTimeUnit"] == "ns"
    process_names: dict[int, str] = {}
    thread_names: dict[tuple[int, int], str] = {}
    slices: dict[tuple[int, int], list[tuple[int, int, str, dict[str, Any]]]] = collections.defaultdict(list)
    flows: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)
    counts: collections.Counter[str] = collections.Counter()

    def ns(value: float) -> int:
        whole = round(value * 1000)
        assert abs(whole - value * 1000) < 1e-3, f"{value} us is not a whole number of ns"
        return whole

    for event in document["traceEvents"]:
        phase = event["ph"]
        assert isinstance(event["pid"], int) and isinstance(event.get("tid", 0), int)
        counts[phase] += 1
        if phase == "M":
            if event["name"] == "process_name":
                process_names[event["pid"]] = event["args"]["name"]
            elif event["name"] == "thread_name":
                thread_names[(event["pid"], event["tid"])] = event["args"]["name"]
            continue
        start = ns(event["ts"])
        assert start >= 0
        if phase == "X":
            slices[(event["pid"], event["tid"])].append((start, start + ns(event["dur"]), event["name"], event["args"]))
        elif phase in ("s", "f"):
            flows[event["id"]].append(event)
        elif phase == "i":
            assert event["s"] in ("g", "p", "t")
        elif phase == "C":
            assert all(isinstance(value, (int, float)) for value in event["args"].values())
        else:
            raise AssertionError(f"unexpected phase {phase!r}")
    for thread, items in slices.items():
        assert thread in thread_names and thread[0] in process_names, thread
        items.sort(key=lambda item: (item[0], -item[1]))
        open_ends: list[int] = []
        for start, end, name, _ in items:
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], f"{name} at {start} ns overlaps its parent on {thread_names[thread]}"
            open_ends.append(end)

    def inside(event: dict[str, Any]) -> bool:
        at = ns(event["ts"])
        return any(start <= at <= end for start, end, _, _ in slices[(event["pid"], event["tid"])])

    for flow_id, pair in flows.items():
        assert sorted(event["ph"] for event in pair) == ["f", "s"], flow_id
        start, finish = sorted(pair, key=lambda event: event["ph"] != "s")
        assert start["name"] == finish["name"] and start["cat"] == finish["cat"] and finish["bp"] == "e"
        assert inside(start) and inside(finish), flow_id
    return {"counts": counts, "processes": process_names, "threads": thread_names, "slices": slices, "flows": len(flows)}


def test_perfetto_export_of_gpt_trace_is_well_formed_with_args_counters_instants_and_flows(gpt_train_trace: Path, tmp_path: Path) -> None:
    output = tmp_path / "gpt.json.gz"
    assert main(["export", str(gpt_train_trace), "--perfetto", str(output)]) == 0
    found = check_trace_event_json(output)
    with tputrace.open(gpt_train_trace) as trace:
        executions, compiles, syncs = trace.count("executions"), trace.count("compiles"), trace.count("syncs")
        wall_ns = trace.wall_ns()
    assert found["flows"] == executions  # one arrow per flush -> program
    assert found["counts"]["i"] >= compiles + syncs
    assert found["counts"]["C"] > 0
    with tputrace.open(gpt_train_trace) as trace:
        host = trace.run.host
    assert set(found["processes"].values()) == {f"rank 0 · host {host}", "rank 0 · tpu:0"}
    last_end = max(end for items in found["slices"].values() for _, end, _, _ in items)
    assert last_end <= wall_ns * 1.01  # microsecond units: the timeline is as long as the run
    ops, modules, _ = _device_ops(gpt_train_trace)
    device_slices = [item for (pid, _), items in found["slices"].items() if found["processes"][pid].endswith("tpu:0")
                     for item in items]
    device_ops = {name for _, _, name, args in device_slices if "inputs" in args}
    assert ops <= device_ops
    sample = next(args for _, _, name, args in device_slices if "module" in args and args.get("flops") is not None)
    assert {"inputs", "outputs", "source", "module", "flops", "bytes_accessed"} <= sample.keys()
    assert re.search(r"gpt_train\.py:\d+$", sample["source"])


def test_perfetto_export_of_two_ranks_names_every_process(sample_trace: Path, tmp_path: Path) -> None:
    output = tmp_path / "sample.json"
    assert main(["export", str(sample_trace), "--perfetto", str(output)]) == 0
    found = check_trace_event_json(output)
    assert sorted(found["processes"].values()) == sorted(
        [f"rank {rank} · host tpu-vm-{rank}" for rank in (0, 1)] + [f"rank {rank} · tpu:{chip}" for rank in (0, 1) for chip in range(4)]
    )
    assert found["flows"] == 2 * 13  # 6 steps x 2 flushes + the tolist flush, per rank
    collectives = [args for (pid, tid), items in found["slices"].items() if found["threads"][(pid, tid)] == "Collectives"
                   for _, _, _, args in items]
    assert collectives and all("bus_bandwidth_bytes_per_second" in args for args in collectives)


# -- strict mode, interleaved flushes, hostile strings ----------------------------------------------


def _small_trace(path: Path, *, strict: bool = False, interleave: bool = False, hostile: bool = False) -> Path:
    """Two flushes of three ops (or, `strict`, six one-op programs); `interleave` writes the two
    flushes' ops alternately; `hostile` uses names that are JSON, HTML and format-string syntax."""
    odd = 'aten.evil"</script>%s{}\\n\x01.default' if hostile else "aten.add.Tensor"
    module = 'M/od:ule"<b>' if hostile else "Net.layer"
    with TraceWriter(path, created_unix_ns=START_UNIX_NS) as writer:
        writer.set_run(rank=0, world_size=1, script="/x/train.py", argv=[], host="../../etc" if hostile else "box",
                       chips=1, platform="tpu", eager_mode="DEFER_NEVER" if strict else "DEFER_AND_FUSE",
                       start_unix_ns=START_UNIX_NS)
        frame = writer.frame('/x/tr"ain.py' if hostile else "/x/train.py", 7, "step")
        op_sid, shapes, mod = writer.intern(odd), writer.intern("f32[64,64], f32[64,64]"), writer.intern(module)
        out = writer.intern("f32[64,64]")
        rows = []
        for flush in range(2):
            program_id = writer.next_id("programs")
            if strict:
                for position in range(3):
                    seq = flush * 3 + position + 1
                    own = program_id if position == 0 else writer.next_id("programs")
                    writer.append("programs", (own, 0, "op", op_sid, op_sid, shapes, 1, 4096.0, 49152.0, 3))
                    rows.append((seq, 0, op_sid, shapes, out, 0, 1_000_000 * seq, 50_000, frame, mod, 1, own, None))
                continue
            writer.append("programs", (program_id, 0, "fused", writer.intern(f"fused_{flush}"), writer.intern("s"),
                                       shapes, 3, 12288.0, 147456.0, 9))
            writer.append("fusions", (0, program_id, writer.intern("fusion.1"), writer.intern("kLoop"),
                                      writer.intern("add"), op_sid))
            flush_id = writer.next_id("flushes")
            start = 10_000_000 * (flush + 1)
            writer.append("flushes", (flush_id, 0, program_id, "item", frame, 3, 0, 0, start, 400_000, 1, 1, 1))
            writer.append("executions", (0, program_id, 0, start + 100_000, 300_000, 1, flush_id))
            for position in range(3):
                seq = flush * 3 + position + 1
                rows.append((seq, 0, op_sid, shapes, out, 0, start - 50_000 + position * 10_000, 5_000, frame, mod, 1,
                             program_id, flush_id))
        if interleave:
            rows = [row for pair in zip(rows[:3], rows[3:]) for row in pair]
        for row in rows:
            writer.append("ops", row)
        writer.append("steps", (0, 1, 0, 30_000_000, "explicit"))
        writer.update_run(end_ns=31_000_000, exit_status=0)
    return path


def _device_op_events(logdir: Path) -> tuple[Any, list[Any]]:
    [path] = (logdir / "plugins" / "profile").glob("*/*.xplane.pb")
    space = _xspace(path)
    device = space.planes[0]
    return device, next(line for line in device.lines if line.name == "XLA Ops").events


def test_strict_mode_ops_are_the_programs(tmp_path: Path) -> None:
    trace_path = _small_trace(tmp_path / "strict.tptrace", strict=True)
    assert main(["export", str(trace_path), "--tensorboard", str(tmp_path / "logdir"), "--perfetto", str(tmp_path / "s.json")]) == 0
    device, events = _device_op_events(tmp_path / "logdir")
    assert len(events) == 6
    assert [event.duration_ps for event in events] == [50_000_000] * 6  # measured, not estimated
    stats = _stats(device, device.event_metadata[events[0].metadata_id].stats)
    assert "time_estimate" not in stats and stats["flops"] == 4096
    found = check_trace_event_json(tmp_path / "s.json")
    assert found["flows"] == 6  # dispatch -> its own program


@pytest.mark.parametrize("sources", [("optimizer", "optimizer", "end"), ("end",)], ids=["loop-and-end", "end-only"])
def test_the_device_steps_line_is_the_loops_steps(tmp_path: Path, sources: tuple[str, ...]) -> None:
    """XProf's step-time figures count the device Steps line: the trailing `end` step (work after the last
    optimizer step) is left out of it, unless it is the run's only step."""
    path = tmp_path / "steps.tptrace"
    with TraceWriter(path, created_unix_ns=START_UNIX_NS) as writer:
        writer.set_run(rank=0, world_size=1, script="/x/train.py", argv=[], host="box", chips=1, platform="tpu",
                       eager_mode="DEFER_AND_FUSE", start_unix_ns=START_UNIX_NS)
        for step, source in enumerate(sources):
            writer.append("steps", (0, step, step * 10_000_000, (step + 1) * 10_000_000, source))
        writer.update_run(end_ns=len(sources) * 10_000_000, exit_status=0)
    assert main(["export", str(path), "--tensorboard", str(tmp_path / "logdir")]) == 0
    [xplane] = (tmp_path / "logdir" / "plugins" / "profile").glob("*/*.xplane.pb")
    device = _xspace(xplane).planes[0]
    steps_line = next(line for line in device.lines if line.name == "Steps")
    names = [device.event_metadata[event.metadata_id].name for event in steps_line.events]
    assert names == (["0", "1"] if len(sources) > 1 else ["0"])


def test_interleaved_flushes_are_read_sorted(tmp_path: Path) -> None:
    trace_path = _small_trace(tmp_path / "interleaved.tptrace", interleave=True)
    assert main(["export", str(trace_path), "--tensorboard", str(tmp_path / "logdir"), "--perfetto", str(tmp_path / "i.json")]) == 0
    device, events = _device_op_events(tmp_path / "logdir")
    assert len(events) == 6
    modules = next(line for line in device.lines if line.name == "XLA Modules").events
    for module in modules:
        inside = [event for event in events if module.offset_ps <= event.offset_ps < module.offset_ps + module.duration_ps]
        assert len(inside) == 3
    found = check_trace_event_json(tmp_path / "i.json")
    dispatch = [item for (pid, tid), items in found["slices"].items() if found["threads"][(pid, tid)] == "Python dispatch"
                for item in items]
    assert len(dispatch) == 6 and found["flows"] == 2


def test_trace_strings_are_data_in_both_exports(tmp_path: Path) -> None:
    trace_path = _small_trace(tmp_path / "hostile.tptrace", hostile=True)
    logdir = tmp_path / "logdir"
    assert main(["export", str(trace_path), "--tensorboard", str(logdir), "--perfetto", str(tmp_path / "h.json.gz")]) == 0
    [path] = (logdir / "plugins" / "profile").glob("*/*.xplane.pb")
    assert path.parent.parent == logdir / "plugins" / "profile" and ".." not in path.name  # the host name cannot escape
    device, events = _device_op_events(logdir)
    metadata = device.event_metadata[events[0].metadata_id]
    odd = 'aten.evil"</script>%s{}\\n\x01.default'
    assert metadata.name == f"{odd}.0"
    assert _stats(device, metadata.stats)["tf_op"].startswith('M/od:ule"<b>/' + odd)
    found = check_trace_event_json(tmp_path / "h.json.gz")
    names = {name for items in found["slices"].values() for _, _, name, _ in items}
    assert odd in names
    modules = {args.get("module") for items in found["slices"].values() for _, _, _, args in items}
    assert 'M/od:ule"<b>' in modules


# -- contracts --------------------------------------------------------------------------------------


def test_export_imports_neither_torch_nor_jax(sample_trace: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from tputrace.cli.main import main\n"
        f"assert main(['export', {str(sample_trace)!r}, '--tensorboard', {str(tmp_path / 'logdir')!r}, "
        f"'--perfetto', {str(tmp_path / 'out.json.gz')!r}]) == 0\n"
        "loaded = sorted(name for name in sys.modules if name.split('.')[0] in ('torch', 'jax', 'jaxlib'))\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "nothing to export"),
        (["--run", "x", "--perfetto", "{tmp}/x.json"], "--run names a run"),
        (["--perfetto", "{tmp}/missing/x.json"], "does not exist"),
        (["--perfetto", "{tmp}/x.json", "--target", "v9"], "unknown target chip 'v9'"),
    ],
)
def test_export_errors_are_one_line(sample_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    arguments: list[str], message: str) -> None:
    assert main(["export", str(sample_trace), *(argument.format(tmp=tmp_path) for argument in arguments)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("tputrace: error:") and message in error and "\n" not in error


@pytest.mark.parametrize(("option", "output", "message"), [
    ("--tensorboard", "logdir", "cannot write --tensorboard"),
    ("--perfetto", "trace.json.gz", "is a file, not a folder"),
])
def test_unwritable_output_is_a_one_line_error_and_leaves_nothing(sample_trace: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str], option: str,
                                                                  output: str, message: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["export", str(sample_trace), option, str(blocker / output)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("tputrace: error:") and message in error and "\n" not in error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file"]


# -- the device timeline model ----------------------------------------------------------------------


def test_op_cost_from_shapes() -> None:
    matmul = op_cost("aten.addmm.default", "f32[768], f32[1024,256], f32[256,768]", "f32[1024,768]")
    assert matmul.flops == 2 * 1024 * 768 * 256
    assert matmul.read_bytes == 4 * (768 + 1024 * 256 + 256 * 768) and matmul.write_bytes == 4 * 1024 * 768
    assert op_cost("aten.add.Tensor", "bf16[8,128], float", "bf16[8,128]") == OpCost(1024.0, 2048.0, 2048.0, False)
    assert op_cost("aten._foreach_mul_.Scalar", "f32[4,4] x3", "f32[4,4] x3").write_bytes == 3 * 64
    assert framework_op("aten.addmm.default", "GPT.h.0") == "GPT.h.0/aten.addmm.default:addmm"
    assert framework_op("prims.erf.default", None) == "prims.erf.default:erf"


def test_overlapping_executions_run_one_after_another_on_a_chip() -> None:
    rows = [(0, 1, 100, 50, 1, 1), (0, 2, 120, 60, 1, 2), (0, 3, 200, 10, 1, 3), (1, 4, 110, 10, 1, 4)]
    assert list(device_runs._serialized(rows)) == [
        (0, 1, 100, 50, 1, 1, 0), (0, 2, 150, 30, 1, 2, 30), (0, 3, 200, 10, 1, 3, 0), (1, 4, 110, 10, 1, 4, 0),
    ]


def _runs(trace_path: Path) -> Iterator[device_runs.ProgramRun]:
    with tputrace.open(trace_path) as trace:
        yield from device_runs.device_runs(TraceTables(trace), 0, target_chip("v6e"))


def test_device_runs_share_time_by_roofline_and_keep_program_totals(sample_trace: Path) -> None:
    runs = list(_runs(sample_trace))
    assert runs
    for run in runs:
        ops = run.ops
        assert ops[0].start_ns == run.start_ns
        assert ops[-1].start_ns + ops[-1].dur_ns == pytest.approx(run.start_ns + run.dur_ns)
        assert all(op.dur_ns >= 0 for op in ops)
    with tputrace.open(sample_trace) as trace:
        addmm = trace.string_id("aten.addmm.default")
        add = trace.string_id("aten.add.Tensor")
    big = max(runs, key=lambda run: len(run.op_keys))
    durations = {op.key.op_sid: op.dur_ns for op in big.ops}
    assert durations[addmm] > durations[add]  # a matmul costs more than an add of the same tensor on the chip
