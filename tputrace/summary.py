"""The run summary: `summarize(trace)` computes it (pure data), `print_summary` renders it.

Rendering uses rich tables on a terminal and aligned plain text otherwise (pipes, files, CI logs).
Both renderers draw the same `Section`s, so they always show the same facts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from tputrace.analysis.imported import import_facts
from tputrace.analysis.target import DEFAULT_TARGET, capture_chip, target_chip, target_of
from tputrace.derived.chip_pace import ChipPace, chip_pace
from tputrace.derived.eager_modes import eager_mode_spans, eager_modes_text
from tputrace.derived.imported_sources import imported_source, measured_on, recorded_windows_ns
from tputrace.derived.kernel_launches import kernel_ns_by_line, kernel_ns_by_op
from tputrace.derived.kernels import KernelStat, top_kernels
from tputrace.derived.rank_lines import RankLine, rank_lines
from tputrace.derived.recording_window import RecordingWindow, recording_window
from tputrace.derived.run_endings import exit_text, raised_line, signal_note
from tputrace.derived.projection import CPU_ONLY_NOTE, PROJECTION_NOTE, ProjectedSteps, projected_steps
from tputrace.derived.steps import loop_step_durations, steady_median_ns
from tputrace.derived.op_ranking import CHIP_SHARE_LABEL, HOST_DISPATCH_LABEL, NOT_PROJECTED, RankedOp, rank_ops
from tputrace.derived.op_time import DEVICE_OP_TIME, op_time_kind
from tputrace.forks import ForkOrigin, started_by
from tputrace.summary_tables import Section, collectives_section, kernel_launch_sections, rank_section
from tputrace.summary_tables import percent as _percent, where as _where
from tputrace.store.aggregates import (
    CollectiveStat,
    CompileStats,
    FallbackStat,
    RecompileGroup,
    SyncStat,
    TimeSplit,
)
from tputrace.store.records import RunInfo, SourceLocation
from tputrace.store.replays import ReplayStats, replay_stats
from tputrace.wording import format_ns, plural, printable

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


@dataclass(frozen=True)
class RunSummary:
    """Everything the summary shows, for one rank of a trace."""

    trace_path: str
    rank: int
    ranks: tuple[int, ...]  # the distributed ranks (forked processes are in `forked`)
    run: RunInfo
    wall_ns: int
    step_count: int
    first_step_ns: int | None
    median_step_ns: int | None
    op_count: int
    time_split: TimeSplit
    projected: ProjectedSteps | None
    top_ops: tuple[RankedOp, ...]
    op_target: str | None
    compiles: CompileStats
    top_recompiles: tuple[RecompileGroup, ...]
    sync_count: int
    sync_ns: int
    top_syncs: tuple[SyncStat, ...]
    fallback_count: int
    fallback_ns: int
    top_fallbacks: tuple[FallbackStat, ...]
    collectives: tuple[CollectiveStat, ...]
    forked: tuple[ForkedProcess, ...] = ()
    recording_window: RecordingWindow | None = None  # the steps a `--steps`/`--schedule`/`--from-code` run kept (None: all)
    imported: bool = False  # written by `tputrace import` from another tool's capture
    imported_device: str | None = None  # the device an imported rank's times were measured on (cpu, gpu, tpu, host)
    collectives_without_bytes: frozenset[str] = frozenset()  # kinds whose bytes the (imported) capture does not have
    collectives_without_waits: frozenset[str] = frozenset()  # kinds of an imported rank whose waits nothing measured
    device_ops: bool = False  # the ops are XLA ops' device times (an XProf import), not host dispatch
    # An imported log's compiles by their own ids (tlparse's `0/1`), longest first, and the compiles that failed.
    top_compiles: tuple[CompileEntry, ...] = ()
    compile_failures: tuple[CompileEntry, ...] = ()
    top_kernels: tuple[KernelStat, ...] = ()  # an imported GPU capture's kernels, by device time
    captured_on: str | None = None  # an imported capture's device name and torch.distributed rank
    # An imported GPU capture's device time of the kernels each op (by name) and each line's ops launched.
    op_kernel_ns: dict[str, int] = dataclasses.field(default_factory=dict)
    kernel_lines: tuple[tuple[SourceLocation, int], ...] = ()
    rank_lines: tuple[RankLine, ...] = ()  # a line per rank, for a trace of several
    eager_modes: str | None = None  # the modes the ops ran in, in order (`run.eager_mode` is the last)
    replay: ReplayStats | None = None  # DeferAndFuse's step replay over the flushes (None: not recorded)
    chip_pace: ChipPace | None = None  # the chip's time per step where the host ran ahead of it (None: it did not)
    recorded_ns: int | None = None  # an import's profiling windows' time, without the gaps between them (None: one window)
    rank_chips: tuple[int | None, ...] = ()  # each of `ranks`' own chips, from its run row (None: unknown)

    @property
    def measured_on(self) -> str:
        """Where the trace's times were measured: this host, or an imported capture's device."""
        return measured_on(self.imported_device)


@dataclass(frozen=True)
class ForkedProcess:
    """A process forked during the recording (its own rank in the trace) and what it recorded."""

    origin: ForkOrigin
    op_count: int
    compile_count: int
    exit_status: int | None
    finished: bool


def forked_processes(trace: Trace) -> tuple[ForkedProcess, ...]:
    """The trace's forked processes, in rank order."""
    runs = {run.rank: run for run in trace.runs}
    forked = []
    for rank, origin in sorted(trace.forked_ranks.items()):
        run = runs.get(rank)
        forked.append(
            ForkedProcess(
                origin,
                trace.count("ops", where="rank = ?", params=(rank,)),
                trace.count("compiles", where="rank = ?", params=(rank,)),
                run.exit_status if run else None,
                bool(run and run.finished),
            )
        )
    return tuple(forked)


