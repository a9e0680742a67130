"""Diagnoses checked on small hand-made traces: every finding's numbers are recomputed here by hand.

Traces are written with the real `TraceWriter` through `HandTrace`, which places events at exact
times so that costs, counts and shares can be asserted exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tputrace.analysis import DEFAULT_TARGET, analyze, analyze_path, print_top_findings
from tputrace.analysis.chips import CHIPS, FP32_PASSES, chip
from tputrace.analysis.findings import ranking_cost_ns
from tputrace.analysis.render import render_json, render_text
from tputrace.summary import render_text as render_summary
from tputrace.summary import summarize
from tputrace.analysis.shapes import Matmul, matmuls_of, parse_specs
from tputrace.cli.main import main
from tputrace.store.errors import TputraceError
from tputrace.store.reader import open_trace
from tputrace.store.writer import TraceWriter

MS = 1_000_000
SCRIPT = "/proj/train.py"
MODEL = "/proj/model.py"


class HandTrace:
    """A trace built event by event: steps of fixed length, and rows placed inside them."""

    def __init__(self, path: Path, *, steps: int = 0, step_ns: int = 20 * MS, mode: str = "DEFER_AND_FUSE") -> None:
        self.path = path
        self.writer = TraceWriter(path, created_unix_ns=1_700_000_000_000_000_000)
        self.writer.set_run(world_size=1, script=SCRIPT, argv=[], platform="tpu", eager_mode=mode,
                            start_unix_ns=1_700_000_000_000_000_000)
        self.step_ns = step_ns
        self.steps = steps
        for step in range(steps):
            self.writer.append("steps", (0, step, step * step_ns, (step + 1) * step_ns, "optimizer"))

    def t(self, step: int, offset_ns: int = 0) -> int:
        return step * self.step_ns + offset_ns

    def frame(self, line: int, file: str = SCRIPT, function: str = "train") -> int:
        return self.writer.frame(file, line, function)

    def program(self, name: str, signature: str, *, flops: float = 0.0, bytes_accessed: float = 0.0, n_ops: int = 1,
                kind: str = "fused") -> int:
        program_id = self.writer.next_id("programs")
        w = self.writer
        self.writer.append("programs", (program_id, 0, kind, w.intern(name), w.intern(f"structure-{program_id}"),
                                        w.intern(signature), n_ops, flops, bytes_accessed, None))
        return program_id

    def compile(self, program_id: int, name: str, signature: str, step: int, dur_ns: int, frame: int,
                reason: str = "first", kind: str = "fused") -> None:
        w = self.writer
        w.append("compiles", (w.next_id("compiles"), 0, program_id, kind, w.intern(name), w.intern(signature), 0,
                              self.t(step, 1 * MS), dur_ns, frame, step, reason, None, None))

    def execution(self, program_id: int, step: int, dur_ns: int, offset_ns: int = 2 * MS, flush_id: int | None = None) -> None:
        self.writer.append("executions", (0, program_id, 0, self.t(step, offset_ns), dur_ns, step, flush_id))

    def op(self, op: str, inputs: str, step: int, *, dur_ns: int = 10_000, frame: int | None = None,
           module: str | None = None, program_id: int | None = None, flush_id: int | None = None, seq: int = 0,
           outputs: str = "") -> None:
        w = self.writer
        w.append("ops", (seq, 0, w.intern(op), w.intern(inputs), w.intern(outputs), 0, self.t(step, 100_000), dur_ns,
                         frame, w.intern(module) if module else None, step, program_id, flush_id))

    def flush(self, program_id: int, trigger: str, step: int, *, dur_ns: int, frame: int, n_ops: int = 1,
              cache_hit: int = 1, offset_ns: int = 3 * MS) -> int:
        flush_id = self.writer.next_id("flushes")
        self.writer.append("flushes", (flush_id, 0, program_id, trigger, frame, n_ops, cache_hit, 0,
                                       self.t(step, offset_ns), dur_ns, 0, 0, step))
        return flush_id

    def sync(self, kind: str, step: int, dur_ns: int, frame: int, offset_ns: int = 5 * MS, pending_ops: int = 3) -> None:
        self.writer.append("syncs", (0, kind, frame, 0, self.t(step, offset_ns), dur_ns, pending_ops, step, None))

    def transfer(self, step: int, nbytes: int, dur_ns: int, frame: int, offset_ns: int = 6 * MS, direction: str = "h2d",
                 origin: int | None = None) -> None:
        self.writer.append("transfers", (0, direction, nbytes, -1, 0, self.t(step, offset_ns), dur_ns, frame, step, origin))

    def fallback(self, op: str, inputs: str, step: int, dur_ns: int, frame: int, offset_ns: int = 8 * MS) -> None:
        w = self.writer
        w.append("fallbacks", (0, w.intern(op), w.intern(inputs), 0, self.t(step, offset_ns), dur_ns, frame, step))

    def memory(self, t_ns: int, live: int, peak: int, chip_index: int = 0) -> None:
        self.writer.append("memory", (0, chip_index, t_ns, live, peak))

    def close(self) -> Path:
        self.writer.update_run(end_ns=self.steps * self.step_ns + MS, exit_status=0)
        self.writer.close()
        return self.path


def findings_of(report, analyzer: str):
    return [finding for finding in report.findings if finding.analyzer == analyzer]


# -- the target chips --------------------------------------------------------------------------------------


def test_every_chip_figure_has_a_source() -> None:
    for name in ("v5e", "v5p", "v6e", "v7"):
        target = CHIPS[name]
        for figure in ("peak_bf16_flops", "hbm_bytes", "hbm_bandwidth", "ici_bandwidth", "mxu", "tensorcores"):
            assert target.sources.get(figure), f"{name}.{figure} has no source"
        assert "peak_fp32_flops" in target.estimated
        assert target.peak_fp32_flops == pytest.approx(target.peak_bf16_flops / FP32_PASSES)
        assert target.tile("f32") == (8, 128) and target.tile("bf16") == (16, 128) and target.tile("i8") == (32, 128)
    assert CHIPS["v6e"].mxu == 256 and CHIPS["v5e"].mxu == 128
    assert CHIPS["v6e"].peak_bf16_flops == 918e12 and CHIPS["v7"].hbm_bandwidth == 7380e9


def test_one_byte_arrays_are_padded_to_their_own_tile() -> None:
    """A memory fit lays int8, uint8 and bool buffers out in (32, 128) tiles, as the chip's layout does; 4 rows of
    128 one-byte elements take one 32-row tile."""
    from tputrace.analysis.memory_fit import padded_bytes

    target = CHIPS["v6e"]
    for dtype in ("int8", "uint8", "bool"):
        assert padded_bytes((4, 128), dtype, target) == 32 * 128
    assert padded_bytes((4, 128), "bfloat16", target) == 16 * 128 * 2
    assert padded_bytes((4, 128), "float32", target) == 8 * 128 * 4


def test_chip_names() -> None:
    assert chip(None).name == DEFAULT_TARGET
    assert chip("TPU7x").name == "v7" and chip("V5E").name == "v5e" and chip("trillium").name == "v6e"
    with pytest.raises(TputraceError, match="unknown target chip 'v9'"):
        chip("v9")


# -- shapes -----------------------------------------------------------------------------------------------


def test_shapes_and_matmuls() -> None:
    specs = parse_specs("f32[64,128], int, bf16[], i64[3]")
    assert [str(spec) if spec else None for spec in specs] == ["f32[64,128]", None, "bf16[]", "i64[3]"]
    assert matmuls_of("aten.addmm.default", "f32[10], f32[32,128], f32[128,10]") == [Matmul(1, 32, 128, 10, "f32")]
    assert matmuls_of("aten.bmm.default", "bf16[4,8,16], bf16[4,16,32]") == [Matmul(4, 8, 16, 32, "bf16")]
    assert matmuls_of("aten.linear.default", "f32[2,5,64], f32[256,64]") == [Matmul(1, 10, 64, 256, "f32")]
    assert matmuls_of("aten.convolution.default", "f32[8,3,32,32], f32[16,3,3,3], f32[16]") == [
        Matmul(9, 8 * 32 * 32, 3, 16, "f32")  # one product per window position, input features contracted
    ]
    assert matmuls_of("aten._scaled_dot_product_flash_attention.default", "f32[2,4,64,32], f32[2,4,64,32], f32[2,4,64,32]") == [
        Matmul(8, 64, 32, 64, "f32"), Matmul(8, 64, 64, 32, "f32"),
    ]
    assert matmuls_of("aten.add.Tensor", "f32[4,4], f32[4,4]") == []
    assert Matmul(2, 3, 4, 5, "bf16").flops == 2 * 2 * 3 * 4 * 5


# -- recompilation storm ----------------------------------------------------------------------------------

SEQ_LENS = [37, 45, 64, 70, 100, 128]


def _storm_trace(path: Path) -> Path:
    """One compile per step at train.py:41, the sequence length changing each time; 100 ms each."""
    trace = HandTrace(path, steps=len(SEQ_LENS))
    line = trace.frame(41)
    for step, seq in enumerate(SEQ_LENS):
        signature = f"i64[8,{seq}], f32[8,{seq},64], f32[64,64], int"
        program_id = trace.program("fused_12_ops", signature, flops=1000.0 * seq)
        trace.compile(program_id, "fused_12_ops", signature, step, 100 * MS, line,
                      reason="first" if step == 0 else "recompile")
        trace.execution(program_id, step, 5 * MS)
        trace.execution(program_id, step, 5 * MS, offset_ns=12 * MS)
    return trace.close()


def test_a_recompile_cost_is_measured_on_this_host_for_every_target(tmp_path: Path) -> None:
    """XLA:CPU's compile time is what the trace holds: the same whatever the target, and said to be measured."""
    path = _storm_trace(tmp_path / "storm.tptrace")
    with open_trace(path) as trace:
        storms = [findings_of(analyze(trace, target), "recompiles")[0] for target in ("v5e", "v6e")]
    assert storms[0].cost_total_ns == storms[1].cost_total_ns
    assert storms[0].cost_basis == "measured on this host"
    assert "(measured on this host)" in render_text(analyze_path(path))


