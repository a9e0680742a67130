"""XLA's fusion decisions, read from an optimized HLO module's text.

Each `fusion` instruction names the computation it calls (`calls=%fused_computation.N`) and its
kind (`kind=kLoop`); the instructions of that computation are what XLA fused, and their
`op_name` metadata carries the ATen op that produced them (the backend runs every lowering inside
`jax.named_scope(<aten op>)`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\([^=]*?\)|\S+)\s+([\w\-]+)\((.*)$")
_KIND = re.compile(r"\bkind=(k\w+)")
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SKIPPED_OPCODES = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}


@dataclass(frozen=True)
class Fusion:
    """One fusion XLA made: its instruction name, kind, the HLO opcodes and ATen ops inside."""

    name: str
    kind: str
    hlo_ops: tuple[str, ...]
    aten_ops: tuple[str, ...]


def _aten_name(op_name: str) -> str | None:
    for part in op_name.split("/"):
        if part.startswith(("aten.", "prims.", "tputrace.")):
            return part
    return None


def parse(hlo_text: str) -> list[Fusion]:
    """Every fusion instruction in the module, with what it fused."""
    computations: dict[str, list[tuple[str, str]]] = {}
    fusion_lines: list[tuple[str, str, str]] = []
    current: list[tuple[str, str]] | None = None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = computations.setdefault(header.group(1), [])
            continue
        if line.strip() == "}":
            current = None
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction is None or current is None:
            continue
        name, _, opcode, rest = instruction.groups()
        op_name = _OP_NAME.search(rest)
        current.append((opcode, op_name.group(1) if op_name else ""))
        if opcode == "fusion":
            kind = _KIND.search(rest)
            calls = _CALLS.search(rest)
            fusion_lines.append((name, kind.group(1) if kind else "kUnknown", calls.group(1) if calls else ""))
    fusions = []
    for name, kind, called in fusion_lines:
        body = computations.get(called, [])
        hlo_ops = tuple(opcode for opcode, _ in body if opcode not in _SKIPPED_OPCODES)
        aten_ops: list[str] = []
        for _, op_name in body:
            aten = _aten_name(op_name)
            if aten and aten not in aten_ops:
                aten_ops.append(aten)
        fusions.append(Fusion(name, kind, hlo_ops, tuple(aten_ops)))
    return fusions
