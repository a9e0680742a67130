"""The shapes of an XLA op that moves data, read from its HLO text.

A TPU's XProf capture names each op's event metadata by its instruction's HLO text
(`%copy-done = f32[8,128]{1,0} copy-done((f32[8,128]{1,0}, f32[8,128]{1,0:S(5)}, u32[]) %copy-start)`): the output
shape with its layout, the opcode and the operands. A layout's memory space (`S(5)`: host memory on a TPU) tells
where an asynchronous copy reads and writes. The import keeps these shapes for the ops that move data (copies,
host transfers, sends and receives), in the `ops` row's `inputs_sid` and `outputs_sid`.
"""

from __future__ import annotations

import re

# Opcodes (an HLO name's stem, or an op's `hlo_category`) of ops that move data rather than compute.
MOVEMENT_OPCODES = frozenset((
    "copy-start", "copy-done", "infeed", "outfeed", "send", "send-done", "recv", "recv-done",
    "host-to-device", "device-to-host",
))
_NAME = re.compile(r"^%?[\w.-]+ = ")
_OPCODE = re.compile(r"^ ([a-z][a-z-]*)\(")
_LAST_OPERAND = re.compile(r"%([\w.-]+)\s*$")


def opcode_of(name: str) -> str:
    """An HLO instruction name's opcode stem: `copy-done.3` -> `copy-done`."""
    return re.sub(r"(\.\d+)+$", "", name)


def movement_shapes(hlo_text: str, category: str | None, name: str) -> tuple[str, str] | None:
    """(operands, output shape) of a data-moving op from its HLO text (`%x = SHAPE opcode(OPERANDS), ...`); None for
    an op that computes, or text that is no instruction."""
    if (category or "") not in MOVEMENT_OPCODES and opcode_of(name) not in MOVEMENT_OPCODES:
        return None
    head = _NAME.match(hlo_text)
    if head is None:
        return None
    rest = hlo_text[head.end():]
    output_end = _balanced_end(rest)
    opcode = _OPCODE.match(rest[output_end:])
    if opcode is None:
        return None
    operands_start = output_end + opcode.end()
    operands_end = _balanced_end(rest[operands_start - 1:]) + operands_start - 1
    return rest[operands_start:operands_end - 1], rest[:output_end]


def operand_name(operands: str) -> str | None:
    """The instruction that a data-moving op's operands end with (`f32[8]{0} %param.1` -> `param.1`), if any."""
    found = _LAST_OPERAND.search(operands)
    return found.group(1) if found else None


def _balanced_end(text: str) -> int:
    """Where the first shape (or parenthesised list) of `text` ends: at the first space or comma outside brackets."""
    depth = 0
    for index, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0 and text[0] == "(" and char == ")":
                return index + 1
        elif char == " " and depth == 0:
            return index
    return len(text)
