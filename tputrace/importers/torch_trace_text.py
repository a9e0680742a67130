"""What the text of a `TORCH_TRACE` log says: glog prefix times, graph-break and recompile reasons, failures, and
whether a file is the user's code or a library's (torch's own among them, installed or a source checkout)."""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from pathlib import Path

# A glog prefix: level, MMDD, time of day, thread id, the logging file, then the JSON envelope.
ENVELOPE = re.compile(r"^[VIWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d(?:\.\d+)?) +(\d+) [^\]]*\] (\{.*\})\s*$")
_USER_FRAME = re.compile(r'^\s*File "(.*)", line (\d+), in (.*)$')
_BREAK_AT = re.compile(r"Graph break in user code at (.*):(\d+)")
_REASON_LINE = "Graph Break Reason: "
# A preamble that says Dynamo gave up on the whole function (it runs eagerly, no graph), and what the reason says.
_SKIPPED = "Skipping the function and falling back to eager"
_SKIPPED_NOTE = "; the function runs eagerly"
# One failed guard of a `recompile_reason`: `0/1: <guard>  # <source line>  # <short path>:<line> in <fn>`.
# A failed guard with its comment: `0/0: L['x'].size()[0] == 4  # code  # file.py:LINE in fn`, where the code may hold a
# comment of its own and the place a shortened path (Dynamo keeps its end); a guard on a value that code computed adds
# the place in torch that evaluated it: `… in fn (_dynamo/variables/tensor.py:2606 in evaluate_expr)`.
_GUARD_COMMENT = re.compile(r"^(\d+/\d+: .*?)\s+#\s*(.*?)\s+#\s*(\S+):(\d+) in (\S+)(?:\s+\([^()]*\))?\s*$")
# The code object Dynamo makes to resume a function after a graph break: `torch_dynamo_resume_in_<fn>_at_<line>`.
_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_(\d+)$")
# torch's own code in a source checkout (`.../pytorch/torch/_dynamo/external_utils.py`), not installed as a package.
_TORCH_SOURCE = re.compile(r"/torch/(_[a-z]\w*|nn|optim|utils|distributed|autograd|fx|ao|amp|export|cuda|testing|"
                           r"functional|library|overrides|random|serialization)(/|\.py$)")


@dataclass
class GraphBreak:
    """One graph break: its compile, reason and the user's frame that broke the graph."""

    compile_id: str
    reason: str
    file: str | None
    line: int | None
    function: str


def glog_seconds(match: re.Match[str]) -> float:
    """The time of a record's glog prefix, in seconds on a clock of its own: the prefix has no year (and its time
    zone is the machine's), so only differences between records are meaningful until anchored to a Unix time."""
    month, day, hour, minute = (int(match.group(index)) for index in range(1, 5))
    try:
        midnight = calendar.timegm((2000, month, day, 0, 0, 0))  # 2000, a leap year: 29 February exists
    except ValueError:
        midnight = 0
    return midnight + hour * 3600 + minute * 60 + float(match.group(5))


def graph_break(compile_id: str, payload: list[str]) -> GraphBreak:
    """The reason and user frame of one `dynamo_graph_break_reason` payload: the innermost frame of the user's code
    in its traceback; where the break is in a library's code (torch's optimizer), the reason names that place."""
    reason = ""
    file: str | None = None
    line: int | None = None
    function = ""
    frames: list[tuple[str, int, str]] = []
    in_user_traceback = False
    for index, text in enumerate(payload):
        at = _BREAK_AT.search(text)
        if at and file is None:
            file, line = at.group(1), int(at.group(2))
        if text.startswith(_REASON_LINE) and not reason:
            reason = text[len(_REASON_LINE):].strip()
            if not reason or reason.endswith(":"):
                # A preamble ("Encountered graph break when attempting to trace CALL: ...:", "Failed to handle
                # graph break gracefully. Skipping the function ...:"): the reason proper is the next line.
                rest = [part.strip() for part in payload[index + 1:index + 4] if part.strip()]
                skipped = _SKIPPED in reason
                reason = rest[0] if rest else reason
                if skipped:
                    reason += _SKIPPED_NOTE
        if text.startswith("User code traceback:"):
            in_user_traceback = True
        elif in_user_traceback:
            frame = _USER_FRAME.match(text)
            if frame:
                frames.append((frame.group(1), int(frame.group(2)), frame.group(3)))
            elif not text.startswith(" "):
                in_user_traceback = False
    reason = reason or "graph break"
    if frames:
        file, line, function = frames[-1]
        users = [frame for frame in frames if not is_library(frame[0])]
        if users and users[-1] != frames[-1]:
            reason += f" (in {Path(file).name}:{line}, {function})"
            file, line, function = users[-1]
    return GraphBreak(compile_id, reason, file, line, function)


