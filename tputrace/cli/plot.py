"""`tputrace plot TRACE [-o report.html]`: one self-contained HTML report with the run in pictures.

`tputrace plot --compare BEFORE AFTER` writes a before/after page instead (step times, op time by
op, compiles). plotly.js is inlined by default so the page opens offline; `--plotlyjs cdn` links it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tputrace.cli.outputs import FORCE_HELP, HTML_REPORT, check_output, writing
from tputrace.store.errors import TputraceError


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plot",
        help="write an HTML report of a trace (or compare two traces)",
        description="Write one self-contained HTML report of a trace: timeline, step times, where time goes, "
        "recompilations, shapes and padding, roofline, collectives and memory, with the findings beside them.",
        usage="tputrace plot TRACE [-o report.html] [--plotlyjs {inline,cdn}] [--target CHIP] [--force]\n"
        "       tputrace plot --compare BEFORE AFTER [-o compare.html] [--plotlyjs {inline,cdn}]",
    )
    parser.add_argument("trace", nargs="?", help="a .tptrace file")
    parser.add_argument("-o", "--output", metavar="PATH",
                        help="HTML file to write (default: the trace's name with .html, next to it)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="compare two traces side by side instead of reporting one")
    parser.add_argument("--plotlyjs", choices=("inline", "cdn"), default="inline",
                        help="inline plotly.js so the page opens offline (default), or link it from the plotly CDN")
    parser.add_argument("--target", metavar="CHIP", help="target TPU for findings and estimates (e.g. v6e)")
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)
    return parser


def run(args: argparse.Namespace) -> int:
    from tputrace.viewers.report import report_html

    if args.compare and args.trace:
        raise TputraceError("give either a trace or --compare BEFORE AFTER, not both")
    if args.compare:
        before, after = (Path(path) for path in args.compare)
        output = Path(args.output) if args.output else after.with_name(f"{before.stem}-vs-{after.stem}.html")
        check_output(output, HTML_REPORT, inputs=[before, after], force=args.force, option=_option(args))
        with writing(_option(args), output):
            written = report_html.write_comparison(before, after, output, plotlyjs=args.plotlyjs)
    elif args.trace and _is_numerics(args.trace):
        recording = Path(args.trace)
        output = Path(args.output) if args.output else recording.with_suffix(".html")
        check_output(output, HTML_REPORT, inputs=[recording], force=args.force, option=_option(args))
        from tputrace.viewers.report.numerics_page import write_numerics_page

        with writing(_option(args), output):
            written = write_numerics_page(recording, output, plotlyjs=args.plotlyjs)
    elif args.trace:
        trace_path = Path(args.trace)
        output = Path(args.output) if args.output else trace_path.with_suffix(".html")
        check_output(output, HTML_REPORT, inputs=[trace_path], force=args.force, option=_option(args))
        with writing(_option(args), output):
            written = report_html.write_report(trace_path, output, target=args.target, plotlyjs=args.plotlyjs)
        if written.analysis_note:
            print(f"tputrace: note: {written.analysis_note}", file=sys.stderr)
    else:
        raise TputraceError("give a trace to plot, or --compare BEFORE AFTER")
    size_mb = written.size_bytes / 1e6
    print(f"tputrace: wrote {written.path} ({size_mb:.1f} MB in {written.seconds:.1f} s)", file=sys.stderr)
    return 0


def _option(args: argparse.Namespace) -> str:
    """How messages name the output: the option that gave it, or the report's default place."""
    return "-o" if args.output else "the report"


def _is_numerics(path: str) -> bool:
    from tputrace.numerics.store import is_numerics_recording

    return is_numerics_recording(path)
