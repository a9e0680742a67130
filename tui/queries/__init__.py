"""What the TUI reads from a trace: pure functions of a `Trace`, each returning small dataclasses.

Every view's data comes from here (or, where the HTML report shows the same figure, from
`tputrace.derived`: run facts, steps, lanes), so it can be tested without Textual. Aggregation happens
in SQL (`trace.sql`); a function returns aggregated rows or one page of records, never a whole table.
Functions take the rank to show (views show one rank at a time; the collectives view also compares
ranks). One module per view's data; this package is their one surface.
"""

from tputrace.tui.queries.collectives import CollectiveGroup, RankCollectives, collective_groups, collective_ranks
from tputrace.tui.queries.compare import comparison
from tputrace.tui.queries.compiles import CompileRow, CompileSite, compile_rows, compile_sites
from tputrace.tui.queries.flushes import (
    FlushContents,
    FlushOrder,
    FlushRow,
    FusionRow,
    TriggerStat,
    flush_contents,
    flush_rows,
    flush_triggers,
)
from tputrace.tui.queries.ops import (
    GROUP_ORDERS,
    MAX_GROUPS,
    OP_GROUPING_LABELS,
    OP_GROUPINGS,
    GroupOrder,
    OpGroup,
    OpGrouping,
    OpInstance,
    filter_groups,
    like_pattern,
    op_groups,
    op_groups_by,
    op_instances,
    ops_read,
    OpsRead,
    ops_total_ns,
    sort_groups,
)
from tputrace.tui.queries.memory import MemoryTables, memory_tables
from tputrace.tui.queries.overview import (
    SEPARATE_ANALYZERS,
    FindingsResult,
    Overview,
    finding_location,
    load_findings,
    overview,
)
from tputrace.tui.queries.sharding import USER_CALL, CauseGroup, MeshRow, ParameterRow, ShardingTables, sharding_tables
from tputrace.tui.queries.source import FileStat, LineStat, caused_compiles, resolve_source, source_stats
from tputrace.tui.queries.timeline import HOST_LANES, LaneBusy, OpTimes, WindowEvent, op_times, timeline_lanes, window_events

__all__ = [
    "comparison",
    "GROUP_ORDERS", "HOST_LANES", "MAX_GROUPS", "OP_GROUPINGS", "OP_GROUPING_LABELS", "SEPARATE_ANALYZERS", "USER_CALL",
    "CauseGroup", "CollectiveGroup", "CompileRow", "CompileSite", "FileStat", "FindingsResult", "FlushContents", "FlushOrder",
    "FlushRow", "FusionRow", "GroupOrder", "LaneBusy", "LineStat", "MemoryTables", "MeshRow", "OpGroup", "OpGrouping", "OpInstance", "OpTimes", "Overview", "ParameterRow",
    "RankCollectives", "ShardingTables", "TriggerStat", "WindowEvent",
    "collective_groups", "collective_ranks", "compile_rows", "compile_sites", "filter_groups", "finding_location",
    "flush_contents", "flush_rows", "flush_triggers", "like_pattern", "load_findings", "memory_tables", "op_groups", "op_groups_by", "op_instances", "op_times", "ops_read", "OpsRead",
    "caused_compiles", "ops_total_ns", "overview", "resolve_source", "sharding_tables", "sort_groups", "source_stats", "timeline_lanes", "window_events",
]
