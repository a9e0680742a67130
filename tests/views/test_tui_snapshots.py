"""Snapshot tests: every view of the TUI on the committed small fixture at 120x36.

The findings are fixed here (not the live analysis) so that the snapshots change only when the TUI
does. Update after an intended change with `pytest tests/views/test_tui_snapshots.py --snapshot-update`
and look at the report it writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pytest_textual_snapshot")

import tputrace
from fixtures.make_tui_fixture import SMALL_TRACE, SOURCE_ROOT, settle
from tputrace.analysis.findings import Evidence, Finding
from tputrace.tui.queries import FindingsResult
from tputrace.tui.session import Session

REPO_ROOT = Path(__file__).resolve().parents[2]
TERMINAL_SIZE = (120, 36)

FIXED_FINDINGS = (
    Finding(
        analyzer="syncs", severity="warning", title="Host sync every step at train.py:35 (item)",
        explanation="The host waits for the chip at loss.item() every step, so it cannot queue the next step.",
        suggestion="Accumulate the loss on the chip and call .item() every N steps.",
        cost_total_ns=18_500_000, cost_per_step_ns=3_080_000,
        evidence=(Evidence("6 item syncs, 3.09 ms stall each", file="/home/user/proj/train.py", line=35),),
        file="/home/user/proj/train.py", line=35,
    ),
    Finding(
        analyzer="recompiles", severity="critical", title="Recompile: sequence length changes 128 -> 192",
        explanation="fused:gpt_train_step compiled again because input 0 dim 1 changed.",
        suggestion="Pad sequences to a few bucket lengths.",
        cost_total_ns=711_000_000, cost_per_step_ns=None, file="/home/user/proj/train.py", line=35,
    ),
)


class FixedFindingsSession(Session):
    def findings(self, rank: int | None = None) -> FindingsResult:
        return FindingsResult(findings=FIXED_FINDINGS)


@pytest.fixture
def make_app(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The app on the small fixture, with paths shown relative to the repository."""
    from tputrace.tui.app import TraceApp

    monkeypatch.chdir(REPO_ROOT)
    traces = []

    def build(theme: str | None = None) -> TraceApp:
        trace = tputrace.open(SMALL_TRACE.relative_to(REPO_ROOT))
        traces.append(trace)
        return TraceApp(FixedFindingsSession.open(trace, source_roots=[str(SOURCE_ROOT)]), theme=theme)

    yield build
    for trace in traces:
        trace.close()


def keys_then_settle(*keys: str) -> Any:
    async def run_before(pilot: Any) -> None:
        await settle(pilot)
        for key in keys:
            await pilot.press(key)
            await settle(pilot)

    return run_before


VIEW_KEYS: dict[str, tuple[str, ...]] = {
    "overview": (),
    "findings": ("2",),
    "ops": ("3",),
    "ops_instances": ("3", "enter"),
    "ops_by_source": ("3", "g", "g"),
    "compiles": ("4", "down", "down", "down"),
    "fusions": ("5",),
    "collectives": ("6",),
    "timeline": ("7",),
    "source": ("8",),
    "sharding": ("9",),
    "memory": ("M",),
    "help": ("question_mark",),
}


@pytest.mark.parametrize("keys", list(VIEW_KEYS.values()), ids=list(VIEW_KEYS))
def test_view_snapshot(keys: tuple[str, ...], snap_compare: Any, make_app: Any) -> None:
    assert snap_compare(make_app(), terminal_size=TERMINAL_SIZE, run_before=keys_then_settle(*keys))


@pytest.mark.parametrize("theme", ["textual-light", "textual-dark"])
@pytest.mark.parametrize("keys", [(), ("3",)], ids=["overview", "ops"])
def test_other_themes_snapshot(theme: str, keys: tuple[str, ...], snap_compare: Any, make_app: Any) -> None:
    assert snap_compare(make_app(theme), terminal_size=TERMINAL_SIZE, run_before=keys_then_settle(*keys))
