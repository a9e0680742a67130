"""Training steps: one row per step with the time of each category of work in it."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.derived.text import shown
from tputrace.store.aggregates import compile_wall_ns, execution_busy_ns, rank_filter

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

STEP_CATEGORIES = ("compile", "sync stall", "collective", "compute", "host")
"""The categories a step's time is split into (they overlap), in the order views show them."""

_BREAKDOWN_TABLES = ("ops", "executions", "collectives", "fallbacks")


LOOP_STEPS_WHERE = ("rank = ? AND start_ns IS NOT NULL AND end_ns IS NOT NULL AND COALESCE(source, '') != 'end'")
"""SQL condition on `steps` (parameter: the rank) selecting the training loop's finished steps, as every view counts
them: without the trailing `end` step."""


def loop_step_durations(trace: Trace, rank: int) -> list[int]:
    """The durations of `rank`'s training-loop steps, in order: finished steps, without the trailing `end`
    step (the work after the last optimizer step: an evaluation, saving). Every view counts steps and
    takes their median from this."""
    return [end - start for start, end in trace.sql(
        f"SELECT start_ns, end_ns FROM steps WHERE {LOOP_STEPS_WHERE} ORDER BY step", (rank,))]


def steady_median_ns(durations: list[int]) -> int | None:
    """The median of the steady steps (`steady_median`) in whole ns. The report's median step
    (`analysis.context.steady`) is the same figure."""
    median = steady_median(durations)
    return None if median is None else int(median)


def steady_median(values: Sequence[float]) -> float | None:
    """The median of the steady steps' values: those after the first (which compiles), or all of them when there
    are fewer than three."""
    later = values[1:] if len(values) >= 3 else values
    return statistics.median(later) if later else None


@dataclass(frozen=True)
class StepRow:
    """One training step of one rank: its time (on the rank's clock), the compiles and syncs in it, and,
    when asked for (`step_rows(..., breakdown=True)`), its ops and the time in programs, dispatch,
    collectives and CPU fallbacks. `compile_ns` is wall time: nested compiles count each instant once."""

    rank: int
    step: int
    start_ns: int
    end_ns: int | None
    compiles: int
    compile_ns: int
    syncs: int
    sync_ns: int
    source: str | None = None  # optimizer, explicit, or end (the work after the last optimizer step)
    ops: int = 0
    dispatch_ns: int = 0
    execution_ns: int = 0
    collective_ns: int = 0
    fallback_ns: int = 0

    @property
    def dur_ns(self) -> int:
        return 0 if self.end_ns is None else self.end_ns - self.start_ns

    @property
    def in_loop(self) -> bool:
        """Whether this is one of the loop's steps, not the trailing `end` step."""
        return self.source != "end"

    @property
    def category_ns(self) -> dict[str, int]:
        """The (overlapping) time of each of `STEP_CATEGORIES`."""
        return {
            "compile": self.compile_ns,
            "sync stall": self.sync_ns,
            "collective": self.collective_ns,
            "compute": self.execution_ns,
            "host": self.dispatch_ns + self.fallback_ns,
        }

    @property
    def dominant(self) -> str:
        """The category that took most of the step."""
        parts = self.category_ns
        return max(STEP_CATEGORIES, key=lambda name: parts[name])


def step_rows(trace: Trace, rank: int | None = None, *, breakdown: bool = False) -> list[StepRow]:
    """Every step of `rank` (None: every rank) with a start time, in order (by rank, then step).

    Without `breakdown` only the small tables are read (no scan of the ops); with it, each step also
    gets its op count and the time in ops, programs, collectives and CPU fallbacks.
    """
    tables = ("compiles", "syncs", *(_BREAKDOWN_TABLES if breakdown else ()))
    where, params = rank_filter(rank)
    per_step: dict[str, dict[tuple[int, int], tuple[int, int]]] = {
        table: {
            (step_rank, step): (count, total)
            for step_rank, step, count, total in trace.sql(
                f"SELECT rank, step, COUNT(*), COALESCE(SUM(dur_ns), 0) FROM {table}{where} GROUP BY rank, step", params
            )
        }
        for table in tables
    }
    if breakdown:  # a chip's queued programs overlap in time: each instant it had one in flight counts once
        per_step["executions"] = {key: (per_step["executions"].get(key, (0, 0))[0], busy_ns)
                                  for key, busy_ns in execution_busy_ns(trace, rank=rank, by="step").items()}
    compile_ns_per_step = compile_wall_ns(trace, rank=rank, by="step")
    rows = []
    for step_rank, step, start_ns, end_ns, source in trace.sql(
        # A step whose start a damaged file lost cannot be placed in time; the views leave it out.
        f"SELECT rank, step, start_ns, end_ns, source FROM steps{where}{' AND' if where else ' WHERE'} "
        "typeof(start_ns) = 'integer' ORDER BY rank, step, start_ns",
        params,
    ):
        key = (step_rank, step)
        (compiles, _), (syncs, sync_ns), (ops, dispatch_ns), (_, execution_ns), (_, collective_ns), (_, fallback_ns) = (
            per_step[table].get(key, (0, 0)) if table in per_step else (0, 0)
            for table in ("compiles", "syncs", *_BREAKDOWN_TABLES)
        )
        rows.append(StepRow(step_rank, step, start_ns, end_ns, compiles, compile_ns_per_step.get(key, 0), syncs, sync_ns,
                            shown(source), ops, dispatch_ns, execution_ns, collective_ns, fallback_ns))
    return rows
