"""Overview: the run's facts, step times with compile steps marked, where the time went, top findings."""

from __future__ import annotations

import os
import statistics
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from tputrace.analysis.context import steady
from tputrace.derived.op_time import OpTimeKind
from tputrace.derived.run_facts import RunFacts, run_facts
from tputrace.derived.steps import StepRow
from tputrace.summary import exit_text, no_device_ops_text, raised_line
from tputrace.tui import queries
from tputrace.tui.render import ChartBar, StepChart, fmt_bytes, fmt_ns, fmt_share, share_bar
from tputrace.tui.view import TraceView, palette_for
from tputrace.wording import plural

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.widget import Widget

TOP_FINDINGS = 5


def step_chart_title(measured_on: str) -> str:
    """The step chart's heading, naming where the steps' wall times were measured."""
    return f"Step time: the wall time of each step of the loop, measured on {measured_on}"


class OverviewView(TraceView):
    VIEW_ID = "overview"
    _data: queries.Overview | None = None

    def compose(self) -> ComposeResult:
        # The run's facts are cheap (no scan of the event tables), so the first paint shows them.
        facts = run_facts(self.session.trace, self.session.rank)
        with VerticalScroll(id="overview-scroll"):
            yield Static(facts_text(facts), id="overview-facts", classes="section")
            yield Static(Text(step_chart_title(facts.measured_on), style="bold"), classes="heading")
            yield Static(Text("loading…"), id="overview-chart", classes="section")
            yield Static(Text("Where the time went", style="bold"), classes="heading")
            yield Static(Text("loading…"), id="overview-split", classes="section")
            yield Static(Text("Top findings", style="bold"), classes="heading")
            yield Static(Text("analysing…"), id="overview-findings", classes="section")

    def primary(self) -> Widget | None:
        return self.query_one("#overview-scroll")

    def load(self) -> None:
        rank = self.session.rank
        self.request("main", lambda trace: queries.overview(trace, rank))
        session = self.session
        self.request("detail", lambda trace: session.findings(rank))

    def apply(self, slot: str, payload: Any) -> None:
        if slot == "main":
            self._show_overview(payload)
        else:
            self._show_findings(payload)
        if not self.pending:
            # The first screen is complete: aggregate the Ops view's groups while the user reads it.
            session, rank = self.session, self.session.rank
            self.prefetch("ops", lambda: session.op_groups(rank, "op"))

    def restyle(self) -> None:
        if self._data is not None:
            self._show_overview(self._data)

    def _show_overview(self, data: queries.Overview) -> None:
        self._data = data
        palette = palette_for(self.app)
        loop_steps = [step for step in data.steps if step.in_loop]  # as the report counts them (the timeline has all)
        self.query_one("#overview-facts", Static).update(facts_text(data.facts, data.compiles, len(loop_steps), data.op_count))
        bars = [ChartBar(step.dur_ns, step.compiles > 0, f"step {step.step}") for step in loop_steps]
        chart = StepChart(bars, height=6, palette=palette)
        self.query_one("#overview-chart", Static).update(Group(step_summary(loop_steps), projection_text(data), chart))
        self.query_one("#overview-split", Static).update(split_table(data.split, palette.bar, data.facts, data.op_time))

    def _show_findings(self, result: queries.FindingsResult) -> None:
        target = self.query_one("#overview-findings", Static)
        if result.unavailable:
            target.update(Text(result.unavailable, style="italic"))
            return
        if not result.findings:
            target.update(Text("no findings: the analysis found nothing to fix"))
            return
        lines = Text()
        for index, finding in enumerate(result.findings[:TOP_FINDINGS], start=1):
            if index > 1:
                lines.append("\n")
            lines.append(f"{index}. ", style="bold")
            lines.append(f"{finding.severity:<8} ", style=severity_style(finding.severity))
            lines.append(finding.title)
            lines.append(f"  ~{fmt_ns(finding.cost_total_ns)}", style="dim")
        if len(result.findings) > TOP_FINDINGS:
            lines.append(f"\n… {len(result.findings) - TOP_FINDINGS} more in Findings (key 2)", style="dim")
        target.update(lines)


def severity_style(severity: str) -> str:
    return {"critical": "bold red", "warning": "magenta"}.get(severity, "cyan")