@dataclass(frozen=True)
class CompileEntry:
    """One compile as an imported log names it: its id, what it compiled, where, how long, and what it notes."""

    compile_id: str
    name: str
    source: SourceLocation | None
    dur_ns: int
    notes: str
    failure: str | None = None  # what failed (`BackendCompilerFailed: ...`), for a compile that did


def compile_entries(trace: Trace, rank: int) -> list[CompileEntry]:
    """The compiles of `rank` whose capture gave them ids (a `TORCH_TRACE` log's, torch.profiler's), in time order,
    each with its notes: a recompile, a failure and its reason, a compile cache hit, a restart."""
    entries = []
    for name_sid, frame_id, dur_ns, reason, text in trace.sql(
        "SELECT name_sid, frame_id, dur_ns, reason, detail FROM compiles WHERE rank = ? AND detail LIKE '%\"compile_id\"%' "
        "ORDER BY start_ns, id", (rank,)):
        try:
            detail = json.loads(text or "{}")
        except ValueError:
            continue
        if not isinstance(detail, dict):
            continue
        notes = ["recompile"] if reason == "recompile" else []
        failure = None
        if detail.get("fail_type") or detail.get("compile_failed"):
            failure = ": ".join(str(part) for part in (detail.get("fail_type"), detail.get("fail_reason")) if part)
            notes.append(f"failed ({failure or '?'})")
        cache = detail.get("cache")
        if isinstance(cache, dict):
            notes += [f"{'FX graph' if kind == 'fx_graph' else 'AOTAutograd'} cache {outcome}"
                      for kind, outcome in sorted(cache.items(), reverse=True)]
        if detail.get("attempt"):
            notes.append(f"attempt {detail['attempt']}")
        entries.append(CompileEntry(str(detail["compile_id"]) or "-", trace.string(name_sid) or "?",
                                    trace.frame(frame_id), int(dur_ns or 0), ", ".join(notes), failure))
    return entries


