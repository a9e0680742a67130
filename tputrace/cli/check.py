"""`tputrace check TRACE --budget FILE`: exit 1 and list the violations when a run breaks its budget."""

from __future__ import annotations

import argparse
from typing import Any

EXIT_OVER_BUDGET = 1


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "check",
        help="check a trace against a performance budget (exit 1 on a violation)",
        description="Check a trace against the limits of a budget TOML file; exit 1 and list each violation.",
    )
    parser.add_argument("trace", help="a .tptrace file")
    parser.add_argument("--budget", required=True, metavar="FILE", help="budget TOML file (max_recompiles = 0, ...)")
    parser.add_argument("--baseline", metavar="TRACE", help="baseline trace for max_step_time_ratio")
    parser.add_argument("--rank", type=int, default=None, help="rank to check (default: the first)")
    return parser


def run(args: argparse.Namespace) -> int:
    from tputrace.budgets import read_budget, violations
    from tputrace.cli.arguments import require_rank
    from tputrace.compare.figures import run_figures
    from tputrace.store.reader import open_trace
    from tputrace.wording import printable

    budget = read_budget(args.budget)
    baseline = None
    if args.baseline:
        with open_trace(args.baseline) as baseline_trace:
            baseline = run_figures(baseline_trace)
    with open_trace(args.trace) as trace:
        require_rank(trace, args.rank, args.trace)
        figures = run_figures(trace, args.rank)
    broken = violations(figures, budget, baseline)
    for violation in broken:
        print(printable(violation.describe()))
    if broken:
        return EXIT_OVER_BUDGET
    print(f"{printable(args.trace)}: within budget ({len(budget)} limit(s))")
    return 0
