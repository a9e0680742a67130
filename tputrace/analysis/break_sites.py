"""Where a torch.compile graph break is, for a break outside the script's own lines: the break's file and line (a
library's named by its path under the packages folder, `torch/distributions/distribution.py:68`, where a bare
`__init__.py:513` would not say which library) and the user's line that reached it (the recording's
`break_calls` in the frame compile's detail: the innermost frame of Dynamo's user stack outside the break's file and
libraries, such as the script's call of a helper module's function or of a library's)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext, detail_object
from tputrace.frame_files import is_library_file
from tputrace.store.records import SourceLocation

# The folders under which a library's files lie; the path after the last one names the library and its module.
# Where an import's break inside a library is, named in its reason (`… (in distributed.py:1757, f)`): its frame is the
# user's line that reached it.
IN_LIBRARY = re.compile(r" \(in (?P<file>[^()]+):(?P<line>\d+), (?P<function>[^()]+)\)$")
_RESUMED = re.compile(r"^torch_dynamo_resume_in_(.+)_at_\d+$")
_LIBRARY_FOLDER = re.compile(r".*/(?:site-packages|dist-packages|lib/python3(?:\.\d+)?)/")


@dataclass(frozen=True)
class CallingLine:
    """The user's line that reached a graph break in another file."""

    file: str
    line: int
    function: str
    inside_compiled: bool  # a line of the compiled code (from Dynamo's stack), not the line that called it

    @property
    def short(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    @property
    def text(self) -> str:
        """`train.py:12 in step()`, or `train.py:12` at a module's top level."""
        function = user_function(self.function)
        return self.short if function.startswith("<") else f"{self.short} in {function}()"


def user_function(code: str) -> str:
    """The user's function a code object is part of: a resumed frame's (`torch_dynamo_resume_in_f_at_5`: `f`), or the
    code itself."""
    while (match := _RESUMED.match(code)) is not None:
        code = match.group(1)
    return code


def file_name(file: str) -> str:
    """A file as a finding names it: a library's by its path under the packages folder (`rich/console.py`), any other
    by its base name."""
    normalized = file.replace("\\", "/")
    if is_library_file(file):
        match = _LIBRARY_FOLDER.match(normalized)
        if match is not None:
            return normalized[match.end():]
    return os.path.basename(normalized)


def break_where(location: SourceLocation) -> str:
    """`torch/optim/optimizer.py:79` for a library's line, `helpers.py:5` for any other."""
    return f"{file_name(location.file)}:{location.line}"


def calling_line(context: AnalysisContext, location: SourceLocation, t_ns: int) -> CallingLine | None:
    """The user's line that reached the break at `location` from another file, where the recording kept it: in
    Dynamo's stack of the break, else, for a library's line, the user's line that called the library's code whose
    frame Dynamo was compiling at `t_ns` (a function Dynamo compiled as a frame of its own after an earlier break, so
    that the stack of a break in it starts in the library)."""
    for (detail,) in context.trace.sql(
        "SELECT detail FROM compiles WHERE rank = ? AND kind = 'dynamo_frame' AND detail LIKE '%break_calls%' "
        "ORDER BY start_ns", (context.rank,),
    ):
        calls = detail_object(detail).get("break_calls")
        for call in calls if isinstance(calls, list) else []:
            at, called_at = (call.get("at"), call.get("called_at")) if isinstance(call, dict) else (None, None)
            if (isinstance(at, list) and at == [location.file, location.line] and isinstance(called_at, list)
                    and len(called_at) == 3 and isinstance(called_at[0], str) and isinstance(called_at[1], int)):
                return CallingLine(called_at[0], called_at[1], str(called_at[2]), True)
    if not is_library_file(location.file):
        return None
    spanning = context.trace.sql(
        "SELECT json_extract(detail, '$.call_frame_id') FROM compiles WHERE rank = ? AND kind = 'dynamo_frame' "
        "AND start_ns <= ? AND start_ns + COALESCE(dur_ns, 0) >= ? ORDER BY start_ns DESC LIMIT 1",
        (context.rank, t_ns, t_ns),
    )
    call = context.location(spanning[0][0]) if spanning and isinstance(spanning[0][0], int) else None
    if call is None or is_library_file(call.file):
        return None
    return CallingLine(call.file, call.line, call.function, False)
