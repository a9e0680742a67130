"""`tputrace dump TRACE`: the raw records of a trace, one per line, for debugging the format."""

from __future__ import annotations

import argparse
from typing import Any

from tputrace.cli.arguments import whole_number_at_least
from tputrace.schema import RECORD_KINDS
from tputrace.wording import printable

# Tables whose stored order is not their records' order: an op's row is written when it ends (a parent after its
# children in an import, a deferred op at its flush), and `seq` is its dispatch order.
_ORDER = {"ops": "rank, seq"}


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "dump",
        help="print a trace's records, one per line",
        description="Print a trace's records, one per line (or JSON lines), with interned strings resolved.",
    )
    parser.add_argument("trace", help="a .tptrace file")
    parser.add_argument(
        "--kind",
        choices=["meta", *(kind.table for kind in RECORD_KINDS)],
        metavar="TABLE",
        help="only this table (meta or a record table; default: all)",
    )
    parser.add_argument("--limit", type=whole_number_at_least(0), default=None, metavar="N", help="at most N records per table")
    parser.add_argument("--json", action="store_true", help="JSON lines instead of text")
    parser.add_argument("--raw", action="store_true", help="stored values: ids instead of strings and frames")
    parser.add_argument("--source-root", action="append", default=[], metavar="DIR",
                        help="where to look for a copy of a source file the run saw (repeatable); an older trace's "
                             "call columns need it")
    return parser


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    import sys

    from tputrace.store.reader import open_trace
    from tputrace.store.records import SourceLocation

    def plain(value: Any) -> Any:
        if isinstance(value, SourceLocation):  # a call's columns only where recorded (compiles)
            return {name: field for name, field in dataclasses.asdict(value).items()
                    if field is not None and (name != "columns_unchecked" or field)}
        if isinstance(value, tuple):
            return list(value)
        return value

    def text(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, SourceLocation):
            return printable(f"{value.file}:{value.line}:{value.function}{_call_span(value)}")
        if isinstance(value, str):
            return json.dumps(value, ensure_ascii=False)
        if isinstance(value, tuple):
            return json.dumps(list(value), ensure_ascii=False)
        return str(value)

    out = sys.stdout
    tables = [args.kind] if args.kind else ["meta", *(kind.table for kind in RECORD_KINDS)]
    with open_trace(args.trace, source_roots=args.source_root) as trace:
        for file in trace.unchecked_column_files():
            print(f"tputrace dump: call columns in {file} not checked: the trace stored them in UTF-8 bytes and "
                  "the file is not the one the run saw (no --source-root copy is either), so they are not "
                  "shown (:col unchecked)", file=sys.stderr)
        for table in tables:
            if table == "meta":
                fields_rows = [[("key", key), ("value", value)] for key, value in trace.meta.items()]
                rows: Any = fields_rows[: args.limit] if args.limit is not None else fields_rows
            elif args.raw:
                names = next(kind for kind in RECORD_KINDS if kind.table == table).column_names
                rows = (list(zip(names, row)) for row in trace.raw_records(table, order_by=_ORDER.get(table), limit=args.limit))
            else:
                rows = (
                    [(field.name, getattr(record, field.name)) for field in dataclasses.fields(record)]
                    for record in trace.records(table, order_by=_ORDER.get(table), limit=args.limit)
                )
            for fields in rows:
                if args.json:
                    out.write(
                        json.dumps(
                            {"table": table, **{name: plain(value) for name, value in fields}}, ensure_ascii=False
                        )
                    )
                else:
                    out.write(table + " " + " ".join(f"{name}={text(value)}" for name, value in fields))
                out.write("\n")
    out.flush()
    return 0


def _call_span(location: Any) -> str:
    """A call's columns as dump prints them (0-based characters, the end exclusive): `:col 4-19` on its line,
    `:col 4-7:5` for one ending on line 7, `:col 4-` when the end is not known, `:col unchecked` when the file
    changed since the run (`SourceLocation.columns_unchecked`); nothing without a column."""
    if location.columns_unchecked:
        return ":col unchecked"
    if location.col is None:
        return ""
    if location.end_col is None:
        return f":col {location.col}-"
    end_line = "" if location.end_line in (None, location.line) else f"{location.end_line}:"
    return f":col {location.col}-{end_line}{location.end_col}"
