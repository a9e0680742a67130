"""The summary's `Section` (a titled table or lines), and the tables only some traces have: a line per rank for a
trace of several (`tputrace.derived.rank_lines`), so that the slow rank, the idle one or the one waiting in
collectives shows without a summary per `--rank`; the collectives by kind; and an imported GPU capture's ops and lines
by the kernel time they launched (`tputrace.derived.kernel_launches`)."""

from __future__ import annotations

from dataclasses import dataclass

from tputrace.derived.rank_lines import RankLine
from tputrace.store.aggregates import CollectiveStat
from tputrace.store.records import SourceLocation
from tputrace.wording import format_bytes, format_ns, plural, printable


@dataclass(frozen=True)
class Section:
    """A titled table (`numeric` marks right-aligned columns), or titled lines when it has no columns."""

    title: str
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    numeric: tuple[bool, ...] = ()
    lines: tuple[str, ...] = ()


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def where(source: SourceLocation | None) -> str:
    return source.short if source else "?"


def rank_section(lines: tuple[RankLine, ...], shown_rank: int) -> Section:
    """The ranks' table; its title says whose the other tables are. A column no rank has anything in (the steps of
    `TORCH_TRACE` logs, the collectives of one process's captures) is left out."""
    medians = [line.median_step_ns for line in lines if line.median_step_ns]
    fastest = min(medians) if medians else None
    columns = ("rank", "", "wall", "steps", "median step", "vs fastest", "compiles", "compiling", "device busy",
               "collectives", "top collective")
    rows = [
        (
            f"{line.rank}{' *' if line.rank == shown_rank else ''}",
            printable(line.label),
            format_ns(line.wall_ns),
            f"{line.steps}" if line.steps else "-",
            format_ns(line.median_step_ns) if line.median_step_ns else "-",
            f"+{100 * (line.median_step_ns / fastest - 1):.1f}%" if line.median_step_ns and fastest else "-",
            (f"{line.compiles}" + (f" ({plural(line.recompiles, 'recompile')})" if line.recompiles else "")) if line.compiles else "-",
            format_ns(line.compile_ns) if line.compile_ns else "-",
            percent(line.busy_ns, line.wall_ns) if line.busy_ns else "-",
            format_ns(line.collective_ns) if line.collective_ns else "-",
            f"{line.top_collective} {format_ns(line.top_collective_ns)}" if line.top_collective else "-",
        )
        for line in lines
    ]
    kept = [index for index in range(len(columns)) if index < 3 or any(row[index] != "-" for row in rows)]
    numeric = (False, False, True, True, True, True, True, True, True, True, False)
    return Section(f"ranks: {len(lines)} (* the rank the other tables show; `tputrace summary --rank N` for another)",
                   tuple(columns[index] for index in kept), tuple(tuple(row[index] for index in kept) for row in rows),
                   tuple(numeric[index] for index in kept))


def collectives_section(stats: tuple[CollectiveStat, ...], without_bytes: frozenset[str], without_waits: frozenset[str], *,
                        calls_once: bool) -> Section:
    """The shown rank's collectives by kind. A recorded run's time and waiting count calls in flight together once (the
    time any call of the kind was in flight, and the time any waited for the last rank to arrive), so neither exceeds
    the rank's wall time; an import's are its calls' sums (its rows may be several chips')."""
    title = ("collectives (time: any call of the kind in flight; waiting: any call of it waiting for the last rank to arrive)"
             if calls_once else "collectives (time and waiting: the calls' sums)")
    return Section(
        title,
        ("kind", "count", "bytes", "time", "waiting for last rank"),
        tuple(
            (
                stat.kind or "?",
                f"{stat.count}",
                "unknown" if stat.kind in without_bytes else format_bytes(stat.bytes),
                format_ns(stat.total_ns),
                "unknown" if stat.kind in without_waits else format_ns(stat.wait_ns),
            )
            for stat in stats
        ),
        (False, True, True, True, True),
    )


def kernel_launch_sections(op_kernel_ns: dict[str, int], kernel_lines: tuple[tuple[SourceLocation, int], ...],
                           device: str | None, measured_on: str, limit: int) -> list[Section]:
    """An imported GPU capture's ops and lines by the device time of the kernels they launched."""
    if not op_kernel_ns:
        return []
    all_ns = sum(op_kernel_ns.values())
    ranked = sorted(op_kernel_ns.items(), key=lambda item: -item[1])[:limit]
    result = [Section(f"top ops by the {device or 'device'} time of the kernels they launched, measured on {measured_on}",
                      ("op", "kernel time", "share"),
                      tuple((printable(op), format_ns(ns), percent(ns, all_ns)) for op, ns in ranked), (False, True, True))]
    if kernel_lines:
        # torch.profiler's frames are functions: a function's `def` line (`<module>`: the line running when profiling
        # began), not the line inside it that made the call.
        result.append(Section("top user functions by the kernel time their ops launched", ("function", "kernel time", "share"),
                              tuple((f"{printable(source.function or '?')} ({where(source)})", format_ns(ns), percent(ns, all_ns))
                                    for source, ns in kernel_lines), (False, True, True)))
    return result
