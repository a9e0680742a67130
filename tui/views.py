"""The TUI's views, one module each; `VIEW_CLASSES` maps a view id (see `actions.VIEW_ORDER`) to its class."""

from __future__ import annotations

from tputrace.tui.views.base import TraceView
from tputrace.tui.views.collectives import CollectivesView
from tputrace.tui.views.compiles import CompilesView
from tputrace.tui.views.findings import FindingsView
from tputrace.tui.views.fusions import FusionsView
from tputrace.tui.views.ops import OpsView
from tputrace.tui.views.overview import OverviewView
from tputrace.tui.views.source import SourceView
from tputrace.tui.views.timeline import TimelineView

VIEW_CLASSES: dict[str, type[TraceView]] = {
    view.VIEW_ID: view
    for view in (OverviewView, FindingsView, OpsView, CompilesView, FusionsView, CollectivesView, TimelineView, SourceView)
}

__all__ = ["VIEW_CLASSES", "TraceView"]