def test_recompile_storm(tmp_path: Path) -> None:
    with open_trace(_storm_trace(tmp_path / "storm.tptrace")) as trace:
        report = analyze(trace)
    (storm,) = findings_of(report, "recompiles")
    assert storm.cost_total_ns == 5 * 100 * MS  # every compile but the first
    assert storm.cost_per_step_ns == pytest.approx(5 * 100 * MS / 6)
    assert storm.file == SCRIPT and storm.line == 41
    assert storm.severity == "critical"  # 500 ms of a 121 ms run... recompiles dominate
    data = report.results["recompiles"].data.storms[0]
    assert data.compiles == 6
    dims = data.varying_dims
    assert list(dims[0].values) == SEQ_LENS
    assert sorted(dims[0].positions) == [(0, 1), (1, 1)]  # one logical dim in two inputs
    options = {option.rule: option for option in data.bucket_options}
    by_64 = options["multiple of 64"]
    assert by_64.buckets == (64, 128) and by_64.compiles == 2 and by_64.compiles_saved == 4
    # Padding FLOPs, linear in the dim: each shape ran twice with 1000 * seq FLOPs per run.
    weights = {seq: 2 * 1000.0 * seq for seq in SEQ_LENS}
    added = sum(weight * ((64 if seq <= 64 else 128) / seq - 1) for seq, weight in weights.items())
    assert by_64.padding_flops_estimate == pytest.approx(added)
    assert by_64.padding_share_estimate == pytest.approx(added / sum(weights.values()))
    # Estimated cost of a bucketing: compiles at the mean compile time plus that share of the site's 60 ms of execution.
    assert by_64.estimated_cost_ns == pytest.approx(2 * 100 * MS + added / sum(weights.values()) * 60 * MS)
    # The proposal: the cheapest bucketing (estimated) among those adding at most 25% FLOPs.
    moderate = [option for option in data.bucket_options if option.padding_share_estimate <= 0.25]
    proposed = data.proposed
    assert proposed == min(moderate, key=lambda option: option.estimated_cost_ns)
    assert proposed is not None and proposed.compiles < len(SEQ_LENS)
    assert "instead of 6" in storm.suggestion
    # The JSON form (`tputrace report --json`) has the same figures under the same names.
    (json_storm,) = json.loads(render_json(report))["results"]["recompiles"]["storms"]
    assert json_storm["varying_dims"][0] == {"label": dims[0].label, "positions": [[0, 1], [1, 1]], "values": SEQ_LENS}
    assert json_storm["proposed"] == {
        "rule": proposed.rule, "buckets": list(proposed.buckets), "compiles": proposed.compiles,
        "compiles_saved": proposed.compiles_saved, "padding_flops_estimate": proposed.padding_flops_estimate,
        "padding_share_estimate": proposed.padding_share_estimate, "estimated_cost_ns": proposed.estimated_cost_ns,
    }
    assert json_storm["copied_at"] is None and json_storm["size_from"] is None


