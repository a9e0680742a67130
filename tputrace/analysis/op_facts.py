"""What several analyzers need of a rank's ops, read in one pass and shared through the context's cache.

The ops table is most of a trace and has no index the analyzers can use, so each query over it scans
every row, and a GROUP BY or DISTINCT over it also sorts or indexes every row. In a trace of at least
`COLUMNS_FROM_ROWS` ops, where numpy is installed, the columns these figures need are read once
(`tputrace.derived.op_columns`) and aggregated with array operations. In a smaller trace (where the
queries take a fraction of a second and importing numpy would cost more than it saves), without numpy,
or where the columns cannot be read as integers (a damaged or hand-made file), each figure is its own
SQL query. Both give the same figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tputrace.analysis.context import AnalysisContext

CACHE_KEY = "op_facts"
COLUMNS_FROM_ROWS = 500_000
"""Rows of the ops table (all ranks) from which the figures are computed over columns."""


@dataclass(frozen=True)
class OpFacts:
    """A rank's ops: how many; per step, how many and their host dispatch ns (NULL durations as 0);
    and the distinct (module string id, outputs string id) pairs of ops with a module, in the order
    they first occur in the file."""

    count: int
    by_step: dict[int, tuple[int, int]]
    module_outputs: tuple[tuple[int, int | None], ...]

    def dispatch_by_step(self, first: int, last: int) -> dict[int, tuple[int, int]]:
        """(dispatch ns, ops) per step from `first` to `last`, steps without ops left out."""
        return {step: (ns, ops) for step, (ops, ns) in self.by_step.items() if first <= step <= last}


def op_facts(context: AnalysisContext) -> OpFacts | None:
    """The rank's `OpFacts` read over columns (once per analysis); None in a small trace, without numpy
    or where the columns cannot be read: callers then query SQL."""
    if CACHE_KEY not in context.cache:
        context.cache[CACHE_KEY] = _read_over_columns(context) if _many_ops(context) else None
    facts = context.cache[CACHE_KEY]
    return facts if isinstance(facts, OpFacts) else None


def _read_over_columns(context: AnalysisContext) -> OpFacts | None:
    try:
        from tputrace.analysis.op_facts_columns import read_op_facts
    except ImportError:  # numpy is installed with the views, not with the core
        return None
    read = read_op_facts(context.trace, context.rank)
    return OpFacts(*read) if read is not None else None


def _many_ops(context: AnalysisContext) -> bool:
    """Whether the ops table spans at least `COLUMNS_FROM_ROWS` rowids (two lookups, no scan)."""
    (low,), = context.trace.sql("SELECT MIN(rowid) FROM ops")  # one query for both would scan the table
    (high,), = context.trace.sql("SELECT MAX(rowid) FROM ops")
    return low is not None and high - low + 1 >= COLUMNS_FROM_ROWS


def op_count(context: AnalysisContext) -> int:
    """How many ops the rank recorded."""
    facts = op_facts(context)
    if facts is not None:
        return facts.count
    return context.trace.count("ops", where="rank = ?", params=(context.rank,))


def dispatch_by_step(context: AnalysisContext, first: int, last: int) -> dict[int, tuple[int, int]]:
    """(host dispatch ns, ops) per step of the rank from `first` to `last` (steps with ops only)."""
    facts = op_facts(context)
    if facts is not None:
        return facts.dispatch_by_step(first, last)
    return {step: (ns, ops) for step, ns, ops in context.trace.sql(
        "SELECT step, COALESCE(SUM(dur_ns), 0), COUNT(*) FROM ops WHERE rank = ? AND step BETWEEN ? AND ? GROUP BY step",
        (context.rank, first, last))}


def module_outputs(context: AnalysisContext) -> tuple[tuple[int, int | None], ...]:
    """The distinct (module string id, outputs string id) pairs of the rank's ops with a module, in the
    order they first occur."""
    facts = op_facts(context)
    if facts is not None:
        return facts.module_outputs
    return tuple(context.trace.sql(
        "SELECT DISTINCT module_sid, outputs_sid FROM ops WHERE rank = ? AND module_sid IS NOT NULL", (context.rank,)))
