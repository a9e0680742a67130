"""Finding the captures under the paths given to `tputrace import`, and telling their formats apart."""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tputrace.store.errors import TputraceError

XPLANE = "xplane"
TORCH_TRACE = "torch_trace"
CHROME_JSON = "torch_profiler_json"

_HEAD_BYTES = 512
# A TORCH_TRACE record's glog prefix (`V1206 15:24:45.403000 1667746 torch/_dynamo/utils.py:1045] {`), whatever the
# file's name (`.log`, `.txt`), on one of its first lines.
_TORCH_TRACE_HEAD = re.compile(rb"(?m)^[VIWEF]\d{4} \d\d:\d\d:\d\d(\.\d+)? +\d+ [^\]\n]*\] \{")
# Top-level keys a torch.profiler trace starts with: Kineto writes its header (`schemaVersion`, `deviceProperties`,
# `distributedInfo` with a process group's every rank, ...) before `traceEvents`, which may come kilobytes later.
_PROFILER_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"')


class CaptureError(TputraceError):
    """A capture that cannot be imported (foreign, truncated or damaged): one line for the user."""


@dataclass(frozen=True)
class Capture:
    """One capture file and its detected format."""

    path: Path
    format: str
    folder: Path | None = None  # the directory given to the import that it was found in; None: given by name


def find_captures(paths: list[str]) -> list[Capture]:
    """Every capture under `paths` (files, or directories searched recursively), in a stable order.

    A file given by name that is no known format is an error; files in a directory that are not
    captures (caches, `*.trace.json.gz` beside an `xplane.pb`) are skipped."""
    captures: list[Capture] = []
    for text in paths:
        path = Path(text)
        if not path.exists():
            raise CaptureError(f"{path}: no such file or directory")
        if path.is_dir():
            found = [Capture(file, fmt, path) for file in sorted(path.rglob("*"), key=_natural) if file.is_file()
                     for fmt in [_detect(file, strict=False)] if fmt is not None]
            if not found:
                raise CaptureError(f"{path}: holds no xplane.pb, TORCH_TRACE log or torch.profiler JSON")
            captures += found
        else:
            fmt = _detect(path, strict=True)
            assert fmt is not None
            captures.append(Capture(path, fmt))
    # A file named twice (by name and in its directory, or twice by name) is one capture, imported once.
    unique: dict[Path, Capture] = {}
    for capture in captures:
        unique.setdefault(capture.path.resolve(), capture)
    return list(unique.values())


def _natural(path: Path) -> list[Any]:
    """A sort key that orders numbers in names by value (`rank_2` before `rank_10`, `host-9` before `host-10`)."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", str(path))]


def _detect(path: Path, *, strict: bool) -> str | None:
    name = path.name
    if name.endswith(".xplane.pb"):
        return XPLANE
    head = _head(path)
    if _TORCH_TRACE_HEAD.search(head):
        return TORCH_TRACE
    json_object = name.endswith((".json", ".json.gz")) and head.lstrip().startswith(b"{")
    if json_object and any(key in head for key in _PROFILER_KEYS):
        # XProf writes a `*.trace.json.gz` beside each `xplane.pb`: the same events, read from the latter.
        if not strict and _in_xplane_folder(path):
            return None
        return CHROME_JSON
    if strict and not head:
        raise CaptureError(f"{path} is empty")
    if json_object and b'"nodes"' in head and b'"schema"' in head and strict:
        raise CaptureError(f"{path}: a PyTorch execution trace (ExecutionTraceObserver), not a torch.profiler trace; "
                           "import the torch.profiler trace recorded with it")
    if strict:
        raise CaptureError(f"{path}: not an xplane.pb, TORCH_TRACE log or torch.profiler JSON trace")
    return None


def _in_xplane_folder(path: Path) -> bool:
    return any(sibling.name.endswith(".xplane.pb") for sibling in path.parent.iterdir())


def _head(path: Path) -> bytes:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as stream:
                return stream.read(_HEAD_BYTES)
        with path.open("rb") as stream:
            return stream.read(_HEAD_BYTES)
    except (OSError, EOFError) as error:
        raise CaptureError(f"{path}: cannot be read: {error}") from None
