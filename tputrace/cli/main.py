"""`tputrace` entry point: builds the parser from the subcommand modules and maps errors to exit codes.

A subcommand is a module `tputrace.cli.<name>` with two functions:
- `prepare_parser(subparsers) -> argparse.ArgumentParser`: add its parser (cheap: no heavy imports);
- `run(args) -> int`: do the work (heavy imports go here) and return the exit status.
To add one, write the module and add its name to `COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from tputrace import __version__
from tputrace.store.errors import TputraceError

COMMANDS: list[str] = [
    "run",
    "info",
    "summary",
    "dump",
    "plot",
    "report",
    "tui",
    "export",
    "tensorboard",
    "merge",
    "import_",
    "numerics",
    "sql_views",
    "diff",
    "check",
]

EXIT_USAGE_ERROR = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    """The `tputrace` parser with one subparser per module in `COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="tputrace",
        description="Record PyTorch programs on a tpu device and explore the traces.",
    )
    parser.add_argument("--version", action="version", version=f"tputrace {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        command: ModuleType = importlib.import_module(f"tputrace.cli.{name}")
        subparser = command.prepare_parser(subparsers)
        subparser.set_defaults(command_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `tputrace` with `argv` (default: `sys.argv[1:]`) and return the exit status.

    Errors meant for the user (`TputraceError`) become one line on stderr and exit status 2, as does a
    failure on a trace that holds values its format never stores (`tputrace.store.values`).
    """
    args = build_parser().parse_args(argv)
    try:
        return args.command_run(args)
    except TputraceError as error:
        print(f"tputrace: error: {error}", file=sys.stderr)
        return EXIT_USAGE_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away (`tputrace dump ... | head`): stop quietly. Point stdout
        # at devnull so that the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception:
        problem = _damaged_trace(args)
        if problem is None:
            raise
        print(f"tputrace: error: {problem}", file=sys.stderr)
        return EXIT_USAGE_ERROR


def _trace_paths(args: argparse.Namespace) -> list[str]:
    return [path for path in (getattr(args, "trace", None), *(getattr(args, "traces", None) or ()),
                              *(getattr(args, "compare", None) or ())) if path]


def _damaged_trace(args: argparse.Namespace) -> str | None:
    """Why a command failed, if one of the traces it read does not open as a trace (the reader's one sentence: a
    corrupt file can fail a command's first look at it before the reader does) or holds values its format never
    stores (a damaged or hand-made file); None: then the failure is tputrace's own, and keeps its traceback."""
    from tputrace.store.reader import open_trace
    from tputrace.store.values import damaged_trace

    paths = _trace_paths(args)
    for path in paths:
        try:
            open_trace(path).close()
        except TputraceError as error:
            if not _readable_database(path):  # a readable one is another kind of input, with its own reader
                return str(error)
    return damaged_trace(paths)


def _readable_database(path: str) -> bool:
    """Whether `path` is an SQLite file whose schema reads (a numerics recording, say), not a damaged file."""
    import sqlite3

    try:
        connection = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
        try:
            connection.execute("SELECT name FROM sqlite_master").fetchall()
        finally:
            connection.close()
    except (OSError, sqlite3.Error, UnicodeDecodeError):
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
