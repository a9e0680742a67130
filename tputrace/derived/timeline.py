"""The whole run's timeline, per rank: host lanes and each chip's lanes, decimated to an event budget.

A lane with more events than its share of the budget keeps its longest events one by one and all of
its events merged into time bins (count and busy time per bin), so that a view of a million-op trace
draws a bounded number of marks. Times are put on one clock across ranks (`rank_offsets`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tputrace.derived.lanes import LANE_TABLES, Lane
from tputrace.derived.op_time import op_time_kind
from tputrace.derived.run_facts import rank_offsets

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

# The timeline draws at most this many events individually (the longest ones of each lane when a lane
# has more); everything else is merged into per-lane time bins.
TIMELINE_EVENT_BUDGET = 30_000
TIMELINE_BINS_PER_LANE = 1_500


@dataclass(frozen=True)
class _LaneSpec:
    name: str
    kind: str
    rank: int
    chip: int | None
    where: str
    params: tuple[Any, ...]


# Per kind: the detail columns (SQL over the table aliased `t`, with joins) and their field names.
_LANE_DETAILS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "dispatch": ("", ("t.op_sid", "t.inputs_sid", "t.outputs_sid", "t.frame_id", "t.module_sid", "t.step"),
                 ("op", "inputs", "outputs", "source", "module", "step")),
    "program": (
        " LEFT JOIN programs p ON p.id = t.program_id AND p.rank = t.rank"
        " LEFT JOIN flushes f ON f.id = t.flush_id AND f.rank = t.rank",
        ("p.name_sid", "p.signature_sid", "p.n_ops", "p.flops", "p.bytes_accessed", "f.trigger", "f.frame_id", "t.step"),
        ("program", "inputs", "ops", "flops", "bytes_accessed", "flush_trigger", "source", "step"),
    ),
    "compile": ("", ("t.name_sid", "t.kind", "t.reason", "t.diff_sid", "t.signature_sid", "t.frame_id", "t.step"),
                ("compiled", "kind", "reason", "changed", "inputs", "source", "step")),
    "sync": ("", ("t.kind", "t.pending_ops", "t.frame_id", "t.step"), ("sync", "pending_ops", "source", "step")),
    "transfer": ("", ("t.direction", "t.bytes", "t.src_chip", "t.dst_chip", "t.frame_id", "t.step"),
                 ("direction", "bytes", "from_chip", "to_chip", "source", "step")),
    "fallback": ("", ("t.op_sid", "t.inputs_sid", "t.frame_id", "t.step"), ("op", "inputs", "source", "step")),
    "collective": ("", ("t.kind", "t.bytes", "t.dtype", "t.wait_ns", "t.bus_bandwidth", "t.group_sid", "t.frame_id", "t.step"),
                   ("collective", "bytes", "dtype", "wait_ns", "bus_bandwidth", "group", "source", "step")),
    "annotation": ("", ("t.name_sid", "t.source", "t.frame_id", "t.step"), ("range", "origin", "source", "step")),
    "step": ("", ("t.step", "t.source"), ("step", "marked_by")),
}
_STRING_FIELDS = {"op", "inputs", "outputs", "module", "program", "compiled", "changed", "group", "range"}
_DURATION_SQL = {"step": "COALESCE(t.end_ns, t.start_ns) - t.start_ns"}


@dataclass
class LaneEvents:
    """Events of one lane drawn one by one (`lane`: the lane's index); times already on the common clock."""

    lane: int
    kind: str
    starts_ns: list[int]
    durs_ns: list[int]
    fields: tuple[str, ...]
    details: list[tuple[Any, ...]]


@dataclass
class LaneBins:
    """All events of a decimated lane merged into time bins (count and busy time per bin)."""

    lane: int
    kind: str
    bin_ns: int
    starts_ns: list[int]
    ends_ns: list[int]
    counts: list[int]
    busy_ns: list[int]


@dataclass
class TimelineData:
    """The lanes (in drawing order), the events drawn one by one of each lane, and the bins of the
    decimated lanes."""

    lanes: list[Lane]
    events: list[LaneEvents]
    bins: list[LaneBins]
    end_ns: int
    event_budget: int

    @property
    def total_events(self) -> int:
        return sum(lane.events for lane in self.lanes)

    @property
    def drawn_events(self) -> int:
        return sum(len(lane_events.starts_ns) for lane_events in self.events)

    def decimated(self, lane: int) -> bool:
        """Whether lane `lane` (an index into `lanes`) draws fewer events than it has."""
        return any(lane_bins.lane == lane for lane_bins in self.bins)


def _lane_specs(trace: Trace) -> list[_LaneSpec]:
    ranks = trace.ranks
    multi_rank = len(ranks) > 1
    specs: list[_LaneSpec] = []
    for rank in ranks:
        prefix = f"rank {rank} · " if multi_rank else ""
        by_rank = ("t.rank = ?", (rank,))
        specs.append(_LaneSpec(f"{prefix}steps", "step", rank, None, *by_rank))
        specs.append(_LaneSpec(f"{prefix}ranges", "annotation", rank, None, *by_rank))
        ops_lane = "device ops" if op_time_kind(trace, rank, programs_costed=False).device_ops else "host dispatch"
        specs.append(_LaneSpec(f"{prefix}{ops_lane}", "dispatch", rank, None, *by_rank))
        specs.append(_LaneSpec(f"{prefix}host compiles", "compile", rank, None, *by_rank))
        specs.append(_LaneSpec(f"{prefix}host syncs", "sync", rank, None, *by_rank))
        specs.append(_LaneSpec(f"{prefix}host fallbacks", "fallback", rank, None, *by_rank))
        chips = sorted(
            {chip for (chip,) in trace.sql("SELECT DISTINCT chip FROM executions WHERE rank = ?", (rank,)) if chip is not None}
            | {chip for (chip,) in trace.sql(
                "SELECT DISTINCT CASE WHEN dst_chip >= 0 THEN dst_chip ELSE src_chip END FROM transfers WHERE rank = ?",
                (rank,)) if chip is not None}
        )
        for chip in chips:
            specs.append(_LaneSpec(f"{prefix}tpu:{chip} programs", "program", rank, chip,
                                   "t.rank = ? AND t.chip = ?", (rank, chip)))
            specs.append(_LaneSpec(f"{prefix}tpu:{chip} transfers", "transfer", rank, chip,
                                   "t.rank = ? AND (CASE WHEN t.dst_chip >= 0 THEN t.dst_chip ELSE t.src_chip END) = ?",
                                   (rank, chip)))
        specs.append(_LaneSpec(f"{prefix}collectives", "collective", rank, None, *by_rank))
    return specs


def _budgets(counts: Sequence[int], total_budget: int) -> list[int]:
    """Split the event budget over lanes: small lanes get all their events, big ones share the rest."""
    budgets = [0] * len(counts)
    remaining = total_budget
    order = sorted(range(len(counts)), key=lambda index: counts[index])
    for position, index in enumerate(order):
        share = remaining // (len(order) - position)
        budgets[index] = min(counts[index], share)
        remaining -= budgets[index]
    return budgets


def prepare_timeline(
    trace: Trace, *, event_budget: int = TIMELINE_EVENT_BUDGET, bins_per_lane: int = TIMELINE_BINS_PER_LANE
) -> TimelineData:
    """Lanes per rank for the host and each chip, with level-of-detail decimation of busy lanes.

    A lane with more events than its share of `event_budget` draws its longest events one by one and
    all of its events as `bins_per_lane` time bins (count and busy time per bin).
    """
    offsets = rank_offsets(trace)
    bin_ns = {rank: max(1, -(-trace.wall_ns(rank=rank) // bins_per_lane)) for rank in trace.ranks}
    # One pass per lane bins its events (on the rank's clock, from 0) and so also counts them.
    binned = [(spec, _lane_bins(trace, spec, bin_ns.get(spec.rank, 1), offsets.get(spec.rank, 0))) for spec in _lane_specs(trace)]
    binned = [(spec, lane_bins) for spec, lane_bins in binned if lane_bins.counts]
    budgets = _budgets([sum(lane_bins.counts) for _, lane_bins in binned], event_budget)
    lanes: list[Lane] = []
    events: list[LaneEvents] = []
    bins: list[LaneBins] = []
    end_ns = 0
    for index, ((spec, lane_bins), budget) in enumerate(zip(binned, budgets)):
        count = sum(lane_bins.counts)
        offset = offsets.get(spec.rank, 0)
        joins, columns, fields = _LANE_DETAILS[spec.kind]
        duration = _DURATION_SQL.get(spec.kind, "COALESCE(t.dur_ns, 0)")
        query = (
            f"SELECT t.start_ns, {duration} AS d, {', '.join(columns)} FROM {LANE_TABLES[spec.kind]} t{joins} WHERE {spec.where}"
        )
        if budget < count:
            query += f" ORDER BY d DESC LIMIT {int(budget)}"
        rows = trace.sql(query, spec.params)
        rows.sort(key=lambda row: row[0])
        starts = [row[0] + offset for row in rows]
        durs = [max(row[1] or 0, 0) for row in rows]
        details = [_resolve_details(trace, fields, row[2:]) for row in rows]
        events.append(LaneEvents(index, spec.kind, starts, durs, fields, details))
        lanes.append(Lane(spec.name, spec.kind, spec.rank, spec.chip, count))
        end_ns = max(end_ns, max(lane_bins.ends_ns))
        if budget < count:
            lane_bins.lane = index
            bins.append(lane_bins)
    return TimelineData(lanes, events, bins, end_ns, event_budget)


def _lane_bins(trace: Trace, spec: _LaneSpec, bin_ns: int, offset: int) -> LaneBins:
    """A lane's events merged into bins of `bin_ns` (count, first start, last end, busy time per bin)."""
    duration = _DURATION_SQL.get(spec.kind, "COALESCE(t.dur_ns, 0)")
    rows = trace.sql(
        f"SELECT t.start_ns / ? AS b, COUNT(*), MIN(t.start_ns), MAX(t.start_ns + {duration}), SUM({duration}) "
        f"FROM {LANE_TABLES[spec.kind]} t WHERE {spec.where} GROUP BY b ORDER BY b",
        (bin_ns, *spec.params),
    )
    return LaneBins(
        -1, spec.kind, bin_ns,
        starts_ns=[row[2] + offset for row in rows], ends_ns=[row[3] + offset for row in rows],
        counts=[row[1] for row in rows], busy_ns=[row[4] or 0 for row in rows],
    )


def _resolve_details(trace: Trace, fields: tuple[str, ...], values: Sequence[Any]) -> tuple[Any, ...]:
    resolved: list[Any] = []
    for name, value in zip(fields, values):
        if name == "source":
            resolved.append(trace.frame(value))
        elif name in _STRING_FIELDS:
            resolved.append(trace.string(value))
        else:
            resolved.append(value)
    return tuple(resolved)

