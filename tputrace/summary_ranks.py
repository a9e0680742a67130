"""The summary's table of ranks, for a trace that holds several: a line each (`tputrace.derived.rank_lines`), so
that the slow rank, the idle one or the one waiting in collectives shows without a summary per `--rank`."""

from __future__ import annotations

from tputrace.derived.rank_lines import RankLine
from tputrace.wording import format_ns, printable

RankTable = tuple[str, tuple[str, ...], tuple[tuple[str, ...], ...], tuple[bool, ...]]


def rank_table(lines: tuple[RankLine, ...], shown_rank: int) -> RankTable:
    """(title, columns, rows, numeric) of the ranks' table; its title says whose the other tables are."""
    medians = [line.median_step_ns for line in lines if line.median_step_ns]
    fastest = min(medians) if medians else None
    rows = tuple(
        (
            f"{line.rank}{' *' if line.rank == shown_rank else ''}",
            printable(line.label),
            format_ns(line.wall_ns),
            f"{line.steps}",
            format_ns(line.median_step_ns) if line.median_step_ns else "-",
            f"+{100 * (line.median_step_ns / fastest - 1):.1f}%" if line.median_step_ns and fastest else "-",
            f"{100 * line.busy_ns / line.wall_ns:.1f}%" if line.wall_ns and line.busy_ns else "-",
            format_ns(line.collective_ns) if line.collective_ns else "-",
            f"{line.top_collective} {format_ns(line.top_collective_ns)}" if line.top_collective else "-",
        )
        for line in lines
    )
    title = (f"ranks: {len(lines)} (* the rank the other tables show; `tputrace summary --rank N` for another)")
    return (title, ("rank", "", "wall", "steps", "median step", "vs fastest", "device busy", "collectives",
                    "top collective"), rows, (False, False, True, True, True, True, True, True, False))
