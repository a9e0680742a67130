"""Collectives: per kind and message size (count, time, bandwidth, waiting), and per rank; in a recorded run the times
are those a call was in flight (calls in flight together counted once, as in the summary), a call's mean its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.widgets import Static

from tputrace.derived.imported_sources import imported_source
from tputrace.tui import queries
from tputrace.tui.queries.collectives import collective_totals
from tputrace.tui.render import fmt_bytes, fmt_count, fmt_ns, fmt_rate, fmt_share, right, share_bar
from tputrace.tui.view import TraceView, palette_for
from tputrace.tui.widgets import StatusLine, TraceTable
from tputrace.wording import plural

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.widget import Widget

    from tputrace.store.reader import Trace


class CollectivesView(TraceView):
    VIEW_ID = "collectives"
    _payload: Any = None

    def compose(self) -> ComposeResult:
        yield StatusLine(Text("loading…"), id="collectives-status", classes="status")
        yield TraceTable(("kind", "kind"), ("size", "bytes"), ("count", "count"), ("collective time", "total"), ("mean collective", "mean"),
                         ("bus bandwidth", "bandwidth"), ("waiting", "wait"), ("wait share", "wait_share"),
                         optional=("mean", "bandwidth"), id="collectives-kinds")
        yield Static(Text("Per rank", style="bold"), classes="heading")
        yield TraceTable(("rank", "rank"), ("count", "count"), ("collective time", "total"), ("waiting", "wait"), ("wait share", "wait_share"),
                         ("", "bar"), ("bytes", "bytes"), id="collectives-ranks")

    def primary(self) -> Widget | None:
        return self.query_one("#collectives-kinds")

    def load(self) -> None:
        rank = self.session.rank
        self.request("main", lambda trace: (queries.collective_groups(trace, rank), queries.collective_ranks(trace),
                                            _waited_for(trace, rank), collective_totals(trace, rank)))

    def restyle(self) -> None:
        if self._payload is not None:
            self.apply("main", self._payload)

    def apply(self, slot: str, payload: Any) -> None:
        self._payload = payload
        groups, ranks, waited_for, totals = payload
        palette = palette_for(self.app)
        self.query_one("#collectives-kinds", TraceTable).show([
            (str(index), (Text(group.kind), right(_known(fmt_bytes, group.bytes)), right(fmt_count(group.count)),
                          right(fmt_ns(group.total_ns)), right(fmt_ns(group.mean_ns)), right(fmt_rate(group.bus_bandwidth)),
                          right(_known(fmt_ns, group.wait_ns)), right(_wait_share(group.wait_ns, group.total_ns))))
            for index, group in enumerate(groups)
        ])
        self.query_one("#collectives-ranks", TraceTable).show([
            (str(row.rank), (right(str(row.rank)), right(fmt_count(row.count)), right(fmt_ns(row.total_ns)),
                             right(_known(fmt_ns, row.wait_ns)), right(_wait_share(row.wait_ns, row.total_ns)),
                             share_bar((row.wait_ns or 0) / row.total_ns if row.total_ns else 0.0, 12, palette.bar),
                             right(_known(fmt_bytes, row.bytes))))
            for row in ranks
        ])
        if not ranks:
            self.say("collectives-status", "no collectives in this trace (a single-process run, or no torch.distributed calls)")
            return
        count, total, wait = totals.count, totals.total_ns, totals.wait_ns
        if wait is not None:
            waiting = f"{fmt_ns(wait)} waiting for {waited_for} ({fmt_share(wait / total) if total else '-'})"
        else:
            waiting = f"waiting for {waited_for} unknown (not measured in this trace)"
        parts: list[str | tuple[str, str]] = [f"rank {self.session.rank}: {plural(count, 'collective')}, {fmt_ns(total)}, {waiting}"]
        measured = [row for row in ranks if row.wait_ns is not None]
        if len(measured) > 1:
            least = min(measured, key=lambda row: row.wait_ns or 0)
            parts.append((f" · rank {least.rank} waits least: the others wait for it", "bold"))
        self.say("collectives-status", *parts)


def _waited_for(trace: Trace, rank: int) -> str:
    """Whom `rank`'s collectives wait for, by what the trace holds: an XProf import of several chips has a row per
    chip's call, each waiting for the other chips of its capture (`other chips`); rows of other ranks wait across
    ranks (`other ranks`); an import of several such captures holds both."""
    source = imported_source(trace, rank)
    chips = next((run.chips for run in trace.runs if run.rank == rank), None) or 1
    per_chip = source is not None and source.get("format") == "xplane" and chips > 1
    ((other_ranks,),) = trace.sql("SELECT COUNT(DISTINCT rank) > 1 FROM collectives")
    if per_chip:
        return "other chips and ranks" if other_ranks else "other chips"
    return "other ranks"


UNKNOWN = "unknown"
"""A figure the trace does not have (an imported capture's message sizes or waits), as the summary says it."""


def _known(format_value: Callable[[float], str], value: int | None) -> str:
    return UNKNOWN if value is None else format_value(value)


def _wait_share(wait_ns: int | None, total_ns: int) -> str:
    if wait_ns is None:
        return UNKNOWN
    return fmt_share(wait_ns / total_ns) if total_ns else "-"