def test_storms_of_one_host_batch_are_one_finding_at_its_copy(tmp_path: Path) -> None:
    """Two programs take the batch copied at train.py:30 (the model's, and a mask's made from it on the chip):
    one finding at the copying line covers both, with one bucketing for both."""
    trace = HandTrace(tmp_path / "batch.tptrace", steps=len(SEQ_LENS))
    copy_line, model_line, mask_line = trace.frame(30), trace.frame(41), trace.frame(44)
    for step, seq in enumerate(SEQ_LENS):
        trace.transfer(step, 4 * seq * 8, MS, copy_line, offset_ns=0)  # the i64[4,seq] batch
        trace.transfer(step, 4 * 8, MS, copy_line, offset_ns=0)  # labels: the same size every step
        reason = "first" if step == 0 else "recompile"
        model_signature = f"i64[4,{seq}], f32[64,64]"
        model = trace.program("fused_40_ops", model_signature, flops=1000.0 * seq)
        trace.compile(model, "fused_40_ops", model_signature, step, 100 * MS, model_line, reason=reason)
        mask_signature = f"bool[4,{seq}]"
        mask = trace.program("fused_2_ops", mask_signature)
        trace.compile(mask, "fused_2_ops", mask_signature, step, 10 * MS, mask_line, reason=reason)
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    (storm,) = findings_of(report, "recompiles")
    assert (storm.file, storm.line) == (SCRIPT, 30)
    assert storm.title.startswith("Recompilation storm: 2 programs compiled 12 times as the batches copied to the chip at train.py:30")
    assert storm.cost_total_ns == 5 * 110 * MS
    (data,) = report.results["recompiles"].data.host_input_storms
    assert data.programs == ("fused_40_ops", "fused_2_ops") and list(data.sizes) == SEQ_LENS
    assert "Pad the batches copied at train.py:30" in storm.suggestion and "pad_to_multiple_of" in storm.suggestion
    # Each program's storm carries the batch's bucketing, and the HTML report's table says whose it is.
    for site in report.results["recompiles"].data.storms:
        assert site.copied_at == "train.py:30" and site.proposed == data.proposed
    page = tmp_path / "batch.html"
    assert main(["plot", str(trace.path), "-o", str(page), "--plotlyjs", "cdn"]) == 0
    assert page.read_text().count("for the batches copied at train.py:30") == 2


def test_compiles_in_warmup_only_are_not_a_storm(tmp_path: Path) -> None:
    trace = HandTrace(tmp_path / "warmup.tptrace", steps=6)
    line = trace.frame(41)
    for index, seq in enumerate((16, 32, 48)):
        signature = f"f32[{seq},64]"
        trace.compile(trace.program("fused_1_ops", signature), "fused_1_ops", signature, 0, 50 * MS, line)
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    assert findings_of(report, "recompiles") == []
    assert report.results["recompiles"].data.compiles == 3


# -- host syncs ---------------------------------------------------------------------------------------------


def test_host_syncs(tmp_path: Path) -> None:
    trace = HandTrace(tmp_path / "syncs.tptrace", steps=5)
    item_line, fallback_line, after_loop = trace.frame(40), trace.frame(27), trace.frame(50)
    for step in range(5):
        # The warm-up step's stall includes compiling the step: the cost is the steady steps' mean per step.
        trace.sync("item", step, 4 * MS if step else 15 * MS, item_line)
        trace.sync("fallback", step, 1 * MS, fallback_line, offset_ns=9 * MS)  # counted by the fallbacks analyzer
        trace.fallback("aten.nonzero.default", "b8[8]", step, 2 * MS, fallback_line, offset_ns=12 * MS)
        trace.sync("data_dependent", step, 1 * MS, fallback_line, offset_ns=12 * MS + 100_000)  # inside the fallback
    trace.sync("item", 5, 3 * MS, after_loop)  # after the loop: step 5 has no step record
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    (finding,) = findings_of(report, "syncs")
    assert finding.line == 40 and finding.cost_total_ns == 5 * 4 * MS
    assert finding.cost_per_step_ns == pytest.approx(4 * MS)
    assert finding.severity == "warning"  # 4 ms of each 20 ms step
    assert "every step" in finding.title and "item" in finding.title
    (line,) = report.results["syncs"].data.lines
    assert line.count_per_step == 1.0 and line.stall_per_step_ns == 4 * MS


