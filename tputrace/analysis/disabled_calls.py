"""A graph break at a call of a function wrapped with `torch.compiler.disable`: what it is and how to remove it.

Dynamo does not trace such a function: it breaks the graph at the call, runs the function op by op in Python and
resumes in another graph after it. Its hint, "Remove the `torch.compiler.disable` call", means the wrapper (a
decorator, or `fn = torch.compiler.disable(fn)`), not the call the break is recorded at; and where the function must
stay uncompiled (logging, host-side work, code Dynamo fails on), the fix is to call it outside the compiled function.
"""

from __future__ import annotations

import linecache
import os
import re
from dataclasses import dataclass

# Dynamo's reasons: "Skip calling function `<function log_stats at 0x7f..>` since it was wrapped with
# `torch.compiler.disable` (reason: None)", "Skip inlining function <bound method ...>", and a disabled module's
# "Optimized `nn.Module` is wrapped with `torch.compiler.disable` (reason: ...)".
_DISABLED = re.compile(r"wrapped\s+with `torch\.compiler\.disable` \(reason: (?P<reason>.*?)\)(?= - |\s*$)", re.DOTALL)
_FUNCTION = re.compile(r"<(?:function|bound method) (?P<name>[\w.<>]+?)(?: at 0x[0-9a-fA-F]+| of .*?)?>")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


@dataclass(frozen=True)
class DisabledCall:
    """The disabled function a break calls: its name (None for a disabled module), the reason given to
    `torch.compiler.disable` (None where none was), and where the run's copy of the break's file wraps it."""

    function: str | None
    reason: str | None
    wrapped_at: str | None  # `train.py:7`: the decorator or the assignment that wraps it


def disabled_call(reason: str, copy: str | None, file: str | None) -> DisabledCall | None:
    """The disabled call a break's reason names, or None for another break; `copy` is the run's copy of the break's
    file (`file`), searched for the line that wraps the function."""
    disabled = _DISABLED.search(reason)
    if disabled is None:
        return None
    named = _FUNCTION.search(reason)
    function = None if named is None else named["name"].rpartition(".")[2]
    given = disabled["reason"].strip()
    wrapped_line = None if function is None or copy is None else _wrapped_line(copy, function)
    wrapped_at = None if wrapped_line is None or file is None else f"{os.path.basename(file)}:{wrapped_line}"
    return DisabledCall(function, None if given in ("", "None") else given, wrapped_at)


def without_addresses(reason: str) -> str:
    """A reason with the object addresses Dynamo prints (`<function f at 0x7f..>`) left out."""
    return _ADDRESS.sub("", reason)


def title_part(call: DisabledCall) -> str:
    """What broke the graph, for the title."""
    if call.function is None:
        return "a module wrapped with torch.compiler.disable"
    return f"{call.function}(), wrapped with torch.compiler.disable"


def advice(call: DisabledCall, where: str, function: str) -> str:
    """How to remove the break: take the wrapper off a function Dynamo can trace, or call the function outside the
    compiled one (first where the script gave a reason for disabling it)."""
    name = f"`{call.function}`" if call.function is not None else "the disabled module"
    at = f" at {call.wrapped_at}" if call.wrapped_at else ""
    outside = (f"call {name} outside the compiled function, on tensors {function}() returns (return what it needs), "
               f"so that {function}() compiles with no break at {where}")
    wrapper = (f"Dynamo's hint to remove the `torch.compiler.disable` call means the wrapper{at}, not the call at "
               f"{where}")
    if call.reason is not None:  # disabled on purpose: keep it uncompiled
        return (f"{name} is disabled on purpose (\"{call.reason}\"): {outside}. {wrapper}: take it off only if {name} "
                "is tensor ops Dynamo can trace.")
    return (f"{wrapper}: if {name} is tensor ops Dynamo can trace, take that wrapper off it and its ops "
            f"compile into {function}()'s graph. If it must stay uncompiled (logging, host-side work, code Dynamo "
            f"fails on), {outside}.")


def _wrapped_line(copy: str, function: str) -> int | None:
    """The line of the run's copy that wraps `function` in `torch.compiler.disable` (`torch._dynamo.disable`): the
    decorator above its `def`, else an assignment `function = ...disable(...)`; None where the file has neither."""
    lines = linecache.getlines(copy)
    definition = re.compile(rf"\s*(?:async\s+)?def\s+{re.escape(function)}\s*\(")
    assignment = re.compile(rf"\s*(?:self\.)?{re.escape(function)}\s*=.*\bdisable\b")
    for number, text in enumerate(lines, 1):
        if assignment.match(text):
            return number
        if definition.match(text):
            above = number - 1
            while above >= 1 and lines[above - 1].lstrip().startswith("@"):
                if "disable" in lines[above - 1]:
                    return above
                above -= 1
    return None
