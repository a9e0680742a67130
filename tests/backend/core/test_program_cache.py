"""The bound on kept compiled programs: the oldest go past the limit, memory maps stop growing, results
stay right, and a program compiled again after its eviction says so in the trace."""

from __future__ import annotations

import copy
import gc
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import jax
import pytest
import torch

import tputrace
from backend_helpers import eager
from tputrace.analysis import analyze_path
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core import program_cache
from tputrace.cli.main import main

_MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]


@pytest.fixture
def small_cache() -> Iterator[int]:
    """A limit of 4 programs for the test; the old limit after it."""
    old = program_cache.limit()
    program_cache.set_limit(4)
    try:
        yield 4
    finally:
        program_cache.set_limit(old)


def _memory_maps() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


def _distinct_programs(first: int, count: int) -> list[float]:
    """`count` computations on lengths no program was compiled for yet; their results."""
    results = []
    for length in range(first, first + count):
        x = torch.arange(length, dtype=torch.float32, device="tpu")
        results.append((x * 2 + 1).sum().item())
    return results


@pytest.mark.parametrize("mode", _MODES, ids=lambda mode: mode.name)
def test_programs_past_the_limit_are_dropped_and_results_stay_right(small_cache: int, mode: EagerMode) -> None:
    evicted_before = program_cache.evictions()
    with eager(mode):
        results = _distinct_programs(1001, 12)
    assert results == [float((torch.arange(n, dtype=torch.float32) * 2 + 1).sum()) for n in range(1001, 1013)]
    assert program_cache.kept_count() <= small_cache
    assert program_cache.evictions() - evicted_before >= 12 - small_cache


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/maps")
def test_memory_maps_stop_growing_with_the_programs(small_cache: int) -> None:
    """XLA:CPU maps memory regions per program it keeps: with the bound, 60 new programs leave the
    count where 4 would (without it, this loop added about 200 maps)."""
    with eager(EagerMode.DEFER_NEVER):
        _distinct_programs(2001, 4)
        gc.collect()
        before = _memory_maps()
        _distinct_programs(2005, 15)
        gc.collect()
        after = _memory_maps()
    assert after - before < 40, (before, after)


@pytest.mark.parametrize("mode", _MODES, ids=lambda mode: mode.name)
def test_a_hot_program_evicted_runs_again_correctly(small_cache: int, mode: EagerMode) -> None:
    """A training step whose programs keep being dropped still trains as on the CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    inputs, targets = torch.randn(32, 8), torch.randn(32, 1)

    def train(device: str) -> list[float]:
        net = copy.deepcopy(model).to(device)
        optimizer = torch.optim.AdamW(net.parameters(), lr=0.01)
        losses = []
        for step in range(4):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(net(inputs.to(device)), targets.to(device))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if device != "cpu":
                _distinct_programs(3001 + 10 * step, 3)  # crowd the step's programs out
        return losses

    with eager(mode):
        tpu_losses = train("tpu")
    assert tpu_losses == pytest.approx(train("cpu"), rel=1e-4, abs=1e-6)


def test_a_recompile_after_eviction_says_why(small_cache: int, tmp_path: Path) -> None:
    script = tmp_path / "evicted.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch

            for length in (7, 8, 9, 10, 11, 7):
                x = torch.ones(length, device="tpu")
                print((x * 3).sum().item())
            """
        )
    )
    trace_path = tmp_path / "evicted.tptrace"
    assert main(["run", "--mode", "strict", "-o", str(trace_path), str(script)]) == 0
    with tputrace.open(trace_path) as trace:
        rows = trace.sql(
            "SELECT s.text, d.text FROM compiles c JOIN strings s ON s.id = c.name_sid "
            "LEFT JOIN strings d ON d.id = c.diff_sid WHERE c.reason = 'recompile'"
        )
    evicted = [(name, diff) for name, diff in rows if diff and "dropped from the program cache" in diff]
    assert any(name == "aten.mul.Tensor" for name, _ in evicted), rows
    assert all("TPUTRACE_MAX_PROGRAMS keeps 4" in diff for _, diff in evicted)

    report = analyze_path(trace_path)
    cache_findings = [finding for finding in report.findings if finding.analyzer == "program_cache"]
    assert len(cache_findings) == 1
    finding = cache_findings[0]
    assert finding.title.startswith(f"Program cache too small: {len(evicted)} programs compiled again")
    assert "TPUTRACE_MAX_PROGRAMS above" in finding.suggestion and finding.line in (5, 6)  # torch.ones or x * 3
    # The storm analyzer sees one compile per length (5 lengths), not the recompiles after eviction.
    for storm in report.results["recompiles"].data.storms:
        assert storm.compiles == 5, storm


def test_a_bad_limit_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        program_cache.set_limit(0)


def test_a_compiled_graph_whose_program_was_dropped_compiles_again(small_cache: int) -> None:
    torch._dynamo.reset()

    @torch.compile(backend="tpu", dynamic=False)
    def scaled_sum(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() * 3).sum()

    x = torch.linspace(0, 1, 40)
    expected = float((x.sin() * 3).sum())
    compiles: list[str] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, duration, **kwargs: compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None
    )
    first = scaled_sum(x.to("tpu")).item()
    _distinct_programs(4001, 6)  # crowd the graph's program out
    crowded = len(compiles)
    again = scaled_sum(x.to("tpu")).item()
    assert len(compiles) > crowded  # the graph's program compiled again
    assert first == pytest.approx(expected, rel=1e-5) and again == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("mode", _MODES, ids=lambda mode: mode.name)
def test_forgetting_compiled_programs_drops_every_kept_one(mode: EagerMode) -> None:
    from tputrace.backend.core.executor import forget_compiled_programs

    with eager(mode):
        before = _distinct_programs(5001, 3)
        assert program_cache.kept_count() > 0
        forget_compiled_programs()
        assert program_cache.kept_count() == 0
        assert _distinct_programs(5001, 3) == before


@pytest.mark.parametrize("value", ["many", "0"])
def test_a_bad_limit_in_the_environment_is_a_one_line_error(value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    monkeypatch.setenv("TPUTRACE_MAX_PROGRAMS", value)
    assert main(["run", "-o", str(tmp_path / "noop.tptrace"), str(script)]) == 2
    captured = capsys.readouterr()
    assert "ran" not in captured.out
    assert captured.err.strip().splitlines() == [captured.err.strip()] and "TPUTRACE_MAX_PROGRAMS" in captured.err
