"""Reads whose value a Python branch takes next: `peak = g.abs().max().item()` then `if peak > limit:` a line or two
later. The read is there to decide, so keeping the value on the chip and reading it every N steps does not apply: the
decision itself has to move to the chip (the branch made arithmetic), and then nothing is read."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputrace.analysis.call_sites import line_text
from tputrace.analysis.context import AnalysisContext
from tputrace.store.records import SourceLocation

LOOK_AHEAD = 3  # lines after the read where the branch on its value may be
_ASSIGNED_READ = re.compile(r"^(?P<name>[A-Za-z_]\w*)\s*=\s*.*\.(?:item|tolist)\(\)$")
_BRANCH = re.compile(r"^(?:if|elif|while)\s+(?P<condition>.*):$")


@dataclass(frozen=True)
class Decision:
    """The branch on a read's value: its line and source text, and the name the read was assigned to."""

    line: int
    text: str
    name: str


def decision_after(context: AnalysisContext, frame_id: int | None) -> Decision | None:
    """The `if`/`while` within `LOOK_AHEAD` lines after a read assigned to a name (`peak = x.item()`) whose condition
    takes that name; None when the line assigns no read or no branch follows."""
    location = context.location(frame_id)
    assigned = _ASSIGNED_READ.match(line_text(location, context.trace) or "")
    if location is None or assigned is None:
        return None
    name = re.compile(rf"(?<![\w.]){re.escape(assigned['name'])}(?!\w)")
    for line in range(location.line + 1, location.line + 1 + LOOK_AHEAD):
        text = line_text(SourceLocation(location.file, line, location.function), context.trace) or ""
        branch = _BRANCH.match(text)
        if branch is not None and name.search(branch["condition"]):
            return Decision(line, text, assigned["name"])
    return None


def decision_fix(where: str, decision: Decision) -> str:
    """Make the branch's decision on the chip, where the read is no longer needed."""
    return (f"The value read into `{decision.name}` decides the Python branch at {where} (`{decision.text}`), so the "
            "host waits for it every time: make the decision on the chip, as arithmetic the branch becomes "
            "(`torch.where(condition, a, b)`, `torch.clamp`, or multiplying by the condition as a float), so nothing "
            "is read; or, where the branch must stay in Python, take it every N steps.")