def summarize(trace: Trace, *, rank: int | None = None, top: int = 10) -> RunSummary:
    """The summary of `rank` (default: rank 0, or the first rank) of `trace`."""
    chosen_rank = trace.run.rank if rank is None else rank
    runs = trace.runs
    run = next((candidate for candidate in runs if candidate.rank == chosen_rank), trace.run)
    chips_by_rank = {candidate.rank: candidate.chips for candidate in runs}
    # The loop's steps: the trailing `end` step is the work after the last optimizer step (an evaluation, saving).
    step_durations = loop_step_durations(trace, chosen_rank)
    fallbacks = trace.fallback_stats(rank=chosen_rank)
    syncs = trace.sync_stats(rank=chosen_rank)
    captured = capture_chip(trace, chosen_rank)  # an imported TPU capture's own chip
    chip = target_of(captured) if captured is not None else target_chip(DEFAULT_TARGET)
    ranking = rank_ops(trace, chosen_rank, chip)
    projected = projected_steps(trace, chosen_rank, chip)
    facts = import_facts(trace, chosen_rank)
    op_time = op_time_kind(trace, chosen_rank, bool(projected.programs_costed))
    entries = compile_entries(trace, chosen_rank) if trace.meta.get("imported") else []
    return RunSummary(
        trace_path=str(trace.path),
        rank=chosen_rank,
        ranks=tuple(trace.distributed_ranks),
        rank_chips=tuple(chips_by_rank.get(rank) for rank in trace.distributed_ranks),
        run=run,
        wall_ns=trace.wall_ns(rank=chosen_rank),
        recorded_ns=recorded_windows_ns(trace, chosen_rank),
        step_count=len(step_durations),
        first_step_ns=step_durations[0] if step_durations else None,
        median_step_ns=steady_median_ns(step_durations),
        op_count=trace.count("ops", where="rank = ?", params=(chosen_rank,)),
        time_split=trace.time_split(rank=chosen_rank),
        projected=projected if projected.programs_costed else None,
        # An import's kernels are programs without ops: no row of 0 calls for them.
        top_ops=tuple(op for op in ranking.top(top) if op.calls or facts is None or (ranking.target is not None and projected.programs_costed)),
        # A TPU capture's device op times are its chip's: no projection beside them.
        op_target=ranking.target if op_time.chip_share else None,
        compiles=trace.compile_stats(rank=chosen_rank),
        top_recompiles=tuple(trace.recompile_groups(limit=min(top, 5), rank=chosen_rank)),
        sync_count=sum(stat.count for stat in syncs),
        sync_ns=sum(stat.total_ns for stat in syncs),
        top_syncs=tuple(syncs[:top]),
        fallback_count=sum(stat.count for stat in fallbacks),
        fallback_ns=sum(stat.total_ns for stat in fallbacks),
        top_fallbacks=tuple(fallbacks[:top]),
        collectives=tuple(trace.collective_stats(rank=chosen_rank)),
        forked=forked_processes(trace),
        recording_window=recording_window(trace),
        imported=bool(trace.meta.get("imported")),
        imported_device=facts.device if facts is not None else None,
        device_ops=op_time.device_ops,
        captured_on=_captured_on(imported_source(trace, chosen_rank) if facts is not None else None),
        collectives_without_bytes=frozenset(kind for (kind,) in trace.sql(
            "SELECT DISTINCT kind FROM collectives WHERE rank = ? AND bytes IS NULL", (chosen_rank,))),
        # An import fills waits only where it has every member's capture (`tputrace.importers.collective_waits`).
        collectives_without_waits=frozenset(kind for (kind,) in trace.sql(
            "SELECT kind FROM collectives WHERE rank = ? GROUP BY kind HAVING COUNT(wait_ns) = 0", (chosen_rank,)))
        if facts is not None else frozenset(),
        top_compiles=tuple(sorted(entries, key=lambda entry: -entry.dur_ns)[:top]),
        compile_failures=tuple(entry for entry in entries if entry.failure is not None),
        top_kernels=top_kernels(trace, chosen_rank, top) if facts is not None else (),
        op_kernel_ns=kernel_ns_by_op(trace, chosen_rank) if facts is not None else {},
        kernel_lines=tuple(kernel_ns_by_line(trace, chosen_rank, top)) if facts is not None else (),
        rank_lines=rank_lines(trace),
        eager_modes=eager_modes_text(eager_mode_spans(trace, run)),
        replay=replay_stats(trace, rank=chosen_rank),
        chip_pace=chip_pace(trace, chosen_rank),
    )


