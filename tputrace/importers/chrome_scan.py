"""The first pass of the torch.profiler JSON importer (`chrome_json`): the capture's start (its earliest `ts`), its
`ProfilerStep#N` ranges, the user's Python frames, the window's ranges (`window_ranges`) and what describes its
collectives, read from the raw text of `traceEvents` with regular expressions; only the events those need are
decoded. Text that does not have the expected shape raises `Irregular`, and the pass decodes every event instead
(`scan_events`).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from tputrace.importers import kineto, window_ranges
from tputrace.importers.json_events import array_trailer, event_lists, event_texts
from tputrace.importers.torch_trace_text import INDUCTOR_CODE
from tputrace.importers.window_ranges import WindowRanges

STEP = re.compile(r"^ProfilerStep#(\d+)$")
_PYTHON_FRAME = re.compile(r"^(.*?)\((\d+)\): (.*)$")
# torch.profiler names a frame's file relative to the `sys.path` entry holding it: the standard library's files come
# as `threading.py`, `multiprocessing/queues.py`, like a script's. Its modules are not the user's code, except names a
# script or a folder of tests is often given.
_STANDARD_LIBRARY = frozenset(sys.stdlib_module_names) - {"test", "tests", "profile", "trace", "code", "this", "main"}
# The patterns over raw text; each match is checked against a count of its key.
# Every `"ts"` key; its number ('' where none follows it: text of another shape).
_TS_TEXT = re.compile(r'"ts"(?:\s*:\s*(-?\d[\d.eE+-]*))?')
_STEP_TEXT = re.compile(r'"name"\s*:\s*"ProfilerStep#\d+"')
_PYTHON_TEXT = re.compile(r'"python_function"\s*,\s*"name"\s*:\s*"([^"\\]*(?:\\.[^"\\]*)*)"')
NUMBER = (int, float)
# A process group's collective as torch.profiler records it on the backend's thread: `gloo:all_reduce`.
COLLECTIVE = re.compile(r"^(gloo|nccl|mpi|ucc|xccl|hccl):(\w+)$")
# A process group's collective recorded on a backend's own thread (gloo's: its time is the collective's).
_BACKEND_TEXT = re.compile(r'"name"\s*:\s*"(?:gloo|mpi|ucc|xccl|hccl):')


class Irregular(Exception):
    """Raw text the first pass's patterns do not fit: the pass decodes the events instead."""


def scan_text(path: Path, parse_float: Any, window: WindowRanges, launching: set[Path],
              trailer: dict[str, Any] | None = None, comms: set[str] | None = None) -> tuple[
        float | None, list[tuple[float, float, int | None]], list[tuple[float, float, Any, str]]]:
    """The first pass over raw text; `Irregular` where an event does not have the expected shape. `trailer`
    gets the header fields after the events, `comms` what describes the collectives (see `kineto.comms_source`)."""
    trailer = {} if trailer is None else trailer
    comms = set() if comms is None else comms
    start_us: float | None = None
    markers: list[tuple[float, float, int | None]] = []
    user_frames: list[tuple[float, float, Any, str]] = []
    user_names: dict[str, str | None] = {}  # a name's raw text -> the name, if it is a user frame's
    decode = json.JSONDecoder(parse_float=parse_float).raw_decode
    text = ""
    for text in event_texts(path):
        stamps = _TS_TEXT.findall(text)
        if "" in stamps:
            raise Irregular
        if stamps:
            earliest = min(map(parse_float, stamps))
            if earliest == 0:  # metadata events (`process_name`) at 0 on a clock that is not the events'
                earliest = min((value for value in map(parse_float, stamps) if value != 0), default=None)
            if earliest is not None:
                start_us = earliest if start_us is None else min(start_us, earliest)
        if path not in launching and '"correlation"' in text:
            launching.add(path)
        if '"Collective name"' in text:
            if kineto.COLLECTIVE_KERNEL_TEXT.search(text):
                comms.add("kernel")
            if kineto.COLLECTIVE_OP_TEXT.search(text):
                comms.add("param")
        if _BACKEND_TEXT.search(text):
            comms.add("backend")
        if "ProfilerStep#" in text:
            for match in _STEP_TEXT.finditer(text):
                event = event_around(text, match, decode)
                if event.get("ph") == "X":
                    markers.append((event["ts"], event["ts"] + number(event.get("dur")), step_number(event)))
        python_events = 0
        for match in _PYTHON_TEXT.finditer(text):
            python_events += 1
            raw = match.group(1)
            if raw.startswith(window_ranges.MODULE_PREFIX):
                window.add_event(event_around(text, match, decode))
                continue
            name = user_names.get(raw, "")
            if name == "":
                name = user_names[raw] = user_frame_name(raw)
            if name is not None:
                event = event_around(text, match, decode)
                if event.get("name") != name or event.get("cat") != "python_function":
                    raise Irregular
                user_frames.append((event["ts"], event["ts"] + number(event.get("dur")), event.get("tid"), name))
        window.scan_text(text, lambda block, match: event_around(block, match, decode), user=not markers)
        if python_events != text.count('"python_function"'):
            raise Irregular
    trailer.update(array_trailer(text))
    return start_us, markers, user_frames

