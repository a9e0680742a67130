"""Streaming the `traceEvents` array of a Chrome trace-event JSON file (plain or gzip-compressed) in blocks
of about a megabyte, so that memory stays bounded by one block however long the array is.

`event_texts` yields the array's raw text cut after an event's closing `}` (for cheap scans with regular
expressions); `event_lists` decodes each block with one `json.loads` call, with the garbage collector
paused (decoding makes many small containers and no reference cycles). A cut that falls inside an event
(a `},` within a nested value) makes that block's decode fail; the block is then decoded event by event
and the incomplete rest waits for the next block.
"""

from __future__ import annotations

import gc
import gzip
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from tputrace.importers.sources import CaptureError

_BLOCK = 1 << 20
_KEY = '"traceEvents"'
_HEADER_LIMIT = 1 << 22  # the array must start within the first 4 MiB
_SEPARATORS = " \t\r\n,"
# Undecodable text carried over this many blocks: the array is damaged, not waiting for its next block.
_DAMAGED_AFTER = 4
# The start of an event in Kineto's layout (each event's `{` on a line of its own, indented two spaces).
_EVENT_START = re.compile(r"\n  \{\s*\n")
# Per file, the events that did not decode and were skipped: torch.profiler writes some Python frames' names
# unescaped (`"name": "torch/_inductor/debug.py(0):         """"`); the import warns of them.
skipped_events: dict[str, int] = {}


def _open(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return path.open("r", encoding="utf-8", errors="replace")


def read_head(path: Path) -> str:
    """The first block of the file's text."""
    stream, buffer, _ = _open_array(path)
    stream.close()
    return buffer


def read_header(path: Path) -> dict[str, Any]:
    """Some top-level fields before `traceEvents`: `baseTimeNanoseconds`, `distributedInfo`..."""
    stream, buffer, start = _open_array(path)
    stream.close()
    return _header(buffer[:start])


def event_texts(path: Path, block: int | None = None) -> Iterator[str]:
    """The raw text of the `traceEvents` array in blocks, each but the last ending just after a `}` that is
    followed by a comma (so, in a well-formed file, after an event). The last block holds the array's end
    and whatever follows it."""
    block = block or _BLOCK
    stream, buffer, start = _open_array(path)
    buffer = buffer[buffer.find("[", start) + 1:]
    try:
        at_end = False
        while True:
            if len(buffer) < block and not at_end:
                more = stream.read(block)
                at_end = not more
                buffer += more
                continue
            if at_end:
                yield buffer
                return
            cut = buffer.rfind("},")
            if cut < 0:  # one event longer than a block: read on
                more = stream.read(block)
                at_end = not more
                buffer += more
                continue
            yield buffer[:cut + 1]
            buffer = buffer[cut + 1:]
    except (OSError, EOFError) as error:
        raise CaptureError(f"{path} cannot be read ({error})") from None
    finally:
        stream.close()


def array_trailer(text: str) -> dict[str, Any]:
    """Header fields written after the `traceEvents` array (Kineto writes `baseTimeNanoseconds` there), read from
    the array's last block (`event_texts`'s last)."""
    _, position, ended = _decode_one_by_one(text, 0, None, [0])
    return _header(text[position + 1:]) if ended else {}


def event_lists(path: Path, block: int | None = None, parse_float: Callable[[str], float] | None = None,
                trailer: dict[str, Any] | None = None) -> Iterator[list[Any]]:
    """The events of the `traceEvents` array, a block's worth per list (elements that are not objects
    included: callers skip them), their floats read by `parse_float` (`float` when None); `trailer` gets the
    header fields after the array. A truncated or damaged array raises `CaptureError`."""
    block = block or _BLOCK
    pending = ""
    skipped = [0]
    for text in event_texts(path, block):
        text = pending + text
        pending = ""
        position = _skip_separators(text, 0)
        if position < len(text) and text[position] == "]":
            return
        collecting = gc.isenabled()
        gc.disable()
        try:
            events = json.loads(f"[{text[position:]}]", parse_float=parse_float)
            ended = False
        except json.JSONDecodeError:
            events, position, ended = _decode_one_by_one(text, position, parse_float, skipped)
            skipped_events[str(path)] = max(skipped_events.get(str(path), 0), skipped[0])
        else:
            position = len(text)
        finally:
            if collecting:
                gc.enable()
        yield events
        if ended:
            if trailer is not None:
                trailer.update(_header(text[position + 1:]))
            return
        pending = text[position:]
        if len(pending) > _DAMAGED_AFTER * block:
            raise CaptureError(f"{path} is damaged inside traceEvents (no event decodes)")
    raise CaptureError(f"{path} is truncated or damaged inside traceEvents (the array never ends)")


def _decode_one_by_one(text: str, position: int, parse_float: Callable[[str], float] | None,
                       skipped: list[int]) -> tuple[list[Any], int, bool]:
    """Events decoded from `position` on until the array's end (True) or an incomplete event (False). An event (an
    object) that does not decode though another starts after it (in Kineto's layout) is skipped, and counted in
    `skipped`; other text between events is damage."""
    decode = json.JSONDecoder(parse_float=parse_float).raw_decode
    events = []
    while True:
        position = _skip_separators(text, position)
        if position >= len(text):
            return events, position, False
        if text[position] == "]":
            return events, position, True
        try:
            event, position = decode(text, position)
        except json.JSONDecodeError:
            following = _EVENT_START.search(text, position + 1) if text[position] == "{" else None
            if following is None:  # the block's incomplete last event, or text that is no event at all
                return events, position, False
            skipped[0] += 1
            position = following.start()
            continue
        events.append(event)


def _skip_separators(text: str, position: int) -> int:
    while position < len(text) and text[position] in _SEPARATORS:
        position += 1
    return position


def _open_array(path: Path) -> tuple[IO[str], str, int]:
    """The open stream, the text read so far and where `"traceEvents"` starts in it."""
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
    if start < 0 or buffer.find("[", start) < 0:
        stream.close()
        raise CaptureError(f"{path} is not a Chrome trace (no traceEvents array)")
    return stream, buffer, start


def _header(text: str) -> dict[str, Any]:
    """Some `"key": value` pairs of the JSON text before the events (the part that parses)."""
    header: dict[str, Any] = {}
    for key in ("baseTimeNanoseconds", "displayTimeUnit", "schemaVersion", "distributedInfo", "deviceProperties"):
        at = text.find(f'"{key}"')
        if at < 0:
            continue
        colon = text.find(":", at)
        try:
            header[key], _ = json.JSONDecoder().raw_decode(text, _skip_separators(text, colon + 1))
        except json.JSONDecodeError:
            continue
    return header
