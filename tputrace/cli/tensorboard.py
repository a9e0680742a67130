"""`tputrace tensorboard TRACE [--port P]`: open a trace in XProf (TensorBoard's profile tool).

Exports the trace to a temporary logdir and serves it with xprof's own web app, bound to
127.0.0.1 only (xprof's `xprof` command binds every interface and opens a gRPC port; this does
neither). Prints the URL; Ctrl-C (or SIGTERM) stops the server and removes the logdir.

The server shows that logdir and nothing else: xprof's `session_path` and `run_path` parameters
(which read any profile folder on the machine) and run names that climb out of the logdir are
refused, and so is a request whose `Host` is not the bound address or localhost (a web page whose
name was rebound to 127.0.0.1 must not read the trace).
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from tputrace.store.errors import TputraceError

HOST = "127.0.0.1"
DEFAULT_PORT = 6006
LOCAL_NAMES = (HOST, "localhost")
PATH_PARAMETERS = ("session_path", "run_path")  # xprof reads the folder they name, wherever it is
NAME_PARAMETERS = ("run", "host", "tag")  # names under the logdir


def prepare_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "tensorboard",
        help="open a trace in XProf (TensorBoard's profiler) on 127.0.0.1",
        description="Export a trace to a temporary logdir and serve it with XProf on 127.0.0.1; Ctrl-C stops it.",
    )
    parser.add_argument("trace", help="a .tptrace file")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port on 127.0.0.1 (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--target", metavar="CHIP", default=None,
                        help="TPU whose peaks XProf shows and op times are estimated for (default: v6e, the one `tputrace report` uses)")
    return parser


def run(args: argparse.Namespace) -> int:
    from tputrace.store.reader import open_trace
    from tputrace.viewers.export import xplane

    if not 0 <= args.port <= 65535:
        raise TputraceError(f"--port {args.port} is not a port number (0-65535)")
    _quiet_xprof_logs()  # before xprof is imported: its import logs at INFO
    _require_xprof()
    # SIGTERM (kill, a closing terminal's supervisor) stops the export like Ctrl-C, so the logdir goes too.
    signal.signal(signal.SIGTERM, _interrupt)
    with tempfile.TemporaryDirectory(prefix="tputrace-xprof-") as logdir:
        with open_trace(args.trace) as trace:
            exports = xplane.export_tensorboard(trace, logdir, target=args.target or xplane.DEFAULT_TARGET)
        run_name = exports[0].path.parent.name if exports else "run"
        server = XProfServer(Path(logdir), args.port)
        print(f"tputrace: exported to {logdir}", file=sys.stderr)
        print(f"tputrace: XProf is serving {args.trace} (run {run_name}) at {server.url}", file=sys.stderr)
        print("tputrace: op times inside programs are estimates; press Ctrl-C to stop", file=sys.stderr)
        _serve_until_stopped(server)
        print("tputrace: stopped", file=sys.stderr)
    return 0


def _serve_until_stopped(server: XProfServer) -> None:
    """Serve from a thread until Ctrl-C or SIGTERM, then stop the server from this one.

    The signals only set a flag: a KeyboardInterrupt raised inside cheroot's serving loop can leave
    its locks held, and stopping the server then hangs.
    """
    stop_requested = threading.Event()
    errors: list[BaseException] = []

    def request_stop(signum: int, frame: object) -> None:
        stop_requested.set()

    previous = {stop_signal: signal.signal(stop_signal, request_stop) for stop_signal in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start_in_thread(on_error=errors.append)
        while not stop_requested.wait(0.25) and server.serving:
            pass
    finally:
        server.stop()
        for stop_signal, handler in previous.items():
            signal.signal(stop_signal, handler)
    if errors:
        raise TputraceError(f"the XProf server stopped: {errors[0]}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _require_xprof() -> None:
    import importlib.util

    if importlib.util.find_spec("xprof") is None or importlib.util.find_spec("cheroot") is None:
        raise TputraceError("tputrace tensorboard needs xprof: pip install 'tputrace[views]' (or pip install xprof)")


class XProfServer:
    """xprof's profile plugin behind a WSGI server on 127.0.0.1, for one logdir.

    `port` 0 picks a free port; a busy port is an error naming it. `start_in_thread` serves from a
    daemon thread (the socket is bound, so connections queue until it runs); `stop` ends it.
    """

    def __init__(self, logdir: Path, port: int = 0, *, quiet: bool = True) -> None:
        if quiet:
            _quiet_xprof_logs()  # before importing xprof: its import logs at INFO
        from cheroot import wsgi
        from xprof import server as xprof_server

        self.logdir = logdir
        if port and not _port_is_free(port):
            raise TputraceError(f"port {port} on {HOST} is in use; choose another with --port (0 picks a free one)")
        context = xprof_server.TBContext(str(logdir), xprof_server.DataProvider(str(logdir)), xprof_server.TBContext.Flags(False))
        plugin = xprof_server.ProfilePluginLoader().load(context)
        if plugin is None:
            raise TputraceError("xprof's profile plugin could not be loaded")
        if quiet:
            _quiet_xprof_logs()  # after loading: loading the plugin sets its loggers' levels
        app = _app_without_request_lines(xprof_server.make_wsgi_app, plugin) if quiet else xprof_server.make_wsgi_app(plugin)
        self._server = wsgi.Server((HOST, port), OnlyThisLogdir(app, lambda: self.port))
        self._server.prepare()  # binds now, so that the port (also a chosen free one) is known
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.bind_addr[1])

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    @property
    def serving(self) -> bool:
        """Whether the thread of `start_in_thread` is serving."""
        return self._thread is not None and self._thread.is_alive()

    def start_in_thread(self, on_error: Callable[[BaseException], None] | None = None) -> None:
        def serve() -> None:
            try:
                self._server.serve()
            except BaseException as error:  # reported to the caller's handler, never swallowed silently
                if on_error is not None:
                    on_error(error)
                raise

        self._thread = threading.Thread(target=serve, name="xprof-server", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)


class OnlyThisLogdir:
    """WSGI middleware in front of xprof: answers 403 to a request whose `Host` is not this server's
    (127.0.0.1 or localhost, at its port), that names a folder (`session_path`, `run_path`), or whose
    run, host or tag name is a path out of the logdir."""

    def __init__(self, app: Callable[..., Iterable[bytes]], port: Callable[[], int]) -> None:
        self._app = app
        self._port = port

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        refusal = self.refusal(environ)
        if refusal is not None:
            body = f"{refusal}\n".encode()
            start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
            return [body]
        return self._app(environ, start_response)

    def refusal(self, environ: dict[str, Any]) -> str | None:
        """Why the request is refused, or None."""
        host = str(environ.get("HTTP_HOST", "")).strip().lower()
        allowed = {name for local in LOCAL_NAMES for name in (local, f"{local}:{self._port()}")}
        if host not in allowed:
            return f"this server answers requests for {HOST}:{self._port()} and localhost:{self._port()} only"
        query = urllib.parse.parse_qs(str(environ.get("QUERY_STRING", "")), keep_blank_values=True)
        named = [name for name in PATH_PARAMETERS if name in query]
        if named:
            return f"this server shows its own trace only; {named[0]} is not served"
        for name in NAME_PARAMETERS:
            for value in query.get(name, []):
                parts = PurePosixPath(value.replace("\\", "/")).parts
                if value.startswith(("/", "\\")) or ".." in parts:
                    return f"{name}={value!r} is not a name under this server's logdir"
        return None


class _QuietFilter(logging.Filter):
    """Keeps xprof's warnings and errors, except its report (with a traceback) that a fresh logdir has
    no tools cache yet. A filter, not only a level: xprof sets its logger's level to INFO on import."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING and ".cached_tools.json" not in record.getMessage()


def _app_without_request_lines(make_wsgi_app: Callable[[Any], Any], plugin: Any) -> Any:
    """xprof's WSGI app without the JSON line per request that xprof writes to stderr for Cloud Logging
    (its routes are wrapped by `_logging_wrapper` when the app is made; that wrapper is left out here)."""
    from xprof import profile_plugin

    wrap = getattr(profile_plugin, "_logging_wrapper", None)
    if wrap is None:
        return make_wsgi_app(plugin)
    profile_plugin._logging_wrapper = lambda app, *args, **kwargs: app
    try:
        return make_wsgi_app(plugin)
    finally:
        profile_plugin._logging_wrapper = wrap


def _quiet_xprof_logs() -> None:
    """xprof logs every request at INFO; keep its warnings and errors, except an empty cache's."""
    profile_logger = logging.getLogger("tensorboard.plugins.profile")
    profile_logger.setLevel(logging.WARNING)
    if not any(isinstance(existing, _QuietFilter) for existing in profile_logger.filters):
        profile_logger.addFilter(_QuietFilter())
    for name in ("tensorboard", "tensorboard-plugin-profile"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True
