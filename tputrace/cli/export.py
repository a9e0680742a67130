"""`tputrace export TRACE --tensorboard LOGDIR [--run NAME] --perfetto OUT.json.gz`: open a trace elsewhere.

`--tensorboard` writes XProf files (`LOGDIR/plugins/profile/<run>/<host>.xplane.pb`, one per rank)
for TensorBoard's profile plugin or `xprof --logdir LOGDIR`; `--perfetto` writes Chrome trace-event
JSON for ui.perfetto.dev or chrome://tracing. Either or both.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from tputrace.cli.outputs import FORCE_HELP, PERFETTO, check_output, writing
from tputrace.store.errors import TputraceError


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "export",
        help="export a trace for TensorBoard/XProf or Perfetto",
        description="Export a trace as XProf files for TensorBoard's profile plugin (--tensorboard) and/or as "
        "Chrome trace-event JSON for Perfetto (--perfetto). Op times inside a program are estimates; each "
        "export says so.",
        usage="tputrace export TRACE [--tensorboard LOGDIR [--run NAME]] [--perfetto OUT.json.gz] [--target CHIP] [--force]",
    )
    parser.add_argument("trace", help="a .tptrace file")
    parser.add_argument("--tensorboard", metavar="LOGDIR", help="write LOGDIR/plugins/profile/<run>/<host>.xplane.pb")
    parser.add_argument("--run", metavar="NAME", help="run name under LOGDIR (default: the trace file's name)")
    parser.add_argument("--perfetto", metavar="PATH", help="write Chrome trace-event JSON (gzipped if PATH ends in .gz)")
    parser.add_argument("--target", metavar="CHIP", default=None,
                        help="TPU whose peaks XProf shows and op times are estimated for (default: v6e, the one `tputrace report` uses)")
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)
    return parser


def run(args: argparse.Namespace) -> int:
    from tputrace.store.reader import open_trace
    from tputrace.analysis.target import DEFAULT_TARGET, target_chip
    from tputrace.derived.imported_sources import imported_device

    if not args.tensorboard and not args.perfetto:
        raise TputraceError("nothing to export: give --tensorboard LOGDIR and/or --perfetto PATH")
    if args.run and not args.tensorboard:
        raise TputraceError("--run names a run under --tensorboard LOGDIR; give --tensorboard too")
    target = args.target or DEFAULT_TARGET
    chip = target_chip(target)
    if args.perfetto:
        check_output(Path(args.perfetto), PERFETTO, inputs=[Path(args.trace)], force=args.force, option="--perfetto")
    with open_trace(args.trace) as trace:
        if args.tensorboard:
            check_logdir(Path(args.tensorboard))  # after opening: a bad trace leaves no empty logdir behind
            with writing("--tensorboard", args.tensorboard):
                export_tensorboard(trace, Path(args.tensorboard), args.run, chip.name)
        if args.perfetto:
            with writing("--perfetto", args.perfetto):
                export_perfetto(trace, Path(args.perfetto), chip.name)
        device = imported_device(trace, None)
    if device is None:
        print(f"tputrace: target chip {chip.device_type} ({chip.name}); op times inside programs are estimates",
              file=sys.stderr)
    else:
        print(f"tputrace: the times are the capture's, measured on its {device}", file=sys.stderr)
    return 0


def export_tensorboard(trace: Any, logdir: Path, run_name: str | None, target: str) -> list[Any]:
    from tputrace.viewers.export import xplane

    started = time.perf_counter()
    exports = xplane.export_tensorboard(trace, logdir, run=run_name, target=target)
    seconds = time.perf_counter() - started
    for export in exports:
        print(f"tputrace: wrote {export.path} (rank {export.rank}: {export.device_events:,} chip events, "
              f"{export.host_events:,} host events)", file=sys.stderr)
    print(f"tputrace: {len(exports)} host file(s) in {seconds:.1f} s; view with: tputrace tensorboard {trace.path}  "
          f"(or: xprof --logdir {logdir})", file=sys.stderr)
    return exports


def export_perfetto(trace: Any, path: Path, target: str) -> Any:
    from tputrace.viewers.export import perfetto

    started = time.perf_counter()
    export = perfetto.export_perfetto(trace, path, target=target)
    seconds = time.perf_counter() - started
    print(f"tputrace: wrote {export.path} ({export.slices:,} slices, {export.instants:,} instants, "
          f"{export.counters:,} counter samples, {export.flows:,} flows) in {seconds:.1f} s; "
          f"open it at https://ui.perfetto.dev", file=sys.stderr)
    return export


def check_logdir(logdir: Path) -> None:
    """A logdir must be a directory that can be created (checked before the trace is read)."""
    if logdir.exists() and not logdir.is_dir():
        raise TputraceError(f"--tensorboard {logdir} is a file, not a directory")
    with writing("--tensorboard", str(logdir)):
        logdir.mkdir(parents=True, exist_ok=True)
    if not os.access(logdir, os.W_OK | os.X_OK):
        raise TputraceError(f"cannot write --tensorboard {logdir}: permission denied")

