"""`tputrace tui TRACE`: explore a trace in the terminal (a Textual app; see `tputrace.tui`).

The trace is opened and checked before the UI starts, so a missing, corrupt or foreign file is one
line on stderr and exit status 2, never a half-drawn screen.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

VIEWS = ("overview", "findings", "ops", "compiles", "fusions", "collectives", "timeline", "source", "sharding", "compare",
         "memory")
"""Every view of `tputrace.tui.actions.VIEW_ORDER`, by id (not imported from there: the parser stays Textual-free)."""


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "tui",
        help="explore a trace in the terminal: overview, findings, ops, compiles, fusions, collectives, timeline, source",
        description="Explore a trace in a terminal UI. Press ? for the keys, Ctrl+P for the command palette.",
    )
    parser.add_argument("trace", help="a .tptrace file (or a .tpnum numerics recording)")
    parser.add_argument("--rank", type=int, default=None, help="rank to show first (default: rank 0)")
    parser.add_argument("--compare", metavar="BASELINE", default=None,
                        help="an earlier run's trace: the Compare view (key 0) shows what changed since it")
    parser.add_argument("--view", choices=VIEWS, default="overview", help="view to open on (default: overview)")
    parser.add_argument("--source-root", action="append", default=[], metavar="DIR",
                        help="where to look for the run's source files if they are not at their recorded paths (repeatable)")
    parser.add_argument("--keys", action="append", default=[], metavar="ID=KEYS",
                        help="remap an action's keys by its id, e.g. --keys timeline.zoom_in=i (ids: press ? in the UI)")
    parser.add_argument("--theme", default=None, metavar="NAME",
                        help="tputrace (the terminal's colours, the default), textual-light, textual-dark or another Textual theme")
    return parser


def run(args: argparse.Namespace) -> int:
    from tputrace.numerics.store import is_numerics_recording

    if is_numerics_recording(args.trace):
        _require_terminal()
        from tputrace.tui.numerics_app import open_numerics_ui

        return open_numerics_ui(args.trace)
    return open_ui(args.trace, rank=args.rank, view=args.view, source_roots=args.source_root, keys=args.keys, theme=args.theme,
                   baseline=args.compare)


def open_ui(
    trace_path: str | Path,
    *,
    rank: int | None = None,
    view: str = "overview",
    source_roots: list[str] | None = None,
    keys: list[str] | None = None,
    theme: str | None = None,
    baseline: str | Path | None = None,
) -> int:
    """Check the trace, then run the app until the user quits; return its exit status (1 after an error in
    the app). Errors before the UI raise `TputraceError`."""
    from tputrace.cli.arguments import require_rank
    from tputrace.store.errors import TputraceError
    from tputrace.tui.actions import parse_keymap
    from tputrace.store.reader import open_trace
    from tputrace.tui.session import Session

    try:
        keymap = parse_keymap(keys or [])
    except ValueError as error:
        raise TputraceError(str(error)) from None
    trace = open_trace(trace_path)
    try:
        require_rank(trace, rank, trace_path)
        baseline_path = _checked_baseline(baseline) if baseline is not None else None
        if view == "compare" and baseline_path is None:
            raise TputraceError("--view compare needs --compare BASELINE")
        session = Session.open(trace, rank=rank, source_roots=source_roots or [], baseline_path=baseline_path)
        try:
            session.check()
            from tputrace.tui.app import TraceApp, theme_names

            if theme is not None and theme not in theme_names():
                raise TputraceError(f"no theme {theme!r}; themes: {', '.join(theme_names())}")
            _require_terminal()
            app = TraceApp(session, keymap=keymap, theme=theme, initial_view=view)
            app.run()
        finally:
            session.close()
    finally:
        trace.close()
    return _exit_status(app.return_code or 0, trace_path)


def _checked_baseline(baseline: str | Path) -> Path:
    """The baseline trace's path, once it opens as a trace (else one `TputraceError`)."""
    from tputrace.store.reader import open_trace

    path = Path(baseline).resolve()
    open_trace(path).close()
    return path


def _exit_status(return_code: int, trace_path: str | Path) -> int:
    """The app's exit status: after an error in the app (Textual has printed its traceback), the last line
    names a value the trace should not hold, if it holds one (status 2), so that a damaged file is told apart
    from a bug."""
    from tputrace.store.errors import TputraceError
    from tputrace.store.values import damaged_trace

    problem = damaged_trace([trace_path]) if return_code else None
    if problem is not None:
        raise TputraceError(problem)
    return return_code


def _has_terminal() -> bool:
    """Whether the UI can run: Textual reads keys from stdin and draws on stderr. Without a terminal on
    both it would wait for keys that never come (`tputrace tui t.tptrace < /dev/null` hung until killed)."""
    import sys

    return sys.stdin.isatty() and sys.stderr.isatty()


def _require_terminal() -> None:
    from tputrace.store.errors import TputraceError

    if not _has_terminal():
        raise TputraceError("tputrace tui needs a terminal: it reads keys from stdin and draws on stderr")


def open_ui_after_run(trace_path: Path) -> None:
    """`tputrace run --tui`: open the saved trace, if there is a terminal to show it on."""
    import sys

    if not _has_terminal():
        print(f"tputrace: --tui needs a terminal; open the trace with: tputrace tui {trace_path}", file=sys.stderr)
        return
    open_ui(trace_path)
