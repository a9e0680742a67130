"""Streaming the `traceEvents` array of a Chrome trace-event JSON file one event at a time, so that
memory stays bounded by one read block however long the array is (plain or gzip-compressed)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tputrace.importers.sources import CaptureError

_BLOCK = 1 << 20
_KEY = '"traceEvents"'
_HEADER_LIMIT = 1 << 22  # the array must start within the first 4 MiB


def _open(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return path.open("r", encoding="utf-8", errors="replace")


def header_and_events(path: Path) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """The top-level scalar fields before `traceEvents` (e.g. `baseTimeNanoseconds`) and an iterator over
    its events. A truncated or foreign file raises `CaptureError` (the iterator raises it when it meets
    the damage)."""
    stream = _open(path)
    try:
        buffer = stream.read(_BLOCK)
        while _KEY not in buffer and len(buffer) < _HEADER_LIMIT:
            more = stream.read(_BLOCK)
            if not more:
                break
            buffer += more
    except (OSError, EOFError, UnicodeDecodeError) as error:
        stream.close()
        raise CaptureError(f"{path} cannot be read ({error})") from None
    start = buffer.find(_KEY)
    bracket = buffer.find("[", start)
    if start < 0 or bracket < 0:
        stream.close()
        raise CaptureError(f"{path} is not a Chrome trace (no traceEvents array)")
    return _header(buffer[:start]), _events(path, stream, buffer, bracket + 1)


def _header(text: str) -> dict[str, Any]:
    """Scalar `"key": value` pairs of the JSON text before the events (the part that parses)."""
    header: dict[str, Any] = {}
    for key in ("baseTimeNanoseconds", "displayTimeUnit", "schemaVersion"):
        at = text.find(f'"{key}"')
        if at < 0:
            continue
        colon = text.find(":", at)
        try:
            header[key], _ = json.JSONDecoder().raw_decode(text, colon + 1 + _spaces(text, colon + 1))
        except json.JSONDecodeError:
            continue
    return header


def _spaces(text: str, position: int) -> int:
    count = 0
    while position + count < len(text) and text[position + count] in " \t\r\n":
        count += 1
    return count


def _events(path: Path, stream: IO[str], buffer: str, position: int) -> Iterator[dict[str, Any]]:
    decoder = json.JSONDecoder()
    at_end = False
    try:
        while True:
            while position < len(buffer) and buffer[position] in " \t\r\n,":
                position += 1
            if position >= len(buffer) - 1 and not at_end:
                buffer, position = buffer[position:], 0
                more = stream.read(_BLOCK)
                at_end = not more
                buffer += more
                continue
            if position < len(buffer) and buffer[position] == "]":
                return
            if position >= len(buffer):
                raise CaptureError(f"{path} is truncated (the traceEvents array never ends)")
            try:
                event, position = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError:
                if at_end:
                    raise CaptureError(f"{path} is truncated or damaged inside traceEvents") from None
                buffer, position = buffer[position:], 0
                more = stream.read(_BLOCK)
                at_end = not more
                buffer += more
                continue
            if isinstance(event, dict):
                yield event
            if position > _BLOCK:
                buffer, position = buffer[position:], 0
    except (OSError, EOFError) as error:
        raise CaptureError(f"{path} cannot be read ({error})") from None
    finally:
        stream.close()