def test_a_sync_inside_a_module_names_the_module(tmp_path: Path) -> None:
    """`loss = model(batch)` at train.py:40 reads a mask's value inside the model (a library's `if mask.all():`):
    the finding names the module whose op ran just before the read, and says the `if` may be in its code.
    The `.item()` at train.py:44 reads outside any module."""
    trace = HandTrace(tmp_path / "module_sync.tptrace", steps=4)
    call_line, item_line = trace.frame(40), trace.frame(44)
    for step in range(4):
        seq = 3 * step
        trace.op("aten.embedding.default", "f32[64,8], i64[4,9]", step, frame=call_line, module="Model.embed", seq=seq)
        trace.op("aten.sum.default", "bool[4,9]", step, frame=call_line, module="Model.encoder", seq=seq + 1)
        trace.sync("bool", step, 4 * MS, call_line)
        trace.op("aten._local_scalar_dense.default", "f32[]", step, frame=item_line, seq=seq + 2)
        trace.sync("item", step, 3 * MS, item_line, offset_ns=6 * MS)
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    by_line = {finding.line: finding for finding in findings_of(report, "syncs")}
    inside = by_line[40]
    assert inside.module == "Model.encoder"
    assert "inside Model.encoder" in inside.explanation
    assert inside.suggestion.startswith("If train.py:40 only calls Model.encoder, the read is in that module's own code")
    assert by_line[44].module is None and by_line[44].suggestion.startswith("Keep the value on the chip")


