"""Programs of two runs matched one to one: which appeared, which disappeared, which changed and how.

Program ids and structure keys are private to a run, so programs are matched by what a person would call the
same program:
- a fused (DeferAndFuse) program by where its flush happened (the flush's source site, as `sites.SiteKey`
  matches lines that moved) and why (the flush's trigger), its *family*; within a family, by the ATen ops it
  runs in order, its *variant*;
- a single-op program (strict eager) by its op, its variants by input signature;
- any other program (a `torch.compile` graph, an imported XLA module or kernel) by its kind and name.

A family in both runs whose variants differ is *changed*: ops added or removed, or other input signatures.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tputrace.compare.sites import site_key
from tputrace.wording import plural

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

# How many programs of each status a comparison keeps (the most executed first).
MAX_LISTED = 20


@dataclass(frozen=True)
class ProgramFamily:
    """The programs of one rank that match as one across runs, with what they ran."""

    key: tuple[str, ...]
    kind: str
    label: str  # what a person reads: the flush site and trigger, the op, or the program's name
    site: str | None  # file:line of a fused program's flush
    op_sequences: frozenset[str] = field(default_factory=frozenset)  # a digest of each variant's op names
    op_counts: Counter[str] = field(default_factory=Counter)  # op names over every variant (first run of each)
    signatures: frozenset[str] = field(default_factory=frozenset)
    compiles: int = 0
    executions: int = 0
    exec_ns: int = 0


@dataclass(frozen=True)
class ProgramChange:
    """A family that is `new` in B, `gone` from B, or `changed` (with what changed)."""

    status: str
    family: ProgramFamily
    detail: str


def program_families(trace: Trace, rank: int,
                     text_cache: dict[str, list[str] | None]) -> dict[tuple[str, ...], ProgramFamily]:
    """Every program family of `rank` of `trace` (`text_cache`: the lines of files read so far, None for a
    file whose sites match by line number)."""
    if not trace.has_table("programs"):
        return {}
    executions = _executions(trace, rank)
    compiles = _compiles(trace, rank)
    first_flush = _first_flushes(trace, rank)
    op_names = _op_names_by_flush(trace, rank, {flush for flush, _frame, _trigger in first_flush.values()})
    building: dict[tuple[str, ...], dict] = {}
    rows = trace.sql(
        "SELECT p.id, p.kind, n.text, g.text FROM programs p LEFT JOIN strings n ON n.id = p.name_sid "
        "LEFT JOIN strings g ON g.id = p.signature_sid WHERE p.rank = ?", (rank,))
    for program_id, kind, name, signature in rows:
        kind = kind or "?"
        name = name or f"program {program_id}"
        site = None
        sequence: tuple[str, ...] = ()
        if program_id in first_flush:
            flush_id, frame_id, trigger = first_flush[program_id]
            source = trace.frame(frame_id)
            place = site_key(trace, source, text_cache)
            site = f"{source.file}:{source.line}" if source else None
            where = (place.file, place.function, place.text) if place else ("?", "?", "?")
            key: tuple[str, ...] = ("fused", *where, trigger or "?")
            label = f"{trigger or 'flush'} at {site or 'an unknown line'}"
            sequence = op_names.get(flush_id, ())
        elif kind == "op":
            key, label = ("op", name), name
        else:
            key, label = (kind, name), name
        entry = building.setdefault(key, {
            "kind": kind, "label": label, "site": site, "sequences": set(), "ops": Counter(), "signatures": set(),
            "compiles": 0, "executions": 0, "exec_ns": 0})
        if sequence:
            digest = hashlib.blake2b("\n".join(sequence).encode(), digest_size=8).hexdigest()
            if digest not in entry["sequences"]:
                entry["sequences"].add(digest)
                entry["ops"].update(sequence)
        if signature:
            entry["signatures"].add(signature)
        entry["compiles"] += compiles.get(program_id, 0)
        count, total_ns = executions.get(program_id, (0, 0))
        entry["executions"] += count
        entry["exec_ns"] += total_ns
    return {
        key: ProgramFamily(key, entry["kind"], entry["label"], entry["site"], frozenset(entry["sequences"]),
                           entry["ops"], frozenset(entry["signatures"]), entry["compiles"], entry["executions"],
                           entry["exec_ns"])
        for key, entry in building.items()
    }


def program_changes(before: dict[tuple[str, ...], ProgramFamily],
                    after: dict[tuple[str, ...], ProgramFamily]) -> tuple[ProgramChange, ...]:
    """Families new in `after`, gone from it, and changed, each status ordered by executions (most first)."""
    new = [ProgramChange("new", family, _describe(family)) for key, family in after.items() if key not in before]
    gone = [ProgramChange("gone", family, _describe(family)) for key, family in before.items() if key not in after]
    changed = []
    for key, family in after.items():
        old = before.get(key)
        if old is None:
            continue
        detail = _what_changed(old, family)
        if detail:
            changed.append(ProgramChange("changed", family, detail))
    ordered: list[ProgramChange] = []
    for group in (new, changed, gone):
        group.sort(key=lambda change: (-change.family.executions, -change.family.exec_ns, change.family.label))
        ordered += group[:MAX_LISTED]
    return tuple(ordered)


def _describe(family: ProgramFamily) -> str:
    ops = sum(family.op_counts.values())
    parts = [plural(ops, "op") if ops else None, plural(family.compiles, "compile"), plural(family.executions, "run")]
    return ", ".join(part for part in parts if part)


def _what_changed(before: ProgramFamily, after: ProgramFamily) -> str:
    """What differs between the two runs' programs of one family, or "" when nothing does."""
    parts = []
    if before.op_sequences != after.op_sequences and (before.op_sequences or after.op_sequences):
        added = after.op_counts - before.op_counts
        removed = before.op_counts - after.op_counts
        if added or removed:
            parts.append("ops " + ", ".join(
                [f"+{_short(op)}" + (f" x{count}" if count > 1 else "") for op, count in added.most_common(4)]
                + [f"-{_short(op)}" + (f" x{count}" if count > 1 else "") for op, count in removed.most_common(4)]))
        else:
            parts.append("the same ops in another order")
    if before.signatures != after.signatures:
        parts.append(f"input signatures {len(before.signatures)} -> {len(after.signatures)}"
                     + _signature_example(before.signatures, after.signatures))
    if before.compiles != after.compiles and not parts:
        parts.append(f"compiled {before.compiles} -> {after.compiles} times")
    return "; ".join(parts)


