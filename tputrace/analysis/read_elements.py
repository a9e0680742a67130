"""Reads of a tensor's elements one at a time, told by the line's own text: a comprehension (or a one-line `for`)
whose element is read on its loop variable (`[s.item() for s in scores]`, `[float(p) for p in probs]`,
`[t[i].item() for i in range(n)]`). Each element read is a sync of its own, where one read of the whole tensor
(`scores.tolist()`) waits once."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext, in_list

# `for s in scores`, `for i, s in enumerate(scores)`, `for i in range(n)`: a comprehension's (or a one-line loop's)
# variables and what it iterates over.
_ITERATES = re.compile(r"\bfor\s+\(?(?P<targets>[A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\)?\s+in\s+"
                       r"(?P<iterable>[A-Za-z_][\w.]*(?:\((?:[^()]|\([^()]*\))*\))?(?:\[[^\]]*\])?)")
_ENUMERATE = re.compile(r"^enumerate\((?P<inner>.+)\)$")
_RANGE = re.compile(r"^range\(")
_UNBOUND = re.compile(r"\.unbind\([^()]*\)$")
# reads of one value: `x.item()`, `x.tolist()`, `x.cpu()`, `x.numpy()`, `float(x)`, `int(x)`, `bool(x)`
_READS_OF = (r"{value}\s*\.\s*(?P<method>item|tolist|cpu|numpy)\(\)", r"(?<![\w.])(?P<call>float|int|bool)\(\s*{value}\s*\)")
# ops that take elements out of a tensor at the line: iterating it (`unbind`) or indexing it by a number (`select`)
ELEMENT_OPS = ("aten.unbind", "aten.select")

_COPIES = (".tolist()", ".cpu()", ".numpy()")
ELEMENTS_OF_A_TENSOR = (
    "The line reads the elements of `{tensor}` one at a time, each with its own `{read}`: every element read is a "
    "sync of its own (a small program to take the element out, then a wait for the chip), one per element where one "
    "read of the tensor would do. Read `{tensor}` once, `{tensor}.tolist()` (or one `{tensor}.cpu()`, indexed on the "
    "host), and take the elements from that.")
ELEMENTS_OF_A_LIST = (
    "The line reads the tensors of `{tensor}` one at a time, each with its own `{read}`: every read is a sync of its "
    "own, one per tensor where one read would do. Stack them on the chip and read them once, "
    "`torch.stack({tensor}).tolist()`, and take the values from that.")
WITH_STEPS = (" To wait less still, keep the tensor on the chip and read it every N steps or after the loop, so the host "
              "can queue the next step while the chip works.")


@dataclass(frozen=True)
class ElementReads:
    """A line's reads of the elements of `iterable` one at a time, each by `read` (`.item()`, `float(...)`)."""

    iterable: str
    read: str
    indexed: bool = False  # taken by index (`t[i]` for `i` in a range): `iterable` is a tensor


def element_reads(text: str) -> ElementReads | None:
    """The iterable whose elements the line's comprehension (or one-line `for`) reads one at a time, else None."""
    for match in _ITERATES.finditer(text):
        targets = [name.strip() for name in match["targets"].split(",")]
        iterable = match["iterable"]
        enumerated = _ENUMERATE.match(iterable)
        if enumerated is not None and len(targets) == 2:
            iterable, targets = enumerated["inner"].strip(), targets[1:]
        if len(targets) != 1:
            continue
        (variable,) = targets
        if _RANGE.match(iterable):
            indexed = _read_of(rf"(?P<tensor>[A-Za-z_][\w.]*)\[\s*{variable}\s*\]", text)
            if indexed is not None:
                return ElementReads(indexed["tensor"], _read_name(indexed), indexed=True)
            continue
        read = _read_of(rf"(?<![\w.]){variable}", text)
        if read is not None:
            return ElementReads(_UNBOUND.sub("", iterable), _read_name(read))
    return None


def element_reads_fix(context: AnalysisContext, frame_id: int | None, text: str, count: int) -> str | None:
    """What to change for a line that read the elements of a tensor (or list of tensors) one at a time, `count`
    reads in the run: read it once. None where the line's text shows no such reads, or it read once."""
    reads = element_reads(text) if count >= 2 else None
    if reads is None:
        return None
    of_a_tensor = reads.indexed or _took_elements(context, frame_id)
    if not of_a_tensor and reads.read in _COPIES:
        return None  # copies of a list's tensors, whose shapes may differ: no one stack reads them all
    fix = (ELEMENTS_OF_A_TENSOR if of_a_tensor else ELEMENTS_OF_A_LIST).format(tensor=reads.iterable, read=reads.read)
    return fix + (WITH_STEPS if context.steps else "")


def _read_of(value: str, text: str) -> re.Match[str] | None:
    """The first read of `value` (a pattern) in `text`, by a method or by a call."""
    return next((match for pattern in _READS_OF if (match := re.search(pattern.format(value=value), text))), None)


def _read_name(match: re.Match[str]) -> str:
    named = match.groupdict()
    return f".{named['method']}()" if named.get("method") else f"{named['call']}(...)"


def _took_elements(context: AnalysisContext, frame_id: int | None) -> bool:
    """Whether the line took elements out of a tensor (`unbind` for iterating it, `select` for indexing it by a
    number), so what it iterates is a tensor, not a list of tensors."""
    if frame_id is None:
        return False
    op_sids = [sid for (sid,) in context.trace.sql(
        "SELECT id FROM strings WHERE " + " OR ".join("text = ? OR substr(text, 1, ?) = ?" for _ in ELEMENT_OPS),
        tuple(value for op in ELEMENT_OPS for value in (op, len(op) + 1, op + ".")),
    )]
    return bool(op_sids) and bool(context.trace.sql(
        "SELECT 1 FROM ops o JOIN frames f ON f.id = o.frame_id JOIN frames sf ON sf.id = ? WHERE o.rank = ? "
        f"AND o.op_sid IN {in_list(op_sids)} AND f.file_sid = sf.file_sid AND f.line = sf.line LIMIT 1",
        (frame_id, context.rank, *op_sids),
    ))