# -- sections -------------------------------------------------------------------------------------


NO_DEVICE_OPS_TEXT = (
    "NO OP RAN ON THE TPU DEVICE: nothing was traced (the script's tensors stayed on the CPU; "
    "a script written for CUDA runs on tpu with `tputrace run --as-cuda`)"
)
NO_DEVICE_OPS_BEFORE_ERROR_TEXT = "NO OP RAN ON THE TPU DEVICE: the script raised before any op reached it, so nothing was traced"


def no_device_ops_text(op_count: int, compile_count: int, *, imported: bool, error: str | None,
                       window: RecordingWindow | None) -> str | None:
    """The banner every view leads with when no op reached the tpu device, or None: not for an import (its run was
    never on the device) nor for a recording window that never opened; a run that raised first says so."""
    if op_count or compile_count or imported or (window is not None and not window.recorded_steps):
        return None
    return NO_DEVICE_OPS_BEFORE_ERROR_TEXT if error else NO_DEVICE_OPS_TEXT


def _captured_on(source: dict[str, Any] | None) -> str | None:
    """What an imported capture says of its process: its device's name and its torch.distributed rank
    (`NVIDIA A100-SXM4-80GB, distributed rank 3 of 8`)."""
    if not source:
        return None
    rank, world = source.get("distributed_rank"), source.get("distributed_world_size")
    parts = [str(source["device_name"]) if source.get("device_name") else None,
             (f"distributed rank {rank}" + (f" of {world}" if world is not None else "")) if rank is not None else None]
    return ", ".join(part for part in parts if part) or None


def _chips_text(chips: int | None, summary: RunSummary) -> str | None:
    """The chips the run had: in a trace of several ranks, each rank's process's (`--nproc 2 --chips 2` gives each of
    its 2 processes 2 chips, 4 in all), which a bare "2 chips" beside "rank 0 of 2" leaves open. None where unknown or
    where there were none (a CPU-only capture)."""
    if not chips:
        return None
    if summary.rank not in summary.ranks or len(summary.ranks) < 2:
        return plural(chips, "chip")
    if None in summary.rank_chips or len(summary.rank_chips) != len(summary.ranks):  # a rank's chips unknown
        return f"{plural(chips, 'chip')} on this rank"
    in_all = sum(count or 0 for count in summary.rank_chips)
    each = " per rank" if set(summary.rank_chips) == {chips} else " on this rank"
    return plural(chips, "chip") + each + (f" ({in_all} in all)" if in_all > len(summary.ranks) else "")


def header_lines(summary: RunSummary) -> list[tuple[str, str]]:
    """(label, text) lines above the sections: what ran, how it ended, where the time went overall."""
    run = summary.run
    command = " ".join([os.path.basename(run.script) if run.script else "?", *run.argv])
    machine = ", ".join(part for part in (run.platform, _chips_text(run.chips, summary), summary.eager_modes) if part)
    if summary.rank not in summary.ranks:
        ranks: str | None = f"rank {summary.rank} (a forked process)"
    else:
        ranks = f"rank {summary.rank} of {len(summary.ranks)}" if len(summary.ranks) > 1 else None
    if not run.finished:
        ending = "no end record (still running, or killed)"
    elif run.error and run.exit_status is not None:
        ending = f"exit {run.exit_status}, raised {raised_line(run.error)}"
    else:
        ending = exit_text(run.exit_status)
    steps = f"{summary.step_count} steps"
    if summary.step_count > 2:
        steps += f" (first {format_ns(summary.first_step_ns)}, then median {format_ns(summary.median_step_ns)})"
    elif summary.step_count == 2:  # too few steps to leave the first out: the median is of both (`steady_median_ns`)
        steps += f" (first {format_ns(summary.first_step_ns)}; median of both {format_ns(summary.median_step_ns)})"
    elif summary.step_count == 1:
        steps = f"1 step ({format_ns(summary.first_step_ns)})"
    compiles = summary.compiles
    loaded = f"; {compiles.loaded_from_disk} loaded from the compile cache" if compiles.loaded_from_disk else ""
    totals = f"{plural(summary.op_count, 'op')} · {plural(compiles.count, 'compile')} ({plural(compiles.recompiles, 'recompile')}{loaded})"
    lines = [
        ("run", " · ".join(part for part in (command, ranks, machine, summary.captured_on, ending) if part)),
        ("wall", f"{format_ns(summary.wall_ns)} · {steps} · {totals}"),
    ]
    if summary.chip_pace is not None:
        lines.append(("pace", summary.chip_pace.text))
    window = summary.recording_window
    if window is not None:
        lines.append(("window", window.text))
    if summary.replay is not None:
        lines.append(("replay", summary.replay.text))
    projected = summary.projected
    if projected is not None and projected.median_ns is not None and summary.median_step_ns is not None:
        lines.append(("chip", f"median step {format_ns(summary.median_step_ns)} measured on {summary.measured_on} · "
                              f"{format_ns(projected.median_ns)} projected for {projected.target} from {PROJECTION_NOTE}"))
    if summary.imported_device is not None:
        lines.append(("note", _imported_note(summary.imported_device, projected is not None, summary.device_ops)))
    elif run.platform == "cpu":
        lines.append(("note", CPU_ONLY_NOTE))
    lines.append(("trace", summary.trace_path))
    banner = no_device_ops_text(summary.op_count, compiles.count, imported=summary.imported, error=run.error, window=window)
    if banner is not None:
        lines.insert(0, ("!!", banner))
    return lines


