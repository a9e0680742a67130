"""`tputrace info TRACE`: the facts about a trace file: format, runs, record counts, size."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tputrace.wording import printable


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "info",
        help="show a trace's format version, runs, record counts and size",
        description="Show a trace's format version, run facts, record counts per table and file size.",
    )
    parser.add_argument("trace", help="a .tptrace file")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def run(args: argparse.Namespace) -> int:
    import dataclasses
    from pathlib import Path

    from tputrace.derived.eager_modes import eager_mode_spans, eager_modes_text
    from tputrace.store.reader import open_trace
    from tputrace.summary import exit_text, raised_line
    from tputrace.wording import format_bytes, format_ns

    with open_trace(args.trace) as trace:
        file_size = trace.path.stat().st_size
        wal_path = Path(f"{trace.path}-wal")
        wal_size = wal_path.stat().st_size if wal_path.exists() else None
        runs = trace.runs
        counts = trace.counts()
        meta = dict(trace.meta)
        eager_modes = {run_info.rank: eager_modes_text(eager_mode_spans(trace, run_info)) for run_info in runs}

    if args.json:
        facts = {
            "path": str(trace.path),
            "file_bytes": file_size,
            "wal_bytes": wal_size,
            "format_version": trace.format_version,
            "meta": meta,
            "runs": [dataclasses.asdict(run_info) for run_info in runs],
            "counts": counts,
        }
        print(json.dumps(facts, indent=2))
        return 0

    size = format_bytes(file_size)
    if wal_size is not None:
        size += f" + {format_bytes(wal_size)} in a -wal file (the writer is still running, or was killed)"
    lines = [
        ("trace", str(trace.path)),
        ("size", size),
        ("format", f"{trace.format_version}, created {meta.get('created', '?')} by {meta.get('writer', '?')}"),
        ("ranks", str(len(runs)) if runs else "none recorded"),
    ]
    for run_info in runs:
        command = " ".join([run_info.script or "?", *run_info.argv])
        machine = ", ".join(
            str(part)
            for part in (
                f"host {run_info.host}" if run_info.host else None,
                f"pid {run_info.pid}" if run_info.pid is not None else None,
                run_info.platform,
                f"{run_info.chips} chip{'' if run_info.chips == 1 else 's'}" if run_info.chips is not None else None,
                eager_modes.get(run_info.rank, run_info.eager_mode),
            )
            if part
        )
        versions = ", ".join(
            f"{name} {version}"
            for name, version in (
                ("torch", run_info.torch_version),
                ("jax", run_info.jax_version),
                ("tputrace", run_info.tputrace_version),
            )
            if version
        )
        if run_info.end_ns is None:
            ending = "no end record (still running, or killed)"
        else:
            ending = f"wall {format_ns(run_info.end_ns)}, {exit_text(run_info.exit_status)}"
            if run_info.error:
                ending += f", raised {raised_line(run_info.error)}"
        lines.append((f"rank {run_info.rank}", command))
        lines.extend(("", detail) for detail in (machine, versions, ending) if detail)
    lines.append(("records", ""))
    width = max(len(table) for table in counts)
    lines.extend(("", f"{table:<{width}} {count:>12,}") for table, count in counts.items())
    for label, text in lines:
        print(printable(f"{label:<8} {text}".rstrip()))
    return 0
