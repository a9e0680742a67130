"""DeferAndFuse flushes for the TUI: flushes by trigger, one page of flushes, and what one flush ran
(its ops and its program's XLA fusions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tputrace.derived.text import shown
from tputrace.store.records import SourceLocation

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


@dataclass(frozen=True)
class TriggerStat:
    """Flushes with one trigger."""

    trigger: str
    count: int
    total_ns: int
    ops: int
    cache_hits: int


def flush_triggers(trace: Trace, rank: int) -> list[TriggerStat]:
    rows = trace.sql(
        "SELECT trigger, COUNT(*), COALESCE(SUM(dur_ns), 0) AS total_ns, COALESCE(SUM(n_ops), 0), "
        "COALESCE(SUM(cache_hit), 0) FROM flushes WHERE rank = ? GROUP BY trigger ORDER BY total_ns DESC",
        (rank,),
    )
    return [TriggerStat(shown(trigger) or "?", count, total_ns, ops, hits) for trigger, count, total_ns, ops, hits in rows]


FlushOrder = Literal["time", "duration"]


@dataclass(frozen=True)
class FlushRow:
    """One DeferAndFuse flush."""

    id: int
    step: int
    start_ns: int
    dur_ns: int
    trigger: str
    n_ops: int
    cache_hit: bool
    input_bytes: int
    output_bytes: int
    program_id: int | None
    program: str | None
    source: SourceLocation | None


def flush_rows(trace: Trace, rank: int, *, order: FlushOrder = "time", offset: int = 0, limit: int = 500) -> list[FlushRow]:
    """One page of the flushes of `rank`, in time order or longest first."""
    order_sql = "f.start_ns, f.id" if order == "time" else "f.dur_ns DESC, f.id"
    rows = trace.sql(
        "SELECT f.id, f.step, f.start_ns, f.dur_ns, f.trigger, f.n_ops, f.cache_hit, f.input_bytes, f.output_bytes, "
        "f.program_id, p.name_sid, f.frame_id FROM flushes AS f LEFT JOIN programs AS p ON p.id = f.program_id "
        f"WHERE f.rank = ? ORDER BY {order_sql} LIMIT ? OFFSET ?",
        (rank, int(limit), int(offset)),
    )
    return [
        FlushRow(flush_id, step, start_ns, dur_ns or 0, shown(trigger) or "?", n_ops or 0, bool(cache_hit), in_bytes or 0,
                 out_bytes or 0, program_id, trace.string(name_sid), trace.frame(frame_id))
        for flush_id, step, start_ns, dur_ns, trigger, n_ops, cache_hit, in_bytes, out_bytes, program_id, name_sid, frame_id in rows
    ]


@dataclass(frozen=True)
class FusionRow:
    """One of XLA's fusions in a program."""

    name: str
    kind: str
    hlo_ops: str
    aten_ops: str


@dataclass(frozen=True)
class FlushContents:
    """What one flush ran: its ops (first `limit`, in dispatch order) and its program's XLA fusions."""

    flush_id: int
    ops: list[tuple[int, str, str, SourceLocation | None]]
    more_ops: int
    fusions: list[FusionRow]


def flush_contents(trace: Trace, flush_id: int, program_id: int | None, rank: int, *, limit: int = 300) -> FlushContents:
    rows = trace.sql(
        "SELECT seq, op_sid, inputs_sid, frame_id FROM ops WHERE rank = ? AND flush_id = ? ORDER BY seq LIMIT ?",
        (rank, flush_id, int(limit) + 1),
    )
    ops = [(seq, trace.string(op_sid) or "?", trace.string(inputs_sid) or "", trace.frame(frame_id))
           for seq, op_sid, inputs_sid, frame_id in rows[:limit]]
    more = 0
    if len(rows) > limit:
        (total,) = trace.sql("SELECT COUNT(*) FROM ops WHERE rank = ? AND flush_id = ?", (rank, flush_id))[0]
        more = total - limit
    fusions = []
    if program_id is not None:
        fusions = [
            FusionRow(trace.string(name_sid) or "?", trace.string(kind_sid) or "?", trace.string(ops_sid) or "",
                      trace.string(aten_sid) or "")
            for name_sid, kind_sid, ops_sid, aten_sid in trace.sql(
                "SELECT name_sid, kind_sid, ops_sid, aten_sid FROM fusions WHERE program_id = ? ORDER BY rowid", (program_id,)
            )
        ]
    return FlushContents(flush_id, ops, more, fusions)