# What an XProf import's ops are: XLA ops' self times on the device (each op's time less the ops nested in it).
DEVICE_OPS_LABEL = DEVICE_OP_TIME


def _imported_note(device: str, projected: bool, device_ops: bool = False) -> str:
    """What an imported rank's times are: measured on the capture's device; a TPU's projected only from XLA's costs."""
    if device == "tpu":
        return "the times are the capture's, measured on its TPU"
    where = f"its {device}" if device_ops or not _host_ops_beside(device) else f"its host (ops) and its {device} (kernels)"
    return (f"the times are the capture's, measured on {where}, not a TPU's; "
            + ("chip time on a TPU is projected from its programs' XLA costs" if projected
               else "it has no XLA costs, so no TPU time is projected from it"))


def _host_ops_beside(device: str | None) -> bool:
    """Whether an imported rank's ops are host dispatch timed on the host beside the device its kernels ran on (a
    GPU's torch.profiler capture), not on the device itself."""
    return device not in (None, "cpu", "host", "tpu")


def sections(summary: RunSummary) -> list[Section]:
    """The summary's tables, skipping those with nothing to show."""
    # An import of several profiling windows: shares of the windows' time, not of the unrecorded gaps between them.
    wall = summary.recorded_ns or summary.wall_ns
    op_label = DEVICE_OPS_LABEL if summary.device_ops else "host dispatch"
    # Program execution is each chip's time with a program in flight, and an XProf import's ops and collectives are
    # each chip's too: a share of the wall of all the chips.
    chips = summary.run.chips or 1
    per_chip = (("program execution", "host dispatch", "collectives") if summary.device_ops
                else ("program execution",)) if chips > 1 else ()
    split_rows = tuple((op_label if label == "host dispatch" else label, format_ns(ns),
                        _percent(ns, wall * chips if label in per_chip else wall))
                       for label, ns in summary.time_split.parts() if ns)
    split_title = ("% of wall" if wall == summary.wall_ns else f"% of the profiling windows' {format_ns(wall)}, "
                   f"not the {format_ns(summary.wall_ns - wall)} between them") + "; categories overlap" + (f"; the chips' as % of wall × {chips} chips" if per_chip else "")
    kernel_ns = summary.op_kernel_ns
    device_label = f"{summary.imported_device or 'device'} time of its kernels"
    result = [rank_section(summary.rank_lines, summary.rank)] if summary.rank_lines else []
    result += [
        Section(
            f"time split ({split_title})", ("category", "time", "share"), split_rows, (False, True, True)
        ),
        Section(
            f"top ops by {DEVICE_OPS_LABEL if summary.device_ops else HOST_DISPATCH_LABEL}, measured on "
            + (measured_on("host") if _host_ops_beside(summary.imported_device) and not summary.device_ops
               else summary.measured_on)
            + (f" · {CHIP_SHARE_LABEL}, projected for {summary.op_target} by a roofline" if summary.op_target else "")
            + (f" · {device_label}, measured on {summary.measured_on}" if kernel_ns else ""),
            ("op", "calls", op_label, "share", device_label if kernel_ns else CHIP_SHARE_LABEL),
            tuple(
                (
                    printable(stat.op),
                    f"{stat.calls:,}",
                    format_ns(stat.self_dispatch_ns),
                    f"{100 * stat.self_dispatch_share:.1f}%",
                    (f"{100 * stat.chip_share:.1f}%" if stat.projected else NOT_PROJECTED) if summary.op_target
                    else format_ns(kernel_ns[stat.op]) if stat.op in kernel_ns else "-",
                )
                for stat in summary.top_ops
            ),
            (False, True, True, True, True),
        ),
    ]
    if summary.imported and not summary.op_target and not kernel_ns:  # an import's ops with nothing beside them
        ops = result[-1]
        result[-1] = dataclasses.replace(ops, columns=ops.columns[:-1], rows=tuple(row[:-1] for row in ops.rows),
                                         numeric=ops.numeric[:-1])
    if summary.top_kernels:
        result.append(
            Section(
                f"top kernels by device time, measured on {summary.measured_on}",
                ("kernel", "calls", "device time", "share"),
                tuple((printable(stat.name), f"{stat.calls:,}", format_ns(stat.total_ns), f"{100 * stat.share:.1f}%")
                      for stat in summary.top_kernels),
                (False, True, True, True),
            )
        )
    result += kernel_launch_sections(summary.op_kernel_ns, summary.kernel_lines, summary.imported_device,
                                     summary.measured_on, len(summary.top_ops) or 10)
    compiles = summary.compiles
    if summary.top_recompiles:
        recompile_lines: list[str] = []
        for group in summary.top_recompiles:
            recompile_lines.append(
                f"{group.count}× {group.name or '?'} ({group.reason or '?'}), {format_ns(group.total_ns)}, "
                f"first {f'in step {group.first_step} ' if summary.step_count else ''}at {_where(group.source)}"
            )
            if group.diff:
                # A Dynamo guard failure goes on with the guard's user stack, line by line: the first line says it.
                recompile_lines.append(f"   changed: {' '.join(group.diff.split(chr(10), 1)[0].split())}")
        result.append(
            Section(
                f"recompiles: {compiles.recompiles} of {plural(compiles.count, 'compile')}, "
                f"{format_ns(compiles.recompile_ns)} of {format_ns(compiles.total_ns)}",
                lines=tuple(recompile_lines),
            )
        )
    if summary.top_compiles:
        result.append(
            Section(
                f"compiles by id, longest first ({len(summary.top_compiles)} of {compiles.count})",
                ("id", "compiled", "at", "time", "notes"),
                tuple((entry.compile_id, printable(entry.name), _where(entry.source), format_ns(entry.dur_ns),
                       entry.notes or "-") for entry in summary.top_compiles),
                (False, False, False, True, False),
            )
        )
    if summary.compile_failures:
        result.append(
            Section(
                f"compile failures: {len(summary.compile_failures)}",
                lines=tuple(f"{entry.compile_id} {printable(entry.name)} at {_where(entry.source)}: {entry.failure or '?'}"
                            for entry in summary.compile_failures),
            )
        )
    if summary.top_syncs:
        result.append(
            Section(
                f"host syncs: {plural(summary.sync_count, 'stall')}, {format_ns(summary.sync_ns)}",
                ("where", "kind", "count", "stall", "of it compiling", "pending ops"),
                tuple(
                    (
                        _where(stat.source),
                        stat.kind or "?",
                        f"{stat.count}",
                        format_ns(stat.total_ns),
                        format_ns(stat.compile_ns) if stat.compile_ns else "-",
                        f"{stat.pending_ops:,}",
                    )
                    for stat in summary.top_syncs
                ),
                (False, False, True, True, True, True),
            )
        )
    if summary.top_fallbacks:
        result.append(
            Section(
                f"CPU fallbacks: {plural(summary.fallback_count, 'call')}, {format_ns(summary.fallback_ns)}",
                ("op", "count", "time", "first seen"),
                tuple(
                    (stat.op or "?", f"{stat.count}", format_ns(stat.total_ns), _where(stat.source))
                    for stat in summary.top_fallbacks
                ),
                (False, True, True, False),
            )
        )
    if summary.collectives:
        result.append(collectives_section(summary.collectives, summary.collectives_without_bytes, summary.collectives_without_waits,
                                          calls_once=not summary.imported))
    if summary.forked:
        result.append(Section(f"forked processes: {len(summary.forked)}", lines=tuple(_forked_line(process) for process in summary.forked)))
    return [section for section in result if section.rows or section.lines]


