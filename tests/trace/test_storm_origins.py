"""The line a recompilation storm's finding names: where the varying shape was made (the host line that made a
copied batch, from `transfers.origin_frame_id`), and the bucketings offered for the sizes seen. Hand-made traces
(see `test_analysis.HandTrace`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from test_analysis import MS, SCRIPT, HandTrace, findings_of

from tputrace.analysis import analyze
from tputrace.analysis.buckets import MAX_OPTION_PADDING, VaryingDim, bucket_options
from tputrace.cli.main import main
from tputrace.store.reader import open_trace

LENGTHS = [37, 45, 64, 70, 100, 128]
DATA_FILE = "/proj/data.py"


def _batch_storm(path: Path, origin_line: int | None) -> HandTrace:
    """A batch of i64[4, length] copied at train.py:30 every step, the model's program compiling for each length;
    the copies' origin is data.py:`origin_line` in collate() (None: a trace without origins)."""
    trace = HandTrace(path, steps=len(LENGTHS))
    copy_line, model_line = trace.frame(30), trace.frame(41)
    origin = None if origin_line is None else trace.frame(origin_line, DATA_FILE, "collate")
    for step, length in enumerate(LENGTHS):
        trace.transfer(step, 4 * length * 8, MS, copy_line, offset_ns=0, origin=origin)
        trace.transfer(step, 4 * 8, MS, copy_line, offset_ns=0)  # labels, made by no watched function
        signature = f"i64[4,{length}], f32[64,64]"
        program = trace.program("fused_40_ops", signature, flops=1000.0 * length)
        trace.compile(program, "fused_40_ops", signature, step, 100 * MS, model_line,
                      reason="first" if step == 0 else "recompile")
    return trace


def test_finding_is_at_the_line_that_made_the_batch(tmp_path: Path) -> None:
    trace = _batch_storm(tmp_path / "made.tptrace", origin_line=12)
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    (storm,) = findings_of(report, "recompiles")
    assert (storm.file, storm.line) == (DATA_FILE, 12)
    assert storm.title == ("Recompilation storm: fused_40_ops compiled 6 times as the batches made at data.py:12 in "
                           "collate() change shape (6 sizes)")
    assert storm.suggestion.startswith("Pad the batches made at data.py:12 in collate() (copied to the chip at train.py:30)")
    assert storm.module is None  # the module is where the shape enters, not where it was made
    where = [(evidence.file, evidence.line) for evidence in storm.evidence]
    assert where[:2] == [(DATA_FILE, 12), (SCRIPT, 30)]  # the making line first, then the copying line
    (data,) = report.results["recompiles"].data.host_input_storms
    assert (data.made_at, data.where) == ("data.py:12", "train.py:30")
    assert {site.made_at for site in report.results["recompiles"].data.storms} == {"data.py:12"}
    page = tmp_path / "made.html"
    assert main(["plot", str(trace.path), "-o", str(page), "--plotlyjs", "cdn"]) == 0
    assert "for the batches made at data.py:12 (copied at train.py:30)" in page.read_text()


def test_without_origins_the_finding_stays_at_the_copy(tmp_path: Path) -> None:
    trace = _batch_storm(tmp_path / "copied.tptrace", origin_line=None)
    with open_trace(trace.close()) as opened:
        report = analyze(opened)
    (storm,) = findings_of(report, "recompiles")
    assert (storm.file, storm.line) == (SCRIPT, 30)
    assert "the batches copied to the chip at train.py:30 change shape" in storm.title
    assert report.results["recompiles"].data.host_input_storms[0].made_at is None


@dataclass(frozen=True)
class _Weight:
    runs: int = 1
    flops: float = 0.0


def test_bucket_options_fit_the_sizes_seen() -> None:
    """Sizes 103-119: a multiple of 256 or 512 pads them 2-5x and a multiple of 128 already makes one bucket, so
    neither is offered; every option offered pads at most `MAX_OPTION_PADDING` and none is beaten on both counts."""
    sizes = [103, 107, 111, 115, 119]
    options = bucket_options(VaryingDim(((0, 1),), tuple(sizes)), [_Weight()] * len(sizes), 100 * MS, 10 * MS)
    rules = {option.rule: option.buckets for option in options}
    assert "multiple of 256" not in rules and "multiple of 512" not in rules
    assert (128,) in rules.values() and (104, 112, 120) in rules.values()
    for option in options:
        assert option.padding_share_estimate <= MAX_OPTION_PADDING
        assert not any(other.compiles <= option.compiles and other.padding_share_estimate < option.padding_share_estimate
                       for other in options)


def test_bucket_options_leave_out_what_pads_more_than_double() -> None:
    """Sizes 3-7: multiples of 8 (one bucket) and powers of two (two) are offered, the larger multiples (one bucket
    with more padding) are not. Sizes 1 and 2: the only bucketing with fewer compiles (8) pads 5x: none is offered."""
    sizes = [3, 4, 5, 6, 7]
    options = bucket_options(VaryingDim(((0, 0),), tuple(sizes)), [_Weight()] * len(sizes), 100 * MS, 10 * MS)
    assert {option.rule: option.buckets for option in options} == {"multiple of 8": (8,), "power of two": (4, 8)}
    assert bucket_options(VaryingDim(((0, 0),), (1, 2)), [_Weight()] * 2, 100 * MS, 10 * MS) == []


def test_source_view_counts_the_compiles_a_line_caused(tmp_path: Path) -> None:
    """The Source view's "caused" column: the storm's 6 compiles on the line that made the batch, while the compiles
    column keeps them on the line that triggered them."""
    from tputrace.tui.queries import caused_compiles, source_stats

    trace = _batch_storm(tmp_path / "caused.tptrace", origin_line=12)
    with open_trace(trace.close()) as opened:
        files = {stat.file: stat for stat in source_stats(opened, 0, None, caused_compiles(opened, 0))}
    assert files[DATA_FILE].lines[12].caused == 6 and files[DATA_FILE].lines[12].compiles == 0
    assert files[SCRIPT].lines[41].compiles == 6 and files[SCRIPT].lines[41].caused == 0
