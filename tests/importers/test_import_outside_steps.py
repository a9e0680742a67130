"""Work a capture holds outside its steps: what ran after the last `ProfilerStep` closed (a collective the step left
running on gloo's thread while profiling went on, as on-demand Kineto captures hold), or after XProf's last step marker
(and the device work launched by then) ended, is no step's, and every per-step share reads only what ran in the
steps."""

from __future__ import annotations

import gzip
import json
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tputrace
from tputrace.analysis import analyze_path
from tputrace.cli.main import main

BASE_NS = 1_719_853_884_000_000_000
T0 = 1_212_075_529_876.817  # us since BASE_NS, on Kineto's monotonic clock
STEP_US = 200_000.0


def _x(cat: str, name: str, ts: float, dur: float, tid: int, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1074, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _gloo(ts: float, dur: float) -> dict[str, Any]:
    return _x("user_annotation", "gloo:all_reduce", ts, dur, 3553, **{"Input type": ["float"], "Input Dims": [[1 << 20]]})


def _capture(folder: Path) -> Path:
    """One rank's on-demand capture: step 551 (an op and a 100 ms all-reduce on gloo's thread), then two all-reduces
    of 200 ms and an op that run after the step closed, while the profiler still records."""
    events = [
        _x("user_annotation", "ProfilerStep#551", T0, STEP_US, 1074),
        _x("cpu_op", "aten::mul", T0 + 5.0, 20.0, 1074),
        _gloo(T0 + 10_000.0, 100_000.0),
        _gloo(T0 + 300_000.0, 200_000.0),
        _gloo(T0 + 600_000.0, 200_000.0),
        _x("cpu_op", "aten::empty", T0 + 900_000.0, 2.5, 1074),
        {"ph": "i", "name": "Record Window End", "pid": "", "tid": "", "ts": T0 + 1_000_000.0},
    ]
    document = {"schemaVersion": 1, "deviceProperties": [],
                "distributedInfo": {"backend": "gloo", "rank": 34, "world_size": 300},
                "traceEvents": events, "traceName": "rank-34.pt.trace.json", "baseTimeNanoseconds": BASE_NS}
    path = folder / "rank-34.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return path


def test_collectives_after_the_last_step_are_in_no_step_of_the_loop(tmp_path: Path) -> None:
    output = tmp_path / "imported.tptrace"
    assert main(["import", str(_capture(tmp_path)), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        steps = trace.sql("SELECT step, start_ns, end_ns, source FROM steps ORDER BY step")
        assert [(step, source) for step, _, _, source in steps] == [(551, "imported"), (552, "end")]
        assert steps[1][1] == steps[0][2]  # the span after the step starts where it closed
        assert trace.sql("SELECT step FROM collectives ORDER BY start_ns") == [(551,), (552,), (552,)]
        assert trace.sql("SELECT step FROM ops ORDER BY start_ns") == [(551,), (552,)]
    report = analyze_path(output)
    collectives = next(finding for finding in report.findings if finding.analyzer == "collectives")
    # 100 ms of the 200 ms step, not the 500 ms of all three calls (250% of a step).
    assert collectives.cost_per_step_ns == pytest.approx(100e6, rel=0.01)
    assert "50% of each step" in collectives.title
    assert not [finding for finding in report.findings if "% of a step" in finding.title
                and int(finding.title.split("% of a step")[0].rsplit("(", 1)[1]) > 100]


def test_a_jax_ppermute_ring_is_collective_permutes_with_advice_for_jax(tmp_path: Path) -> None:
    """XLA's collective-permutes (JAX's `ppermute` in a `shard_map` ring) are stored as what they are, not torch's
    `send`, and the share finding's fix speaks of ppermute hops, not torch's isend/irecv."""
    from captures import JAX_PPERMUTE_RING, jax_ppermute_capture

    ppermute_line = next(index for index, text in enumerate(JAX_PPERMUTE_RING.splitlines(), 1) if "ppermute(" in text)
    output = tmp_path / "imported.tptrace"
    assert main(["import", str(jax_ppermute_capture(tmp_path)), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        assert {kind for (kind,) in trace.sql("SELECT DISTINCT kind FROM collectives")} == {"collective_permute"}
    finding = next(finding for finding in analyze_path(output).findings if finding.analyzer == "collectives")
    assert (Path(finding.file).name, finding.line) == ("jax_ring.py", ppermute_line)
    assert "ppermute" in finding.suggestion and "shard_map" in finding.suggestion
    assert "isend" not in finding.suggestion and "DDP" not in finding.suggestion


JAX_EVALUATE_AFTER_LOOP = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp

    @jax.jit
    def step(w, x):
        return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)

    @jax.jit
    def evaluate(w):
        return jnp.linalg.norm(w)

    w, x = jnp.ones((64, 64)), jnp.ones((32, 64))
    step(w, x).block_until_ready()
    with jax.profiler.trace(sys.argv[1]):
        for i in range(3):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                w = step(w, x)
                w.block_until_ready()
        evaluate(w).block_until_ready()
""")


def test_a_jax_evaluation_after_the_last_step_is_in_no_step_of_the_loop(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """An XProf capture's work after the last step marker (an evaluation, its compile, the profiler's stop) is in an
    `end` step, as a recording's work after the loop: the last step's ops are those of the others."""
    from captures import _capture

    logdir = _capture(tmp_path, "evaluate_after_loop.py", JAX_EVALUATE_AFTER_LOOP, "logdir")
    output = tmp_path / "imported.tptrace"
    assert main(["import", str(logdir), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        steps = trace.sql("SELECT step, start_ns, end_ns, source FROM steps ORDER BY step")
        assert [(step, source) for step, _, _, source in steps] == [
            (0, "imported"), (1, "imported"), (2, "imported"), (3, "end")]
        assert steps[3][1] >= steps[2][2]
        ops = trace.sql("SELECT o.step, m.text FROM ops o JOIN strings m ON m.id = o.module_sid")
        per_step = Counter(step for step, module in ops if module.startswith("jit(step)"))
        assert per_step == {0: per_step[0], 1: per_step[0], 2: per_step[0]}
        assert {step for step, module in ops if module.startswith("jit(evaluate)")} == {3}
        assert trace.sql("SELECT c.step FROM compiles c JOIN strings n ON n.id = c.name_sid "
                         "WHERE n.text = 'jit_evaluate'") == [(3,)]
    capsys.readouterr()
    assert main(["summary", str(output)]) == 0
    assert " 3 steps " in capsys.readouterr().out
