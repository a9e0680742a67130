"""`tputrace diff A B`: what changed between two runs, the most important regression first."""

from __future__ import annotations

import argparse
from typing import Any


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "diff",
        help="compare two traces: step time, compiles, syncs, recompiles and findings new or fixed",
        description="Compare run B with run A; the first line names the most important regression.",
    )
    parser.add_argument("before", help="the first .tptrace file (A)")
    parser.add_argument("after", help="the second .tptrace file (B)")
    parser.add_argument("--rank", type=int, default=None, help="rank to compare (default: each trace's first)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    import json

    from tputrace.compare.diff import compare
    from tputrace.compare.figures import run_figures
    from tputrace.compare.sites import unreadable_files
    from tputrace.store.reader import open_trace

    with open_trace(args.before) as before_trace, open_trace(args.after) as after_trace:
        ranks = _ranks(before_trace, after_trace, args)
        # A line's text matches only where both runs' copies of its file are readable.
        by_number = unreadable_files(before_trace) | unreadable_files(after_trace)
        differences = [compare(run_figures(before_trace, before_rank, by_line_number=by_number),
                               run_figures(after_trace, after_rank, by_line_number=by_number))
                       for before_rank, after_rank in ranks]
    lead = next((difference for difference in differences if difference.regressed), differences[0])
    if args.json:
        document = _plain(lead)
        if len(differences) > 1:
            document["headline"] = _rank_headline(lead)
            document["ranks"] = [_plain(difference) for difference in differences]
        print(json.dumps(document, indent=2, default=str))
    else:
        if len(differences) > 1:
            _print_ranks(lead, differences)
        _print(lead, with_headline=len(differences) == 1)
    return 0


def _ranks(before: Any, after: Any, args: argparse.Namespace) -> list[tuple[int | None, int | None]]:
    """The (A rank, B rank) pairs to compare: `--rank`'s, every rank both traces have, or each trace's first."""
    from tputrace.cli.arguments import require_rank

    rank: int | None = args.rank
    if rank is not None:
        for trace in (before, after):
            require_rank(trace, rank, trace.path)
        return [(rank, rank)]
    shared = [rank for rank in before.ranks if rank in after.ranks]
    if len(shared) > 1:
        return [(rank, rank) for rank in shared]
    return [(None, None)]


def _rank_headline(difference: Any) -> str:
    """The headline of a comparison of several ranks: the first regressing rank's, named."""
    return f"rank {difference.after.rank}: {difference.headline}" if difference.regressed else difference.headline


def _plain(difference: Any) -> dict[str, Any]:
    from tputrace.compare.diff import improvements

    return {
        "headline": difference.headline,
        "note": difference.note,
        "improved": improvements(difference),
        "before": difference.before.path,
        "after": difference.after.path,
        "rank": difference.after.rank,
        # A figure a run does not record is null on its side, with why in `not_recorded` ("A"/"B" -> reason).
        "figures": [{"name": change.name, "before": change.before, "after": change.after, "worse": change.worse,
                     "not_recorded": change.not_recorded} for change in difference.figures],
        "recompiles": [{"status": change.status, "site": change.recompile.site, "name": change.recompile.name,
                        "reason": change.recompile.reason, "diff": change.recompile.diff, "count": change.count}
                       for change in difference.recompiles],
        "findings": [{"status": change.status, "title": change.title, "site": change.site,
                      "before_ns": change.before_ns, "after_ns": change.after_ns} for change in difference.findings],
        "programs": [{"status": change.status, "program": change.family.label, "kind": change.family.kind,
                      "site": change.family.site, "detail": change.detail, "runs": change.family.executions}
                     for change in difference.programs],
        "op_time": [{"by": change.by, "label": change.label, "before_ns": change.before_ns,
                     "after_ns": change.after_ns} for change in difference.op_time],
    }


def _print_ranks(lead: Any, differences: list[Any]) -> None:
    from tputrace.wording import format_ns, printable

    print(printable(_rank_headline(lead)))
    for difference in differences:
        before, after = difference.before, difference.after
        step = (f"{format_ns(int(before.median_step_ns))} -> {format_ns(int(after.median_step_ns))}"
                if before.median_step_ns is not None and after.median_step_ns is not None else "no steady steps")
        print(f"  rank {after.rank}: step {step}, recompiles after warm-up "
              f"{len(before.recompiles_after_warmup)} -> {len(after.recompiles_after_warmup)}: "
              f"{printable(difference.headline)}")
    print(f"rank {lead.after.rank} in detail (--rank N for another):")


def _print(difference: Any, *, with_headline: bool = True) -> None:
    from tputrace.wording import format_ns, printable

    from tputrace.compare.diff import improvements

    if with_headline:
        print(printable(difference.headline))
    better = improvements(difference)
    if better:
        print(printable(better))
    print(f"A: {printable(difference.before.path)}\nB: {printable(difference.after.path)}")
    if difference.note:
        print(f"note: {printable(difference.note)}")
    for change in difference.figures:
        marker = "worse" if change.worse else ""
        print(f"  {change.name:<26} {change.text} {marker}".rstrip())
    for change in difference.recompiles:
        recompile = change.recompile
        where = f" at {printable(recompile.site)}" if recompile.site else ""
        print(f"  {change.status} recompile{where}: {printable(recompile.name or 'a program')}"
              f" x{change.count} ({printable(recompile.diff or recompile.reason or 'unknown reason')})")
    for change in difference.findings:
        where = f" at {printable(change.site)}" if change.site else ""
        print(f"  {change.status} finding{where}: {printable(change.title)}")
    for change in difference.programs:
        print(f"  {change.status} program: {printable(change.family.label)} ({printable(change.detail)})")
    for change in difference.op_time:
        print(f"  op time by {change.by} {printable(change.label)}: "
              f"{format_ns(change.before_ns)} -> {format_ns(change.after_ns)} (host dispatch, excl. flushes/compiles)")