def scan_events(path: Path, parse_float: Any, window: WindowRanges, launching: set[Path],
                trailer: dict[str, Any] | None = None, comms: set[str] | None = None) -> tuple[
        float | None, list[tuple[float, float, int | None]], list[tuple[float, float, Any, str]]]:
    """The first pass over decoded events (for text the patterns do not fit)."""
    comms = set() if comms is None else comms
    start_us: float | None = None
    markers: list[tuple[float, float, int | None]] = []
    user_frames: list[tuple[float, float, Any, str]] = []
    for events in event_lists(path, parse_float=parse_float, trailer=trailer):
        for event in events:
            if not isinstance(event, dict):
                continue
            ts = event.get("ts")
            if not isinstance(ts, NUMBER):
                continue
            if ts != 0:
                start_us = ts if start_us is None else min(start_us, ts)
            name = str(event.get("name", ""))
            if "correlation" in args_of(event):
                launching.add(path)
            if kineto.COLLECTIVE_ARG in args_of(event) and (event.get("cat") == "kernel" or name == "record_param_comms"):
                comms.add("kernel" if event.get("cat") == "kernel" else "param")
            if COLLECTIVE.match(name) and not name.startswith("nccl:"):
                comms.add("backend")
            if event.get("cat") == "python_function" and is_user_frame(name):
                user_frames.append((ts, ts + number(event.get("dur")), event.get("tid"), name))
            if event.get("ph") == "X" and STEP.match(name):
                markers.append((ts, ts + number(event.get("dur")), step_number(event)))
            window.add_event(event)
    return start_us, markers, user_frames


def event_around(text: str, match: re.Match[str], decode: Any) -> dict[str, Any]:
    """The event whose top-level key `match` found (the object starting at the nearest `{` before it), decoded by
    `decode` (a `JSONDecoder`'s `raw_decode`)."""
    start = text.rfind("{", 0, match.start())
    try:
        event, end = decode(text, start)
    except (json.JSONDecodeError, ValueError):
        raise Irregular from None
    if start < 0 or end < match.end() or not isinstance(event, dict) or not isinstance(event.get("ts"), NUMBER):
        raise Irregular
    return event


def user_frame_name(raw: str) -> str | None:
    """The name whose JSON string text is `raw`, if it names a user frame; None otherwise."""
    name = json.loads(f'"{raw}"') if "\\" in raw else raw
    return name if is_user_frame(name) else None


def is_user_frame(name: str) -> bool:
    """Whether a `python_function` event's name (`file.py(LINE): function`) is a frame of the user's code."""
    match = _PYTHON_FRAME.match(name)
    if match is None:
        return False
    file = match.group(1)
    if file.split("/", 1)[0].removesuffix(".py") in _STANDARD_LIBRARY:
        return False
    return not (file.startswith(("torch/", "<")) or "site-packages" in file or "/lib/python" in file
                or INDUCTOR_CODE.search(file))


def step_number(event: dict[str, Any]) -> int | None:
    """N of a `ProfilerStep#N` event."""
    match = STEP.match(str(event.get("name", "")))
    return int(match.group(1)) if match else None


def number(value: Any) -> float:
    """A JSON number as a float; 0.0 for anything else (a missing `dur`)."""
    return float(value) if isinstance(value, NUMBER) else 0.0


def args_of(event: dict[str, Any]) -> dict[str, Any]:
    """An event's `args` object; empty where it has none."""
    args = event.get("args")
    return args if isinstance(args, dict) else {}
