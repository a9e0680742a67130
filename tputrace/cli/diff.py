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
    from tputrace.store.reader import open_trace

    with open_trace(args.before) as before_trace:
        before = run_figures(before_trace, _rank(before_trace, args))
    with open_trace(args.after) as after_trace:
        after = run_figures(after_trace, _rank(after_trace, args))
    difference = compare(before, after)
    if args.json:
        print(json.dumps(_plain(difference), indent=2, default=str))
    else:
        _print(difference)
    return 0


def _rank(trace: Any, args: argparse.Namespace) -> int | None:
    from tputrace.store.errors import TputraceError

    rank: int | None = args.rank
    if rank is not None and rank not in trace.ranks:
        raise TputraceError(f"{trace.path} has no rank {rank}")
    return rank


def _plain(difference: Any) -> dict[str, Any]:
    return {
        "headline": difference.headline,
        "before": difference.before.path,
        "after": difference.after.path,
        "figures": [{"name": change.name, "before": change.before, "after": change.after, "worse": change.worse}
                    for change in difference.figures],
        "recompiles": [{"status": change.status, "site": change.recompile.site, "name": change.recompile.name,
                        "reason": change.recompile.reason, "diff": change.recompile.diff, "count": change.count}
                       for change in difference.recompiles],
        "findings": [{"status": change.status, "title": change.title, "site": change.site,
                      "before_ns": change.before_ns, "after_ns": change.after_ns} for change in difference.findings],
    }


def _print(difference: Any) -> None:
    from tputrace.wording import printable

    print(printable(difference.headline))
    print(f"A: {printable(difference.before.path)}\nB: {printable(difference.after.path)}")
    for change in difference.figures:
        marker = "worse" if change.worse else ""
        print(f"  {change.name:<26} {change.text} {marker}".rstrip())
    for change in difference.recompiles:
        recompile = change.recompile
        print(f"  {change.status} recompile at {printable(recompile.site or '?')}: {printable(recompile.name or '?')}"
              f" x{change.count} ({printable(recompile.diff or recompile.reason or '')})")
    for change in difference.findings:
        print(f"  {change.status} finding at {printable(change.site or '-')}: {printable(change.title)}")