def resumed_break(compile_id: str, name: str, file: str | None) -> GraphBreak | None:
    """The graph break that a resume function's name tells (`torch_dynamo_resume_in_f_at_12`: `f` broke its graph
    at line 12), for logs that do not write each break's reason."""
    match = _RESUME.match(name)
    if match is None or not file:
        return None
    return GraphBreak(compile_id, "graph break", file, int(match.group(2)), match.group(1))


def recompile_diff(reason: str) -> str:
    """A `recompile_reason` as one line per failed guard: the guard, then the source line and place it guards
    (from the guard's comment and the "User stack trace" after it, whose path is not shortened)."""
    guards: list[list[str]] = []
    lines = reason.splitlines()
    for index, text in enumerate(lines):
        match = _GUARD_COMMENT.match(text)
        if match:
            # Where no "User stack trace" follows, the comment's own place (its file's base name: Dynamo shortens paths).
            guards.append([match.group(1), match.group(2),
                           f" at {match.group(3).rsplit('/', 1)[-1]}:{match.group(4)} in {match.group(5)}"])
        elif re.match(r"^\d+/\d+: ", text):
            guards.append([text.strip(), "", ""])
        elif guards and text.strip() == "User stack trace:":
            frames = [_USER_FRAME.match(line) for line in lines[index + 1:]]
            place = next((frame for frame in reversed(frames) if frame), None)
            if place and guards[-1][1]:
                guards[-1][2] = f" at {place.group(1)}:{place.group(2)} in {place.group(3)}"
    if not guards:
        return reason.strip()
    return "\n".join(f"{guard} ({source}{place})" if source else guard for guard, source, place in guards)


def first_sentence(text: str) -> str:
    """The line of a failure or restart reason that says what happened: its first, or, where that is only a
    preamble ending in `:` (`backend='x' raised:`), it and the line after it."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


# The Python code Inductor generates for a compiled graph: its cache directory's modules (`/tmp/torchinductor_<user>/`,
# or `$TORCHINDUCTOR_CACHE_DIR`'s `7e/c7epy…vo.py`, a `c` and 51 characters of the code's hash in a 2-character folder).
INDUCTOR_CODE = re.compile(r"(?:^|/)torchinductor_[^/]*/|(?:^|/)[a-z0-9]{2}/c[a-z0-9]{51}\.py$")


def is_library(file: str) -> bool:
    """Whether a file is an installed library's, torch's own (installed or a source checkout) or code Inductor
    generated, not the user's."""
    return (any(part in file for part in ("site-packages", "dist-packages", "/lib/python")) or file.startswith("<")
            or _TORCH_SOURCE.search(file) is not None or INDUCTOR_CODE.search(file) is not None)


# Dynamo's failure when a function reached its compile limit (torch 2.5 on): "Dynamo recompile limit exceeded ...
# (currently set to 8) ... Limit type: recompile_limit"; older torch names `cache_size_limit`.
_LIMIT_TYPE = re.compile(r"Limit type: (\w+)")
_LIMIT_VALUE = re.compile(r"\(currently set to (\d+)\)")
_LIMIT_HIT = re.compile(r"recompile limit|cache size limit|cache_size_limit|recompile_limit")


def limit_hit(fail_reason: str) -> tuple[str, int | None] | None:
    """The limit a compile's `fail_reason` says Dynamo reached (`recompile_limit`, its value where it says), else
    None."""
    if not _LIMIT_HIT.search(fail_reason):
        return None
    limit_type = _LIMIT_TYPE.search(fail_reason)
    value = _LIMIT_VALUE.search(fail_reason)
    name = limit_type.group(1) if limit_type else "cache_size_limit" if "cache_size_limit" in fail_reason \
        else "recompile_limit"
    return name, int(value.group(1)) if value else None


def limit_warning(limit: str, value: int | None, function: str, where: str | None, last_reason: str | None) -> str:
    """The warning Dynamo logs on reaching a limit, as a recording keeps it (what `recompile_limit` reads)."""
    text = f"torch._dynamo hit config.{limit} ({value if value is not None else '?'})"
    if where:
        text += f"\n   function: '{function}' ({where})"
    if last_reason:
        text += f"\n   last reason: {last_reason.splitlines()[0]}"
    return text


_STACK_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)', re.MULTILINE)


def failure_place(fail_reason: str) -> dict[str, object]:
    """What a failure's text says beyond its first line, where the record names no user frame: `fail_at`, the last
    frame of its `User stack:` (`file.py:LINE`, the line Dynamo was tracing), and `fail_hints`, its `- ...` lines
    (a `ConstraintViolationError`'s `You marked L['x'].size()[0] as dynamic but your code specialized it ...`)."""
    found: dict[str, object] = {}
    _, stack_title, stack = fail_reason.partition("User stack:")
    frames = _STACK_FRAME.findall(stack) if stack_title else []
    if frames:
        found["fail_at"] = f"{frames[-1][0]}:{frames[-1][1]}"
    hints = [line.strip()[2:].strip() for line in fail_reason.partition("User stack:")[0].splitlines()
             if line.strip().startswith("- ")]
    if hints:
        found["fail_hints"] = hints[:3]
    return found
