"""`tputrace import PATH... -o TRACE`: import XProf, TORCH_TRACE and torch.profiler captures as a trace."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tputrace.cli.outputs import FORCE_HELP, TRACE, check_output, writing


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "import",
        help="import captures made by other tools (XProf xplane.pb, TORCH_TRACE logs, torch.profiler JSON)",
        description=(
            "Import profiles captured elsewhere into one trace: XProf `*.xplane.pb` (jax.profiler, TorchTPU, "
            "PyTorch/XLA), `TORCH_TRACE` logs (torch.compile) and torch.profiler Chrome/Kineto JSON. A directory "
            "is searched for captures; each capture becomes one rank of the trace, and `meta.imported` says where "
            "each came from."
        ),
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="capture files or directories holding them")
    parser.add_argument("-o", "--output", required=True, metavar="PATH", help="the trace to write")
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)
    return parser


def run(args: argparse.Namespace) -> int:
    from tputrace.importers.run import import_captures

    check_output(Path(args.output), TRACE, inputs=[Path(path) for path in args.paths], force=args.force)
    with writing("-o", args.output):
        result = import_captures(args.paths, args.output)
    for warning in result.warnings:
        print(f"tputrace: warning: {warning}", file=sys.stderr)
    for line in result.lines():
        print(line, file=sys.stdout)
    return 0
