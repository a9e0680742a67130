"""`tputrace summary TRACE`: what a recorded run spent its time on."""

from __future__ import annotations

import argparse
from typing import Any

from tputrace.cli.arguments import require_rank, whole_number_at_least


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "summary",
        help="summarise a trace: time split, top ops, recompiles, syncs, fallbacks",
        description="Summarise a trace: wall time, steps, time split, top ops, recompiles, host syncs, CPU fallbacks.",
    )
    parser.add_argument("trace", help="a .tptrace file")
    parser.add_argument("--rank", type=int, default=None, help="rank to summarise (default: rank 0)")
    parser.add_argument("--top", type=whole_number_at_least(1), default=10, metavar="N", help="rows per table (default: 10)")
    return parser


def run(args: argparse.Namespace) -> int:
    from tputrace.store.reader import open_trace
    from tputrace.summary import print_summary, summarize

    with open_trace(args.trace) as trace:
        require_rank(trace, args.rank, args.trace)
        summary = summarize(trace, rank=args.rank, top=args.top)
    print_summary(summary)
    return 0
