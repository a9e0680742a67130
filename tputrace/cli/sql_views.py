"""`tputrace sql-views TRACE`: add the readable SQL views (`ops_v`, `compiles_v`, ...) to a trace written
before tputrace's writer created them. New traces have them already."""

from __future__ import annotations

import argparse
from typing import Any


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "sql-views",
        help="add the readable SQL views (ops_v, compiles_v, ...) to an older trace",
        description="Add to TRACE one view per record table (ops_v, compiles_v, syncs_v, ...) with interned "
                    "strings and source locations as text, for sqlite3, pandas and DuckDB. The file is "
                    "modified in place; its records are not.",
    )
    parser.add_argument("trace", help="a .tptrace file, writable")
    return parser


def run(args: argparse.Namespace) -> int:
    import sqlite3
    from pathlib import Path

    from tputrace.schema import VIEW_SUFFIX, view_statements
    from tputrace.store.errors import TraceError
    from tputrace.store.opening import check_trace_file, describe_database_error, read_meta

    path = Path(args.trace)
    check_trace_file(path)
    try:
        connection = sqlite3.connect(path)
    except sqlite3.Error as error:
        raise TraceError(f"cannot open {path}: {error}") from None
    try:
        read_meta(connection, path)
        tables = [name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        present = {table: {row[1] for row in connection.execute(f"PRAGMA table_info({table})")} for table in tables}
        statements = view_statements(present)
        with connection:
            for statement in statements:
                connection.execute(statement)
    except sqlite3.Error as error:
        raise describe_database_error(error, path) from None
    finally:
        connection.close()
    names = ", ".join(statement.split()[5] for statement in statements)
    print(f"{path}: views {names}")
    print(f"query one: sqlite3 {path} 'SELECT op, file, line, dur_ns FROM ops{VIEW_SUFFIX} LIMIT 5'")
    return 0