def test_a_sync_stall_leaves_out_the_compile_that_ran_inside_it(tmp_path: Path) -> None:
    """An eval read once in the run whose flush compiled a new program: the 10 ms compile belongs to
    the compiles analyzer, so the sync costs its remaining 2 ms."""
    trace = HandTrace(tmp_path / "compile_in_sync.tptrace", steps=6)
    eval_line, other_line = trace.frame(21), trace.frame(30)
    program = trace.program("fused_40_ops", "f32[8,16]")
    trace.compile(program, "fused_40_ops", "f32[8,16]", 3, 10 * MS, eval_line)  # 1-11 ms into step 3
    trace.sync("item", 3, 12 * MS, eval_line, offset_ns=MS // 2)
    trace.compile(program, "fused_40_ops", "f32[8,32]", 4, 5 * MS, other_line, reason="recompile")
    trace.sync("item", 4, 3 * MS, other_line, offset_ns=7 * MS)  # after that compile ended: all of it counts
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
        summary = summarize(opened)
    lines = {line.where: line.stall_ns for line in report.results["syncs"].data.lines}
    assert lines == {"train.py:21": 2 * MS, "train.py:30": 3 * MS}
    # The summary's table keeps the raw stall and says how much of it was compiling.
    compiling = {stat.source.line: (stat.total_ns, stat.compile_ns) for stat in summary.top_syncs}
    assert compiling == {21: (12 * MS, 10 * MS), 30: (3 * MS, 0)}
    text = render_summary(summary)
    assert "of it compiling" in text and "10.0 ms" in text


def test_empty_host_copies_say_so(tmp_path: Path) -> None:
    """A library that makes `torch.tensor([], device=...)` on every call copies nothing, four times a step."""
    trace = HandTrace(tmp_path / "empty_copies.tptrace", steps=4)
    call_line = trace.frame(40)
    for step in range(4):
        for index in range(4):
            trace.transfer(step, 0, 2 * MS, call_line, offset_ns=(6 + 2 * index) * MS)
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    (finding,) = findings_of(report, "transfers")
    assert "every copy empty" in finding.explanation and "constant built on the host" not in finding.explanation
    assert finding.suggestion.startswith("Make the empty tensors at train.py:40 on the chip")
    assert "use_cache=False" in finding.suggestion


def test_the_summary_counts_the_loops_steps_without_the_end_step(tmp_path: Path) -> None:
    """Three optimizer steps, then an evaluation recorded as the trailing `end` step: the summary says 3 steps,
    as the script ran and as the report counts them, and the evaluation's time stays out of the median."""
    trace = HandTrace(tmp_path / "end_step.tptrace", steps=3)
    trace.writer.append("steps", (0, 3, trace.t(3), trace.t(3) + 500 * MS, "end"))
    with open_trace(trace.close()) as opened:
        summary = summarize(opened)
        report = analyze(opened)
    assert summary.step_count == 3 == report.step_count
    assert summary.median_step_ns == 20 * MS
    assert "3 steps (first 20.0 ms, then median 20.0 ms)" in render_summary(summary)


# -- CPU fallbacks --------------------------------------------------------------------------------------------


def test_cpu_fallbacks_per_op_and_line(tmp_path: Path) -> None:
    trace = HandTrace(tmp_path / "fallbacks.tptrace", steps=4)
    nonzero_line, unique_line = trace.frame(30), trace.frame(31)
    for step in range(4):
        trace.fallback("aten.nonzero.default", "b8[8,128]", step, 3 * MS, nonzero_line)
        trace.fallback("aten.nonzero.default", "b8[8,128]", step, 1 * MS, unique_line, offset_ns=12 * MS)
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    first, second = findings_of(report, "fallbacks")
    assert (first.line, first.cost_total_ns) == (30, 12 * MS)
    assert (second.line, second.cost_total_ns) == (31, 4 * MS)
    assert first.severity == "warning"  # 3 ms of a 20 ms step = 15%
    assert "torch.where" in first.suggestion
    assert report.results["fallbacks"].data.total_ns == 16 * MS


# -- fragmented fusion ----------------------------------------------------------------------------------------


def test_fragmented_fusion(tmp_path: Path) -> None:
    trace = HandTrace(tmp_path / "fusion.tptrace", steps=5)
    check_line, step_line = trace.frame(22, MODEL, "forward"), trace.frame(45)
    program = trace.program("fused_3_ops", "f32[8,64]", n_ops=3)
    for step in range(5):
        for block in range(4):  # four `if x.isnan().any():` cuts per step
            trace.flush(program, "bool", step, dur_ns=200_000, frame=check_line, n_ops=3,
                        cache_hit=0 if step == 0 else 1, offset_ns=(2 + block) * MS)
            trace.sync("bool", step, 500_000, check_line, offset_ns=(2 + block) * MS + 300_000)
        trace.flush(program, "step", step, dur_ns=300_000, frame=step_line, n_ops=20, offset_ns=15 * MS)
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    (finding,) = findings_of(report, "fusion")
    assert finding.file == MODEL and finding.line == 22
    # Cost per steady step: 4 cache-hit flushes of 0.2 ms and 4 stalls of 0.5 ms; times the 5 steps of the loop.
    assert finding.cost_per_step_ns == pytest.approx(4 * 200_000 + 4 * 500_000)
    assert finding.cost_total_ns == pytest.approx(5 * (4 * 200_000 + 4 * 500_000))
    data = report.results["fusion"].data
    assert data.cuts_per_step == 4 and data.programs_per_step == 5
    assert "5 programs" in finding.title
    # The same stalls are a sync finding too, ranked below the fusion finding that explains them.
    (sync,) = findings_of(report, "syncs")
    assert report.findings.index(finding) < report.findings.index(sync)


def test_fragmented_fusion_leaves_out_compiles_inside_its_stalls(tmp_path: Path) -> None:
    """A cut whose flush compiles a new program (a new data-dependent length) waits for the compile: that
    time is the recompiles analyzer's, so the fusion finding counts only the rest of the stall."""
    trace = HandTrace(tmp_path / "fusion_compiling.tptrace", steps=5)
    mask_line, step_line = trace.frame(10), trace.frame(13)
    program = trace.program("fused_3_ops", "f32[8,64]", n_ops=3)
    for step in range(5):
        for block in range(4):
            trace.flush(program, "data_dependent", step, dur_ns=200_000, frame=mask_line, n_ops=3,
                        offset_ns=(2 + block) * MS)
            trace.sync("data_dependent", step, 500_000, mask_line, offset_ns=(2 + block) * MS + 300_000)
        trace.flush(program, "step", step, dur_ns=300_000, frame=step_line, n_ops=20, offset_ns=15 * MS)
    # In step 3 a 3 ms compile (1-4 ms into the step) covers the first two syncs (2.3-2.8 and 3.3-3.8 ms).
    trace.compile(program, "fused_3_ops", "f32[8,64]", 3, 3 * MS, mask_line, reason="recompile")
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    (finding,) = findings_of(report, "fusion")
    # Steady steps 1-4: 16 flushes of 0.2 ms and 16 stalls of 0.5 ms, less the 1 ms of compiling inside two.
    assert finding.cost_per_step_ns == pytest.approx((16 * 200_000 + 16 * 500_000 - MS) / 4)


def test_a_run_without_steps_is_not_called_one_step(tmp_path: Path) -> None:
    """An inference loop that reads each batch's result (one program and one sync per iteration) and
    marks no step: its one `end` record is the run, not a step cut into pieces."""
    trace = HandTrace(tmp_path / "inference.tptrace")
    read_line = trace.frame(8)
    program = trace.program("fused_8_ops", "f32[32,64]", n_ops=8)
    for iteration in range(5):
        trace.flush(program, "tolist", 0, dur_ns=300_000, frame=read_line, n_ops=8, cache_hit=int(iteration > 0),
                    offset_ns=(2 + 3 * iteration) * MS)
        trace.sync("tolist", 0, 2 * MS, read_line, offset_ns=(3 + 3 * iteration) * MS)
        trace.transfer(0, 8192, 100_000, trace.frame(7), offset_ns=(1 + 3 * iteration) * MS)
    trace.writer.append("steps", (0, 0, 0, 16 * MS, "end"))
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    assert findings_of(report, "fusion") == [] and findings_of(report, "transfers") == []
    (sync,) = findings_of(report, "syncs")
    assert sync.title == "Host sync 5 times at train.py:8 (tolist): 10.0 ms stalled"
    assert "step" not in sync.explanation and sync.cost_per_step_ns is None


# -- tile padding and float32 matmuls ------------------------------------------------------------------------


def _matmul_trace(path: Path, inputs: str, flops: float, *, steps: int = 4, exec_ns: int = 10 * MS) -> Path:
    """One matmul per step in module MLP.fc1 at model.py:20, the only work of a program that runs exec_ns."""
    trace = HandTrace(path, steps=steps)
    line = trace.frame(20, MODEL, "forward")
    program = trace.program("fused_1_ops", inputs, flops=flops)
    for step in range(steps):
        trace.op("aten.addmm.default", inputs, step, frame=line, module="MLP.fc1", program_id=program)
        trace.execution(program, step, exec_ns)
    return trace.close()


def test_tile_padding(tmp_path: Path) -> None:
    # bf16 [4096,1000] @ [1000,1000] on v5e (MXU 128): compute-bound, so the lost time is the padded FLOPs.
    flops = 2.0 * 4096 * 1000 * 1000
    path = _matmul_trace(tmp_path / "padding.tptrace", "bf16[1000], bf16[4096,1000], bf16[1000,1000]", flops)
    with open_trace(path) as opened:
        report = analyze(opened, "v5e")
    (finding,) = findings_of(report, "padding")
    waste = 1 - (1000 / 1024) ** 2
    assert finding.cost_total_ns == pytest.approx(4 * 10 * MS * waste)
    assert finding.cost_per_step_ns == pytest.approx(10 * MS * waste)
    assert finding.module == "MLP.fc1" and finding.line == 20
    assert "dim 1000" in finding.title and f"{waste:.1%}" in finding.title
    assert "Use 1024 (or 896)" in finding.suggestion
    assert finding.severity == "warning"  # 463 µs of a 20 ms step: 2.3%, above the 2% padding threshold
    # On v6e (MXU 256) the same product is memory-bound: padding costs only its extra bytes.
    with open_trace(path) as opened:
        v6e = analyze(opened, "v6e")
    (on_v6e,) = findings_of(v6e, "padding")
    assert 0 < on_v6e.cost_total_ns < finding.cost_total_ns


def test_aligned_dims_have_no_padding_finding(tmp_path: Path) -> None:
    path = _matmul_trace(tmp_path / "aligned.tptrace", "bf16[1024], bf16[4096,1024], bf16[1024,1024]", 2.0 * 4096 * 1024**2)
    with open_trace(path) as opened:
        report = analyze(opened, "v5e")
    assert findings_of(report, "padding") == []


def test_float32_matmul(tmp_path: Path) -> None:
    n = 2048
    flops = 2.0 * n**3
    path = _matmul_trace(tmp_path / "fp32.tptrace", f"f32[{n}], f32[{n},{n}], f32[{n},{n}]", flops)
    with open_trace(path) as opened:
        report = analyze(opened)
    (finding,) = findings_of(report, "precision")
    v6e = CHIPS["v6e"]
    memory_s = 4.0 * 3 * n * n / v6e.hbm_bandwidth
    saving = 1 - max(flops / v6e.peak_bf16_flops, memory_s) / max(flops / (v6e.peak_bf16_flops / 6), memory_s)
    assert finding.cost_total_ns == pytest.approx(4 * 10 * MS * saving)
    assert finding.module == "MLP.fc1" and finding.line == 20
    assert "autocast" in finding.suggestion
    # The same product in bfloat16 is not a finding; nor is a small (memory-bound) float32 product.
    for name, inputs, small_flops in (("bf16", f"bf16[{n}], bf16[{n},{n}], bf16[{n},{n}]", flops),
                                      ("small", "f32[128], f32[32,64], f32[64,128]", 2.0 * 32 * 64 * 128)):
        with open_trace(_matmul_trace(tmp_path / f"{name}.tptrace", inputs, small_flops)) as opened:
            assert findings_of(analyze(opened), "precision") == []


# -- host-bound steps -----------------------------------------------------------------------------------------


def test_host_bound_steps(tmp_path: Path) -> None:
    trace = HandTrace(tmp_path / "host.tptrace", steps=5, step_ns=12 * MS)
    line = trace.frame(30)
    program = trace.program("fused_100_ops", "f32[8,8]", flops=1e6, bytes_accessed=1e6)
    for step in range(5):
        for index in range(100):
            trace.op("aten.add.Tensor", "f32[8,8], f32[8,8]", step, dur_ns=100_000, frame=line, program_id=program)
        trace.execution(program, step, 2 * MS)
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    (finding,) = findings_of(report, "host_bound")
    assert finding.cost_per_step_ns == 8 * MS  # 10 ms dispatch - 2 ms execution
    assert finding.cost_total_ns == 5 * 8 * MS
    assert finding.severity == "warning"
    data = report.results["host_bound"].data
    assert data.median_dispatch_ns == 10 * MS and data.median_chip_ns == 2 * MS
    assert data.median_roofline_estimate_ns == pytest.approx(1e6 / CHIPS["v6e"].hbm_bandwidth * 1e9)

    assert "On TPU v6e" in finding.explanation and "roofline estimate" in finding.evidence[1].text


def test_host_bound_without_xla_costs_projects_nothing(tmp_path: Path) -> None:
    """Programs without XLA's FLOPs and bytes (an import of a GPU's kernels): no '0 ns on the target' projection."""
    trace = HandTrace(tmp_path / "gpu.tptrace", steps=5, step_ns=12 * MS)
    line = trace.frame(30)
    program = trace.program("ampere_sgemm", "f32[8,8]", flops=0, bytes_accessed=0)
    for step in range(5):
        for index in range(100):
            trace.op("aten.add.Tensor", "f32[8,8], f32[8,8]", step, dur_ns=100_000, frame=line, program_id=program)
        trace.execution(program, step, 2 * MS)
    with open_trace(trace.close()) as opened:
        (finding,) = findings_of(analyze(opened), "host_bound")
    assert "roofline" not in finding.explanation and "0 ns" not in finding.explanation, finding.explanation
    assert [evidence.text for evidence in finding.evidence] == ["median step 12.0 ms: dispatch 10.0 ms, chip 2.00 ms"]

def test_host_bound_leaves_out_steps_launched_while_the_chip_was_behind(tmp_path: Path) -> None:
    """Steps 1-3 launch their programs while step 0's still runs, and all end together when the watcher gets the
    interpreter lock: their busy time reads tiny, but the host was ahead of the chip, so they are no evidence. The
    one step measured apart ran the chip longer than its dispatch: no finding."""
    trace = HandTrace(tmp_path / "behind.tptrace", steps=5, step_ns=12 * MS)
    line = trace.frame(30)
    program = trace.program("fused_100_ops", "f32[8,8]", flops=1e6, bytes_accessed=1e6)
    durations = {0: 40 * MS, 1: 30 * MS + 50_000, 2: 18 * MS + 100_000, 3: 6 * MS + 150_000, 4: 11 * MS}
    for step in range(5):
        for index in range(100):
            trace.op("aten.add.Tensor", "f32[8,8], f32[8,8]", step, dur_ns=100_000, frame=line, program_id=program)
        trace.execution(program, step, durations[step])
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    assert findings_of(report, "host_bound") == []
    data = report.results["host_bound"].data
    assert data.behind_steps == 3
    assert [step.step for step in data.steps if step.chip_behind] == [1, 2, 3]
    assert data.median_chip_ns == 11 * MS


# -- transfers in the loop ------------------------------------------------------------------------------------


def test_transfers_in_the_loop(tmp_path: Path) -> None:
    trace = HandTrace(tmp_path / "transfers.tptrace", steps=5)
    setup, mask_line, fallback_line = trace.frame(12), trace.frame(33), trace.frame(27)
    trace.transfer(0, 64 << 20, 30 * MS, setup, offset_ns=0)  # weights, before the loop's steady steps
    for step in range(5):
        trace.transfer(step, 4 << 20, 2 * MS, mask_line)
        trace.fallback("aten.nonzero.default", "b8[8]", step, 1 * MS, fallback_line, offset_ns=8 * MS)
        trace.transfer(step, 64, 10_000, fallback_line, offset_ns=8 * MS + 500_000)  # inside the fallback
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    (finding,) = findings_of(report, "transfers")
    assert finding.line == 33 and finding.cost_total_ns == 5 * 2 * MS
    assert "4.00 MiB per step" in finding.title
    assert "before the loop" in finding.suggestion  # the same size every step: a constant
    (line,) = report.results["transfers"].data.lines
    assert line.bytes_per_step == 4 << 20 and line.same_size_every_time


def test_a_slow_warm_up_copy_is_told_apart_from_the_steady_steps_share(tmp_path: Path) -> None:
    """The warm-up step's copy took 16 ms, the steady ones 100 µs each: the explanation's total is the loop's, and the
    share next to it says it is the steady steps' time, with their own figure."""
    trace = HandTrace(tmp_path / "slow_first_copy.tptrace", steps=5)
    line = trace.frame(16)
    for step in range(5):
        trace.transfer(step, 128, 16 * MS if step == 0 else 100_000, line)
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    (finding,) = findings_of(report, "transfers")
    assert "taking 16.4 ms (400 µs of it in the steady steps, 0% of the steady steps' time)" in finding.explanation, (
        finding.explanation)


# -- memory ------------------------------------------------------------------------------------------------------


def test_index_errors_outside_the_users_code_point_at_the_sync(tmp_path: Path) -> None:
    """An index op that autograd's backward ran has no user line: the finding points at the syncing line,
    once per message and line, counting the steps it was raised in; the run went on."""
    trace = HandTrace(tmp_path / "index.tptrace", steps=4)
    sync_line = trace.frame(41)
    message = ("index out of range in aten.index_add_ at a line outside the user's code (autograd's backward?) "
               "(an index >= 5 or < 0); XLA would have clamped it")
    for step in (2, 3):
        trace.writer.append("annotations", (0, trace.writer.intern(message), "index_check", trace.t(step, MS), 0, sync_line, step))
    trace.writer.append("annotations", (0, trace.writer.intern("forward"), "annotate", trace.t(1), MS, sync_line, 1))
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    (finding,) = findings_of(report, "index_errors")
    assert finding.title == "Index out of range in aten.index_add_ raised at train.py:41 by the sync"
    assert (finding.file, finding.line, finding.severity) == (SCRIPT, 41, "critical")
    assert finding.cost_total_ns == report.wall_ns and report.findings[0] is finding
    assert "The script went on after the error (2 times, first in step 2)" in finding.explanation
    assert report.results["index_errors"].data.errors[0].stopped_the_run is False


def test_memory_against_hbm(tmp_path: Path) -> None:
    trace = HandTrace(tmp_path / "memory.tptrace", steps=3)
    gib = 1 << 30
    trace.memory(10 * MS, 20 * gib, 28 * gib)
    trace.memory(20 * MS, 20 * gib, 30 * gib)
    trace.op("aten.mm.default", "f32[4096,4096], f32[4096,4096]", 1, module="Net.fc", outputs="f32[4096,4096]")
    path = trace.close()
    with open_trace(path) as opened:
        on_v6e = analyze(opened, "v6e")
        on_v5e = analyze(opened, "v5e")
        on_v7 = analyze(opened, "v7")
    (near,) = findings_of(on_v6e, "memory")
    assert near.severity == "warning" and "94%" in near.title and near.cost_total_ns == 0
    (over,) = findings_of(on_v5e, "memory")
    assert over.severity == "critical" and "would not fit" in over.title
    assert over.cost_total_ns == on_v5e.wall_ns  # the run cannot happen
    assert findings_of(on_v7, "memory") == []
    (largest,) = on_v7.results["memory"].data.largest_tensors_by_module
    assert (largest.module, largest.bytes, largest.tensor) == ("Net.fc", 4096 * 4096 * 4, "f32[4096,4096]")


# -- collectives, on the two-rank sample trace ---------------------------------------------------------------


def test_collectives_on_the_sample_trace(sample_trace_path: Path) -> None:
    with open_trace(sample_trace_path) as opened:
        report = analyze(opened)
        (rank1_wait,) = opened.sql("SELECT SUM(wait_ns) FROM collectives WHERE rank = 1")[0]
    data = report.results["collectives"].data
    assert {row.kind for row in data.kinds} == {"all_reduce"}  # the broadcast is in the setup step
    (straggler,) = [finding for finding in findings_of(report, "collectives") if "Straggler" in finding.title]
    assert "rank 0 arrives last" in straggler.title
    assert straggler.cost_total_ns == rank1_wait


def test_no_collectives_no_findings(tmp_path: Path) -> None:
    with open_trace(_storm_trace(tmp_path / "storm.tptrace")) as opened:
        report = analyze(opened)
    data = report.results["collectives"].data
    assert data.count == 0 and not data.kinds and not data.wait_by_rank


# -- the report ---------------------------------------------------------------------------------------------


def test_report_ranks_and_renders(sample_trace_path: Path) -> None:
    report = analyze_path(sample_trace_path)
    costs = [ranking_cost_ns(finding) for finding in report.findings]
    assert costs == sorted(costs, reverse=True)
    once = [finding for finding in report.findings if finding.title.startswith("Host sync in one step at")]
    assert once and all(finding.cost_per_step_ns is None for finding in once)  # a print in one step is no per-step cost
    text = render_text(report)
    assert f"target: {CHIPS[DEFAULT_TARGET].label} (the default" in text
    assert "estimate" in text
    data = json.loads(render_json(report))
    assert data["target"]["name"] == DEFAULT_TARGET and data["target"]["is_default"] is True
    assert len(data["findings"]) == len(report.findings)
    assert set(data["results"]) == {"no_device_ops", "index_errors", "recompiles", "guard_recompiles", "recompile_limit", "program_cache", "set_up_work", "step_tail", "remade_optimizers", "compile_cache", "graph_breaks", "syncs", "fallbacks",
                                    "fusion", "padding", "frozen_backward", "precision", "host_bound", "input_wait", "transfers", "data_movement", "memory", "collectives", "sharding"}


def test_report_command(sample_trace_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(sample_trace_path), "--json", "--target", "v5e"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["target"]["name"] == "v5e" and data["target"]["is_default"] is False
    assert main(["report", str(sample_trace_path), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "\n1. [" in out and "\n2. [" in out and "\n3. [" not in out
    assert main(["report", str(sample_trace_path), "--target", "v9"]) == 2
    assert "unknown target chip 'v9'" in capsys.readouterr().err
    assert main(["report", str(sample_trace_path), "--rank", "7"]) == 2


def test_top_findings_hook(sample_trace_path: Path, tmp_path: Path) -> None:
    import io

    stream = io.StringIO()
    print_top_findings(sample_trace_path, file=stream)
    out = stream.getvalue()
    assert "top findings (3 of" in out and "\n3. [" in out and "\n4. [" not in out
    stream = io.StringIO()
    print_top_findings(tmp_path / "missing.tptrace", file=stream)
    assert stream.getvalue().startswith("tputrace: could not analyse the trace")


def test_analysis_never_imports_torch_or_jax(sample_trace_path: Path) -> None:
    code = (
        "import sys\n"
        "from tputrace.analysis import analyze_path\n"
        "from tputrace.analysis.render import render_text, render_json\n"
        f"report = analyze_path({str(sample_trace_path)!r})\n"
        "render_text(report); render_json(report)\n"
        "assert report.findings\n"
        "print(','.join(name for name in ('torch', 'jax', 'jaxlib', 'numpy') if name in sys.modules))\n"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert output.stdout.strip() == ""


def test_chip_busy_time_counts_queued_executions_once(tmp_path: Path) -> None:
    """Launch-to-ready intervals overlap when programs queue; busy time is the length of their union."""
    from tputrace.analysis.chips import chip as target_chip
    from tputrace.analysis.context import AnalysisContext

    trace = HandTrace(tmp_path / "busy.tptrace", steps=2)
    program = trace.program("fused_1_ops", "f32[8]")
    trace.execution(program, 0, 10 * MS, offset_ns=0)  # runs 0..10 ms
    trace.execution(program, 0, 13 * MS, offset_ns=2 * MS)  # queued behind it: runs 10..15 ms
    trace.execution(program, 1, 2 * MS, offset_ns=0)  # step 1 starts at 20 ms: runs 20..22 ms
    with open_trace(trace.close()) as opened:
        context = AnalysisContext.build(opened, target_chip(None), True)
        assert context.busy_by_step() == {0: 15 * MS, 1: 2 * MS}
        assert context.busy_of_programs([program]) == 17 * MS


def test_merged_ns_counts_each_instant_once() -> None:
    """Nested, overlapping and touching intervals (sorted by start) count their union once."""
    from tputrace.store.aggregates import merged_ns

    assert merged_ns([]) == 0
    assert merged_ns([(0, 10), (2, 5), (5, 12), (20, 25), (25, 30)]) == 22


def test_every_analyzer_has_its_report_section_and_its_import_needs() -> None:
    """A new analyzer gets the HTML report's section by name (the keyword fallback put a recompile
    finding under "steps") and says what an import must hold for it to run."""
    from tputrace.analysis.imported import NEEDS
    from tputrace.analysis.report import ANALYZERS
    from tputrace.viewers.report.analysis_data import ANALYZER_SECTIONS

    assert [name for name in ANALYZERS if name not in ANALYZER_SECTIONS] == []
    assert [name for name in ANALYZERS if name not in NEEDS] == []
