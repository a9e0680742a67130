"""Where a command may write a file: never over one of its own inputs, and over an existing file only
when it is an earlier output of the same kind (a trace, a report, an export), unless `--force`.

Every command that writes a file checks its output here before it reads or runs anything
(`check_output`), and writes inside `writing(...)`, which turns a failure to write (a read-only
folder, a full disk, a path under /proc) into one line: `TputraceError`, exit status 2.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tputrace.store.errors import TputraceError

_HEAD_BYTES = 4096
_TRACE_SCAN_BYTES = 1 << 16  # the meta table sits in the first pages
FORCE_HELP = "overwrite an existing output file even when it is not an earlier output of the same kind"


@dataclass(frozen=True)
class OutputKind:
    """A kind of file a command writes: its name in messages, and how to recognise an earlier one from
    its first bytes (of its content, for a gzip file) and its path."""

    name: str
    recognises: Callable[[bytes, Path], bool]


def _is_trace(head: bytes, path: Path) -> bool:
    """An SQLite file with tputrace's magic in its meta table: in the file, or still in the `-wal`
    beside it (a trace whose writer was killed, or ran out of disk)."""
    from tputrace.schema import MAGIC

    if not head.startswith(b"SQLite format 3\x00"):
        return False
    for candidate in (path, path.with_name(f"{path.name}-wal")):
        try:
            with candidate.open("rb") as stream:
                if MAGIC.encode() in stream.read(_TRACE_SCAN_BYTES):
                    return True
        except OSError:
            continue
    return False


def _is_report(head: bytes, path: Path) -> bool:
    return head.lstrip().lower().startswith(b"<!doctype html") and b'content="tputrace' in head


def _is_perfetto(head: bytes, path: Path) -> bool:
    return head.startswith(b'{"displayTimeUnit"') and b'"exporter":"tputrace"' in head


TRACE = OutputKind("tputrace trace", _is_trace)
HTML_REPORT = OutputKind("tputrace HTML report", _is_report)
PERFETTO = OutputKind("tputrace Perfetto export", _is_perfetto)


def check_output(path: Path, kind: OutputKind, *, inputs: Iterable[Path] = (), force: bool = False, option: str = "-o") -> None:
    """Raise `TputraceError` unless `path` can take the output: not one of `inputs`, not a folder or a
    special file, in a folder that exists, and, if it exists, an earlier output of `kind` (or `force`)."""
    for input_path in inputs:
        if _same_file(path, input_path):
            raise TputraceError(f"{option} {path} is the input {input_path}: give another output path")
    if path.is_dir():
        raise TputraceError(f"{option} {path} is a directory; give a file name")
    parent = path.parent
    if not parent.exists():
        raise TputraceError(f"cannot write {option} {path}: no directory {parent} (it does not exist)")
    if not parent.is_dir():
        raise TputraceError(f"cannot write {option} {path}: {parent} is a file, not a folder")
    if not path.exists() and not path.is_symlink():
        return
    try:
        mode = path.stat().st_mode
    except OSError as error:
        raise TputraceError(f"cannot write {option} {path}: {error.strerror or error}") from None
    if not stat.S_ISREG(mode):
        raise TputraceError(f"{option} {path} is not a regular file (a pipe, a device or a socket); give a file name")
    if force or _holds(path, kind):
        return
    raise TputraceError(f"{option} {path} exists and is not a {kind.name}; pass --force to overwrite it, or give another path")


@contextlib.contextmanager
def writing(option: str, path: Path | str) -> Iterator[None]:
    """Turn a failure to write `path` (a read-only folder, a full disk) into a one-line error."""
    try:
        yield
    except OSError as error:
        where = f" ({error.filename})" if error.filename and str(error.filename) != str(path) else ""
        raise TputraceError(f"cannot write {option} {path}: {error.strerror or error}{where}") from None


def _same_file(output: Path, input_path: Path) -> bool:
    try:
        if output.exists() and input_path.exists():
            return os.path.samefile(output, input_path)
    except OSError:
        pass
    return output.resolve() == input_path.resolve()


def _holds(path: Path, kind: OutputKind) -> bool:
    """Whether the file at `path` is an earlier output of `kind` (an empty file counts as one)."""
    head = _head(path)
    return head is not None and (not head or kind.recognises(head, path))


def _head(path: Path) -> bytes | None:
    """The first bytes of the file (of its content for a gzip file), or None where they cannot be read."""
    try:
        with path.open("rb") as stream:
            head = stream.read(_HEAD_BYTES)
        if head.startswith(b"\x1f\x8b"):
            with gzip.open(path, "rb") as stream:
                head = stream.read(_HEAD_BYTES)
    except (OSError, EOFError):
        return None
    return head
