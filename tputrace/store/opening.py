"""Opening a trace file read-only, with one clear sentence for every way that can fail."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

from tputrace.schema import FORMAT_VERSION, MAGIC
from tputrace.store.errors import TraceError

_SQLITE_HEADER = b"SQLite format 3\x00"
_HEADER_SIZE = 100


def check_trace_file(path: Path) -> None:
    """Raise `TraceError` unless `path` is a readable, complete SQLite file (cheap header checks)."""
    if not path.exists():
        raise TraceError(f"no such trace file: {path}")
    if path.is_dir():
        raise TraceError(f"{path} is a directory, not a trace file")
    try:
        is_regular = stat.S_ISREG(path.stat().st_mode)
    except OSError as error:
        raise TraceError(f"cannot read {path}: {error.strerror or error}") from None
    if not is_regular:  # a pipe or a device: reading it could wait forever
        raise TraceError(f"{path} is not a regular file (a pipe, a device or a socket), not a trace file")
    try:
        with path.open("rb") as trace_file:
            header = trace_file.read(_HEADER_SIZE)
    except OSError as error:
        raise TraceError(f"cannot read {path}: {error.strerror or error}") from None
    if not header:
        raise TraceError(f"{path} is empty, not a trace file")
    if not header.startswith(_SQLITE_HEADER):
        if _SQLITE_HEADER.startswith(header):
            raise TraceError(f"{path} is truncated ({len(header)} bytes)")
        raise TraceError(f"{path} is not a tputrace trace (not an SQLite file)")
    if len(header) < _HEADER_SIZE:
        raise TraceError(f"{path} is truncated ({len(header)} bytes)")
    expected_size = _expected_size(header)
    has_wal = Path(f"{path}-wal").exists()
    actual_size = path.stat().st_size
    if expected_size is not None and not has_wal and actual_size < expected_size:
        raise TraceError(f"{path} is truncated ({actual_size} of {expected_size} bytes)")


def _expected_size(header: bytes) -> int | None:
    """The file size the SQLite header promises, or None where the header does not say."""
    page_size = int.from_bytes(header[16:18], "big")
    if page_size == 1:
        page_size = 65536
    page_count = int.from_bytes(header[28:32], "big")
    change_counter = header[24:28]
    version_valid_for = header[92:96]
    if page_count == 0 or change_counter != version_valid_for:
        return None
    return page_size * page_count


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection; a leftover -wal from a killed writer is read, not modified."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
        connection.execute("PRAGMA query_only = ON")
    except sqlite3.Error as error:
        raise TraceError(f"cannot open {path}: {error}") from None
    return connection


def read_meta(connection: sqlite3.Connection, path: Path) -> dict[str, str]:
    """The meta table, after checking the magic and that this tputrace reads the format version."""
    try:
        meta = dict(connection.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.OperationalError as error:
        if "no such table" in str(error):
            raise TraceError(f"{path} is not a tputrace trace (an SQLite file without trace metadata)") from None
        raise describe_database_error(error, path) from None
    except (sqlite3.DatabaseError, UnicodeDecodeError) as error:
        raise describe_database_error(error, path) from None
    if meta.get("magic") != MAGIC:
        raise TraceError(f"{path} is not a tputrace trace (an SQLite file without the tputrace magic)")
    try:
        format_version = int(meta.get("format_version", ""))
    except ValueError:
        raise TraceError(f"{path} has an unreadable format version {meta.get('format_version')!r}") from None
    if format_version > FORMAT_VERSION:
        raise TraceError(
            f"{path} was written by a newer tputrace (format {format_version}, this reads up to {FORMAT_VERSION})"
        )
    if format_version < 1:
        raise TraceError(f"{path} has an unsupported format version {format_version}")
    return meta


def describe_database_error(error: sqlite3.Error | UnicodeDecodeError, path: Path) -> TraceError:
    """Turn an SQLite error met while reading into a one-sentence `TraceError`. A damaged schema can make SQLite's
    own error message bytes that are not UTF-8, which Python raises as a `UnicodeDecodeError` instead."""
    if isinstance(error, UnicodeDecodeError):
        return TraceError(f"{path} is corrupt (SQLite's error message about it is not even valid text)")
    message = str(error)
    if "not a database" in message:
        return TraceError(f"{path} is not a tputrace trace (not an SQLite file)")
    if "malformed" in message or "corrupt" in message:
        return TraceError(f"{path} is corrupt or truncated ({message})")
    return TraceError(f"cannot read {path}: {message}")
