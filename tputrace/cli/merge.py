"""`tputrace merge TRACE... -o MERGED`: merge traces of several ranks (or hosts) into one, on one clock."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tputrace.cli.outputs import FORCE_HELP, TRACE, check_output, writing


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "merge",
        help="merge per-rank (or per-host) traces into one multi-rank trace",
        description=(
            "Merge traces recorded by different ranks (e.g. `torchrun ... -m tputrace.cli.main run -o trace.{rank}.tptrace`, "
            "or merged traces from several hosts) into one trace with aligned clocks, the time each rank waited in "
            "each collective, and the ranks that are missing or died."
        ),
    )
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="the traces to merge (each holds one or more ranks)")
    parser.add_argument("-o", "--output", required=True, metavar="PATH", help="the merged trace to write")
    parser.add_argument(
        "--align",
        choices=("auto", "wall", "collectives"),
        default="auto",
        help="auto: wall clocks for one host, collectives to align several hosts (default); wall: trust wall clocks; "
        "collectives: always align on collective end times",
    )
    parser.add_argument("--world-size", type=int, metavar="N", help="ranks expected (default: the recorded world size)")
    parser.add_argument("--source-root", action="append", default=[], metavar="DIR",
                        help="where to look for a copy of a source file the run saw (repeatable); an older trace's "
                             "call columns need it")
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)
    return parser


def run(args: argparse.Namespace) -> int:
    from tputrace.merge import merge_traces
    from tputrace.store.errors import TputraceError

    if args.world_size is not None and args.world_size < 1:
        raise TputraceError(f"--world-size must be at least 1, not {args.world_size}")
    expected = range(args.world_size) if args.world_size is not None else None
    check_output(Path(args.output), TRACE, inputs=[Path(trace) for trace in args.traces], force=args.force)
    with writing("-o", args.output):
        result = merge_traces(args.traces, args.output, expected_ranks=expected, align=args.align, source_roots=args.source_root)
    for line in result.lines():
        print(line, file=sys.stdout)
    return 0