def _forked_line(process: ForkedProcess) -> str:
    origin = process.origin
    recorded = f"{plural(process.op_count, 'op')}, {plural(process.compile_count, 'compile')}"
    if process.finished:
        ending = exit_text(process.exit_status)
    elif process.exit_status is None:
        ending = "no end record (it was killed, called os._exit off its main thread or _exit from C, or outlived the recording): its last ops may be missing"
    else:  # a command killed by a signal, its status written by the process that waited on it
        ending = f"{exit_text(process.exit_status)}{signal_note(process.exit_status)} without an end record: its last ops may be missing"
    return f"rank {origin.rank}: process {origin.pid}, {started_by(origin)} rank {origin.parent_rank} (process {origin.parent_pid}): {recorded}, {ending}"


# -- rendering ------------------------------------------------------------------------------------


def render_text(summary: RunSummary) -> str:
    """The summary as aligned plain text."""
    lines = [f"{label:<6} {text}" for label, text in header_lines(summary)]
    for section in sections(summary):
        lines.append("")
        lines.append(section.title)
        lines.extend(f"  {line}" for line in section.lines)
        if not section.columns:
            continue
        widths = [
            max(len(cell) for cell in (section.columns[index], *(row[index] for row in section.rows)))
            for index in range(len(section.columns))
        ]
        for row in (section.columns, *section.rows):
            cells = [
                cell.rjust(width) if numeric else cell.ljust(width)
                for cell, width, numeric in zip(row, widths, section.numeric)
            ]
            lines.append(("  " + "  ".join(cells)).rstrip())
    return "\n".join(lines) + "\n"


