"""Every view of the TUI (one module each: `tui/overview.py`, ...), by id (see `actions.VIEW_ORDER`)."""

from __future__ import annotations

from tputrace.tui.view import TraceView
from tputrace.tui.collectives import CollectivesView
from tputrace.tui.compare import CompareView
from tputrace.tui.compiles import CompilesView
from tputrace.tui.findings import FindingsView
from tputrace.tui.fusions import FusionsView
from tputrace.tui.memory import MemoryView
from tputrace.tui.ops import OpsView
from tputrace.tui.overview import OverviewView
from tputrace.tui.sharding import ShardingView
from tputrace.tui.source import SourceView
from tputrace.tui.timeline import TimelineView

VIEW_CLASSES: dict[str, type[TraceView]] = {
    view.VIEW_ID: view
    for view in (OverviewView, FindingsView, OpsView, CompilesView, FusionsView, CollectivesView, ShardingView, TimelineView, SourceView, CompareView,
                 MemoryView)
}

__all__ = ["VIEW_CLASSES", "TraceView"]