def facts_text(facts: RunFacts, compiles: Any = None, step_count: int | None = None, op_count: int | None = None) -> Text:
    """The run's facts as plain text lines (every value from the trace shown literally); steps, compiles and the
    rank's ops once they are loaded (before, the file's ops)."""
    text = Text()
    command = " ".join([facts.script or "(unknown script)", *facts.argv])
    text.append(command, style="bold")
    rank_part = f"rank {facts.rank} of {len(facts.ranks)}" if len(facts.ranks) > 1 else "1 rank"
    machine = ", ".join(part for part in (facts.platform, plural(facts.chips, "chip") if facts.chips else None) if part)
    details = [rank_part, f"host {facts.host}" if facts.host else None, machine or None, facts.eager_modes, facts.versions or None]
    text.append("\n" + " · ".join(part for part in details if part))
    ops = facts.counts.get("ops", 0) if op_count is None else op_count
    state = exit_text(facts.exit_status) if facts.finished else "no end record (killed, or still running)"
    text.append(f"\nwall {fmt_ns(facts.wall_ns)} · ")
    if step_count is not None:
        text.append(f"{plural(step_count, 'step')} · ")
    text.append(f"{plural(ops, 'op')} · ")
    if compiles is not None:
        timed = "" if facts.imported and not compiles.total_ns else f" in {fmt_ns(compiles.total_ns)}"
        text.append(f"{plural(compiles.count, 'compile')}{timed} ({plural(compiles.recompiles, 'recompile')}) · ")
    text.append(state, style="" if facts.finished and not facts.exit_status else "bold red")
    if facts.error:
        text.append("\nthe script raised: ", style="bold red")
        text.append(raised_line(facts.error))
    window = facts.recording_window
    if window is not None:
        text.append("\n" + window.text, style="bold")
    compile_count = facts.counts.get("compiles", 0) if compiles is None else compiles.count
    banner = no_device_ops_text(ops, compile_count, imported=facts.imported, error=facts.error, window=window)
    if banner is not None:
        text.append("\n" + banner, style="bold red")
    events = sum(count for table, count in facts.counts.items() if table not in ("strings", "frames", "runs", "programs"))
    text.append(f"\n{os.path.basename(facts.path)} · {fmt_bytes(facts.size_bytes)} · {plural(events, 'event')}", style="dim")
    return text


def projection_text(data: queries.Overview) -> Text:
    """The median step as measured beside the one projected for the target chip, and the chip's pace where the host
    ran ahead of it."""
    median, projected, pace = data.facts.median_step_ns, data.projected, data.facts.chip_pace
    text = Text("")
    if median is not None and projected.median_ns is not None:
        text.append(f"median step {fmt_ns(median)} measured on {data.facts.measured_on} · chip time {fmt_ns(projected.median_ns)} "
                    f"projected for {projected.target} (roofline of XLA's costs, a lower bound)", style="dim")
    if pace is not None:
        text.append(("\n" if text.plain else "") + f"pace: {pace.text}", style="bold")
    return text


def step_summary(steps: list[StepRow]) -> Text:
    """The loop's step count, median steady step (as the report's), slowest step and compiled steps."""
    if not any(step.end_ns is not None for step in steps):
        return Text("")
    durations = [step.dur_ns for step in steady(steps) if step.end_ns is not None] or [
        step.dur_ns for step in steps if step.end_ns is not None]
    slowest = max(steps, key=lambda step: step.dur_ns)
    compiled = sum(1 for step in steps if step.compiles)
    return Text(f"{plural(len(steps), 'step')} · median {fmt_ns(statistics.median(durations))} · slowest: step {slowest.step} "
                f"({fmt_ns(slowest.dur_ns)}{', compiled' if slowest.compiles else ''}) · {plural(compiled, 'step')} compiled (c)")


def split_table(split: Any, bar_style: str, facts: RunFacts | None = None, op_time: OpTimeKind | None = None) -> Table:
    """Time per category with its share of wall time (categories overlap: chips run while the host dispatches), as
    the summary gives them: program execution as a share of the wall times the chips (and an XProf import's device
    op time and collectives, each chip's too, under that name), and an import of several profiling windows' shares
    of the windows' time, not of the gaps between them; an import's empty categories are left out."""
    table = Table.grid(padding=(0, 2))
    table.add_column()
    table.add_column(justify="right")
    table.add_column(justify="right")
    table.add_column()
    recorded_ns = facts.recorded_ns if facts is not None else None
    wall = recorded_ns or split.wall_ns or 1
    chips = max((facts.chips or 1) if facts is not None else 1, 1)
    device_ops = op_time is not None and op_time.device_ops
    per_chip = ("program execution", "host dispatch", "collectives") if device_ops else ("program execution",)
    imported = facts is not None and facts.imported
    # An imported capture's empty categories are ones it does not tell (compiles, syncs, fallbacks...): left out, as
    # the summary leaves them out, rather than shown as 0 ns.
    absent = [label for label, ns in split.parts() if imported and not ns]
    for label, ns in split.parts():
        if label in absent:
            continue
        share = ns / (wall * chips if label in per_chip else wall)
        shown = op_time.label if op_time is not None and label == "host dispatch" else label
        table.add_row(Text(shown), Text(fmt_ns(ns)), Text(fmt_share(share)), share_bar(share, 30, bar_style))
    overlap = "shares overlap: chips run while the host works" if facts is None or facts.chips else "shares overlap"
    table.add_row(Text("wall time", style="bold"), Text(fmt_ns(split.wall_ns), style="bold"), Text(""), Text(overlap, style="dim"))
    if recorded_ns:
        table.add_row(Text("profiled", style="bold"), Text(fmt_ns(recorded_ns), style="bold"), Text(""),
                      Text("shares are of the profiling windows' time, not the gaps between them", style="dim"))
    if absent:
        table.add_row(Text(""), Text(""), Text(""), Text(f"none in the capture: {', '.join(absent)}", style="dim"))
    if chips > 1:
        chips_parts = f"{op_time.label}, collectives and program execution" if op_time is not None and device_ops else "program execution"
        table.add_row(Text(""), Text(""), Text(""), Text(f"{chips_parts} as a share of the wall × {chips} chips", style="dim"))
    return table