def print_summary(summary: RunSummary, file: TextIO | None = None) -> None:
    """Print the summary: rich tables when `file` is a terminal, plain text otherwise."""
    out = sys.stdout if file is None else file
    if not out.isatty():
        out.write(printable(render_text(summary)))
        out.flush()
        return
    from rich.console import Console
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    console = Console(file=out, highlight=False)
    for label, text in header_lines(summary):
        console.print(Text.assemble((f"{label:<6} ", "bold"), printable(text)))
    for section in sections(summary):
        console.print()
        console.print(Text(section.title, style="bold"))
        if section.lines:
            for line in section.lines:
                console.print(Padding(Text(printable(line)), (0, 0, 0, 2), expand=False))
            continue
        table = Table(box=None, padding=(0, 1), header_style="dim", pad_edge=False)
        wrapping = _widest_text_column(section)
        for index, (column, numeric) in enumerate(zip(section.columns, section.numeric)):
            # Only the widest text column wraps on a narrow terminal; the others stay on one line.
            table.add_column(column, justify="right" if numeric else "left", overflow="fold", no_wrap=index != wrapping)
        for row in section.rows:
            table.add_row(*(Text(printable(cell)) for cell in row))
        console.print(Padding(table, (0, 0, 0, 2), expand=False))


def _widest_text_column(section: Section) -> int | None:
    text_columns = [index for index, numeric in enumerate(section.numeric) if not numeric]
    if not text_columns:
        return None
    return max(text_columns, key=lambda index: max(len(row[index]) for row in section.rows))
