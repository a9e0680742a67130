"""What the trace keeps of an optimized HLO module's text: its size in instructions.

The text is XLA's (`Compiled.as_text()`): computations, each a header line ending in `{`, one
instruction per line (`%name = shape opcode(...)`, the last `ROOT`) and a closing `}`; a section of
file and frame names follows, outside any computation.
"""

from __future__ import annotations

import re

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?[\w.\-]+\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*\S")


def instruction_count(hlo_text: str) -> int:
    """The instructions of every computation in the module (fused computations' included)."""
    count = 0
    inside = False
    for line in hlo_text.splitlines():
        if not inside:
            inside = _COMPUTATION.match(line) is not None
        elif line.strip() == "}":
            inside = False
        elif _INSTRUCTION.match(line):
            count += 1
    return count
