"""`tputrace report TRACE [--target T] [--json]`: the trace's findings, ranked by estimated cost."""

from __future__ import annotations

import argparse
from typing import Any

from tputrace.cli.arguments import require_rank, whole_number_at_least


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "report",
        help="diagnose a trace: ranked findings tied to source lines",
        description=(
            "Diagnose a trace: indices out of range, recompilation storms, host syncs, CPU fallbacks, fragmented fusion, tile padding, "
            "float32 matmuls, host-bound steps, transfers in the loop, memory and collectives, ranked by estimated "
            "cost on a target TPU."
        ),
    )
    parser.add_argument("trace", help="a .tptrace file (or a .tpnum numerics recording)")
    parser.add_argument("--target", metavar="CHIP", default=None,
                        help="target TPU: v5e, v5p, v6e or v7 (default: v6e)")
    parser.add_argument("--rank", type=int, default=None, help="rank to analyse (default: rank 0)")
    parser.add_argument("--top", type=whole_number_at_least(1), default=None, metavar="N", help="show only the N costliest findings")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    import sys

    from tputrace.analysis import analyze
    from tputrace.analysis.chips import chip
    from tputrace.analysis.render import print_report, render_json
    from tputrace.store.reader import open_trace

    if args.target is not None:
        chip(args.target)  # an unknown name is a usage error before the trace is read
    from tputrace.numerics.store import is_numerics_recording

    if is_numerics_recording(args.trace):
        return _numerics_report(args)
    with open_trace(args.trace) as trace:
        require_rank(trace, args.rank, args.trace)
        report = analyze(trace, args.target, rank=args.rank)
    if args.json:
        sys.stdout.write(render_json(report))
    else:
        print_report(report, sys.stdout, top=args.top)
    return 0


def _numerics_report(args: argparse.Namespace) -> int:
    """`tputrace report X.tpnum`: the numerics recording's findings (first divergent module, first NaN/Inf)."""
    import json
    import sys
    from dataclasses import asdict
    from pathlib import Path

    from tputrace.analysis.render import finding_lines
    from tputrace.numerics.findings import replay_report
    from tputrace.numerics.report_findings import numerics_findings
    from tputrace.numerics.store import read_recording
    from tputrace.wording import printable

    report = replay_report(read_recording(Path(args.trace)))
    findings = numerics_findings(report)[: args.top]
    if args.json:
        json.dump({"numerics": str(args.trace), "calls": report.calls, "compared": report.compared,
                   "findings": [asdict(finding) for finding in findings]}, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    print(printable(f"numerics: {report.title}: {report.calls:,} module calls, {report.compared:,} compared"))
    if not findings:
        print("no findings: every compared call stays within its tolerance, and no NaN or Inf")
    for number, finding in enumerate(findings, start=1):
        for line in finding_lines(number, finding):
            print(" " * line.indent + printable(line.text))
    return 0
