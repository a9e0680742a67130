"""The pytest plugin (entry point `pytest11`): `pytest --tputrace[=DIR]` records each test's run under DIR
and fails a test that breaks its budget.

A test's budget comes from the marker `@pytest.mark.tputrace(max_recompiles=0, ...)` and from the
`tputrace_budget` fixture (a dict the test fills); the keys are those of a budget file (`tputrace.budgets`).
At the end, the terminal summary lists the tests with the most recompiles and host syncs.

Without `--tputrace` the plugin only registers its option and marker: it imports neither torch nor the
backend. Under pytest-xdist each worker writes its traces into its own folder DIR/<worker id>.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

DEFAULT_DIR = ".tputrace"
SUMMARY_ROWS = 5
_STATE_KEY = pytest.StashKey["_PluginState"]()
_BUDGET_KEY = pytest.StashKey[dict[str, float]]()
_PROPERTY = "tputrace"


@dataclass
class _TestRun:
    nodeid: str
    trace: Path
    recompiles: int
    syncs_per_step: float | None  # None: the test ran no step after warm-up
    violations: int


@dataclass(eq=False)  # registered as a plugin object, which pytest keeps in sets
class _PluginState:
    directory: Path
    mode: str
    runs: list[_TestRun]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep a recorded test's figures from its report (a worker's too, under pytest-xdist)."""
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == _PROPERTY and isinstance(value, dict):
                self.runs.append(_TestRun(report.nodeid, Path(value["trace"]), int(value["recompiles"]),
                                          _number(value["syncs_per_step"]), int(value["violations"])))


def _number(value: object) -> float | None:
    return None if value is None else float(str(value))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tputrace", "recording tests on the tpu device")
    group.addoption("--tputrace", nargs="?", const=DEFAULT_DIR, default=None, metavar="DIR",
                    help=f"record each test's run under DIR (default {DEFAULT_DIR}) and check tputrace budgets")
    group.addoption("--tputrace-mode", default="strict", choices=("defer", "strict", "blocking", "compile"),
                    help="eager mode the tests run in (default: strict)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tputrace(**limits): performance budget of a test recorded with --tputrace "
                                       "(max_recompiles, max_syncs_per_step, ...)")
    directory = config.getoption("tputrace", None)
    if directory is None:
        return
    worker = getattr(config, "workerinput", {}).get("workerid")
    base = Path(directory).resolve()
    state = _PluginState(base / worker if worker else base, config.getoption("tputrace_mode"), [])
    config.stash[_STATE_KEY] = state
    config.pluginmanager.register(state, "tputrace-results")


@pytest.fixture
def tputrace_budget(request: pytest.FixtureRequest) -> dict[str, float]:
    """Limits for this test (budget-file keys); checked after the test when run with `--tputrace`."""
    budget: dict[str, float] = {}
    request.node.stash[_BUDGET_KEY] = budget
    return budget


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    state = item.config.stash.get(_STATE_KEY, None)
    if state is None:
        return (yield)
    from tputrace.recording import lifecycle

    state.directory.mkdir(parents=True, exist_ok=True)
    trace_path = state.directory / f"{_file_name(item.nodeid)}.tptrace"
    lifecycle.start(str(trace_path), script=item.nodeid, argv=[], mode=state.mode)
    try:
        result = yield
    except BaseException:
        lifecycle.stop(1)
        raise
    lifecycle.stop(0)
    _check(item, state, trace_path)
    return result


def _file_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:180]


def _check(item: pytest.Item, state: _PluginState, trace_path: Path) -> None:
    from tputrace.budgets import budget_from_mapping, violations
    from tputrace.compare.figures import run_figures
    from tputrace.store.errors import TputraceError
    from tputrace.store.reader import open_trace

    limits: dict[str, Any] = {}
    for marker in reversed(list(item.iter_markers("tputrace"))):
        limits.update(marker.kwargs)
    fixture_budget: dict[str, float] = item.stash.get(_BUDGET_KEY, {})
    limits.update(fixture_budget)
    try:
        budget = budget_from_mapping(limits, item.nodeid)
    except TputraceError as error:
        bad_budget = str(error)
    else:
        bad_budget = None
    if bad_budget is not None:
        pytest.fail(bad_budget, pytrace=False)
    with open_trace(trace_path) as trace:
        figures = run_figures(trace)
    broken = violations(figures, budget)
    # Carried on the test's report, so that under pytest-xdist the controller's summary sees every worker's tests.
    item.user_properties.append((_PROPERTY, {
        "trace": str(trace_path), "recompiles": len(figures.recompiles_after_warmup),
        "syncs_per_step": figures.per_steady_step(figures.steady_syncs) if figures.steady_steps else None,
        "violations": len(broken)}))
    if broken:
        lines = "\n".join(violation.describe() for violation in broken)
        pytest.fail(f"tputrace budget exceeded (trace {trace_path}):\n{lines}", pytrace=False)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_STATE_KEY, None)
    if state is None or not state.runs:
        return
    worst = sorted(state.runs, key=lambda run: (run.violations, run.recompiles, run.syncs_per_step or 0.0), reverse=True)
    terminalreporter.section("tputrace")
    terminalreporter.write_line(f"traces in {state.directory}")
    for run in worst[:SUMMARY_ROWS]:
        syncs = (f"{run.syncs_per_step:.3g} host syncs per steady step" if run.syncs_per_step is not None
                 else "no step after warm-up to count host syncs in")
        terminalreporter.write_line(f"{run.nodeid}: {run.recompiles} recompile(s) after warm-up, {syncs}, "
                                    f"{run.violations} budget violation(s)")