def _signature_example(before: frozenset[str], after: frozenset[str]) -> str:
    """The inputs that differ between a new signature and the nearest old one, e.g. ` (i64[32,65] -> i64[32,128])`."""
    added = sorted(after - before)
    removed = sorted(before - after)
    if not added or not removed:
        return ""
    new_parts = _split_signature(added[0])
    candidates = [_split_signature(old) for old in removed]
    same_length = [old for old in candidates if len(old) == len(new_parts)]
    if not same_length:
        return ""
    nearest = min(same_length, key=lambda old: sum(a != b for a, b in zip(old, new_parts)))
    pairs = [f"{a} -> {b}" for a, b in zip(nearest, new_parts) if a != b]
    return f" ({', '.join(pairs[:2])}{', ...' if len(pairs) > 2 else ''})" if pairs else ""


def _split_signature(signature: str) -> list[str]:
    """A signature's inputs: `f32[8,64], i64[8]` -> [`f32[8,64]`, `i64[8]`] (commas inside brackets kept)."""
    parts, depth, current = [], 0, []
    for char in signature:
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return parts


def _short(op: str) -> str:
    """`aten.addmm.default` -> `addmm`."""
    parts = op.split(".")
    if len(parts) >= 2 and parts[0] == "aten":
        return parts[1]
    return op


def _executions(trace: Trace, rank: int) -> dict[int, tuple[int, int]]:
    """(runs, time) of each program of `rank`: its `executions` rows; a single-op program of strict mode, which runs
    inside its op's dispatch and writes none, runs once per op row that ran it (its time: the ops' dispatch)."""
    runs: dict[int, tuple[int, int]] = {}
    if trace.has_table("ops") and trace.has_table("programs"):
        runs.update({program: (count, total or 0) for program, count, total in trace.sql(
            "SELECT o.program_id, COUNT(*), SUM(o.dur_ns) FROM ops o JOIN programs p ON p.id = o.program_id "
            "AND p.rank = o.rank WHERE o.rank = ? AND p.kind = 'op' GROUP BY o.program_id", (rank,))})
    if trace.has_table("executions"):
        runs.update({program: (count, total or 0) for program, count, total in trace.sql(
            "SELECT program_id, COUNT(*), SUM(dur_ns) FROM executions WHERE rank = ? GROUP BY program_id", (rank,))})
    return runs


def _compiles(trace: Trace, rank: int) -> dict[int, int]:
    if not trace.has_table("compiles"):
        return {}
    return {program: count for program, count in trace.sql(
        "SELECT program_id, COUNT(*) FROM compiles WHERE rank = ? AND program_id IS NOT NULL GROUP BY program_id",
        (rank,))}


def _first_flushes(trace: Trace, rank: int) -> dict[int, tuple[int, int | None, str | None]]:
    """Each fused program's first flush: (flush id, its frame, its trigger)."""
    if not trace.has_table("flushes"):
        return {}
    rows = trace.sql(
        "SELECT f.program_id, f.id, f.frame_id, f.trigger FROM flushes f JOIN ("
        "SELECT program_id, MIN(id) AS first_id FROM flushes WHERE rank = ? AND program_id IS NOT NULL "
        "GROUP BY program_id) m ON f.id = m.first_id WHERE f.rank = ?", (rank, rank))
    return {program: (flush, frame, trigger) for program, flush, frame, trigger in rows}


def _op_names_by_flush(trace: Trace, rank: int, flush_ids: set[int]) -> dict[int, tuple[str, ...]]:
    """The ATen op names of each flush in `flush_ids`, in dispatch order."""
    if not flush_ids or not trace.has_table("ops"):
        return {}
    wanted = sorted(flush_ids)
    names: dict[int, list[str]] = {}
    for start in range(0, len(wanted), 500):
        chunk = wanted[start:start + 500]
        marks = ",".join("?" for _ in chunk)
        for flush, op in trace.sql(
                f"SELECT o.flush_id, s.text FROM ops o LEFT JOIN strings s ON s.id = o.op_sid "
                f"WHERE o.rank = ? AND o.flush_id IN ({marks}) ORDER BY o.flush_id, o.seq", (rank, *chunk)):
            names.setdefault(flush, []).append(op or "?")
    return {flush: tuple(ops) for flush, ops in names.items()}
