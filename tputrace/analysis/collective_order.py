"""Collectives issued out of step: ranks of one group whose k-th calls are not the same call.

A process group pairs its members' collectives by order, not by line: when one rank skips a collective
(a rank-dependent branch, an early `continue`) every later call of that rank is paired with the next
call of the others. Calls of the same size then silently combine different tensors, and the run hangs
or fails at the end, where one rank waits for a call the other never issues. The merged trace holds
every rank's calls: the first position where the members' calls differ in kind, in size (for kinds
whose size every member shares) or in line (for a rooted kind, whose root may call from a line of its
own, only when the members also issued different numbers of calls on the group) is named, with each
rank's line. Point-to-point calls and groups some member did not record
are left out, and so are the lines of a rank's calls inside `Join` (DDP's `model.join()`), which shadow the others' calls
from the `with` line (`join` cause); a rank that died simply stops (its calls so far agree), and is not out of step. Calls that agree in
kind and line but not in size are the same call on every rank with a tensor whose length each rank's data sets
(a `bincount`, a mask count), and the finding says so.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Evidence, Finding
from tputrace.store.records import SourceLocation
from tputrace.wording import format_bytes, plural

POINT_TO_POINT = ("send", "recv")
SAME_SIZE_KINDS = ("all_reduce", "broadcast", "reduce", "barrier")  # every member passes a tensor of one size
ROOTED_KINDS = ("broadcast", "reduce", "scatter", "gather")  # the root often calls from a line of its own


@dataclass(frozen=True)
class OutOfStep:
    """The first call of a group whose members disagree: its position (1-based) and each rank's call there."""

    group: str
    position: int
    calls: tuple[tuple[int, str, int, str], ...]  # (rank, kind, bytes, line) per member; line "-" when it issued none
    counts: tuple[tuple[int, int], ...]  # (rank, calls on the group)
    left_early: bool = False  # the calls agree, but a rank that ended normally stopped calling before the others
    # (rank, start_ns) of each member's call at `position`: from there on its calls are paired with others' (or none)
    diverged_ns: tuple[tuple[int, int], ...] = ()

    def since_ns(self, rank: int) -> int | None:
        """When `rank`'s calls stopped pairing with the other members' (None: it issued no call there)."""
        return next((start for member, start in self.diverged_ns if member == rank), None)


@dataclass(frozen=True)
class _Call:
    kind: str
    nbytes: int
    where: SourceLocation | None
    start_ns: int
    shadow: bool = False  # issued inside `Join` by a rank out of inputs, matching the others' calls from the `with` line


def out_of_step(context: AnalysisContext) -> tuple[OutOfStep | None, Finding | None]:
    """The first group whose members' collectives diverge, and a critical finding at the first rank's line there."""
    trace = context.trace
    if len(trace.distributed_ranks) < 2:
        return None, None
    caused = trace.has_table("collective_causes") and trace.has_column("collectives", "cause_id")  # format 2 and later
    shadow_ids = {cause_id for (cause_id,) in trace.sql("SELECT id FROM collective_causes WHERE kind = 'join'")} if caused else set()
    rows = trace.sql(f"SELECT rank, kind, bytes, group_sid, ranks_sid, frame_id, start_ns, {'cause_id' if caused else 'NULL'} "
                     "FROM collectives ORDER BY rank, start_ns")
    by_group: dict[tuple[int | None, int | None], dict[int, list[_Call]]] = defaultdict(lambda: defaultdict(list))
    for rank, kind, nbytes, group_sid, ranks_sid, frame_id, start_ns, cause_id in rows:
        if kind in POINT_TO_POINT:
            continue
        by_group[(group_sid, ranks_sid)][rank].append(_Call(kind, nbytes or 0, trace.frame(frame_id), start_ns or 0, cause_id in shadow_ids))
    for (group_sid, ranks_sid), per_rank in by_group.items():
        members = _members(trace.string(ranks_sid)) or sorted(per_rank)
        if len(members) < 2 or any(member not in per_rank for member in members):
            continue
        sequences = [per_rank[member] for member in members]
        counts = [len(sequence) for sequence in sequences]
        position = _divergence(sequences, uneven=len(set(counts)) > 1)
        if position is None:
            left = _left_early(context, members, counts)
            if left is None:
                waited = _waited_out(context, members, counts, sequences)
                if waited is not None:
                    return None, waited
                continue
            position = min(counts)

        calls = tuple(
            (member, sequence[position].kind, sequence[position].nbytes, _short(sequence[position].where)) if position < len(sequence)
            else (member, "-", 0, "-")
            for member, sequence in zip(members, sequences, strict=True)
        )
        name = trace.string(group_sid)
        diverged = tuple((member, sequence[position].start_ns) for member, sequence in zip(members, sequences, strict=True) if position < len(sequence))
        found = OutOfStep(f"process group {name}" if name else "the default group", position + 1, calls, tuple(zip(members, counts, strict=True)),
                          left is not None if position == min(counts) else False, diverged)
        where = next((sequence[position].where for sequence in sequences if position < len(sequence)), None)
        return found, (_left_finding(context, found, where) if found.left_early else _finding(context, found, where))
    return None, None


def _divergence(sequences: list[list[_Call]], uneven: bool) -> int | None:
    """The first position where the members' calls differ; for a rooted kind, lines count only when the members'
    call counts differ too (the root may issue the same broadcast from a line of its own, in step)."""
    for position, calls in enumerate(zip(*sequences, strict=False)):
        kinds = {call.kind for call in calls}
        if len(kinds) > 1:
            return position
        if calls[0].kind in SAME_SIZE_KINDS and len({call.nbytes for call in calls}) > 1:
            return position
        if any(call.shadow for call in calls):
            continue
        if (uneven or calls[0].kind not in ROOTED_KINDS) and len({(call.where.file, call.where.line) if call.where else None for call in calls}) > 1:
            return position
    return None


def _left_early(context: AnalysisContext, members: list[int], counts: list[int]) -> list[int] | None:
    """The members that issued fewer calls and ended normally (exit status 0, no error) while a member with more
    calls failed or died: uneven inputs, one rank done with its loop while another waits in one more collective."""
    if len(set(counts)) < 2:
        return None
    runs = {run.rank: run for run in context.trace.runs}
    fewest = min(counts)
    short = [member for member, count in zip(members, counts, strict=True) if count == fewest]
    longer = [member for member, count in zip(members, counts, strict=True) if count > fewest]
    ended = all(member in runs and runs[member].exit_status == 0 and not runs[member].error for member in short)
    stuck = any(member not in runs or runs[member].exit_status != 0 or runs[member].error for member in longer)
    return short if ended and stuck else None


def _waited_out(context: AnalysisContext, members: list[int], counts: list[int], sequences: list[list[_Call]]) -> Finding | None:
    """A rank whose collective timed out (its error says so) while the members with fewer calls never issued it and did
    not end on their own: they were busy with work the trace does not record (a host loop, a sleep, a deadlock)."""
    if len(set(counts)) < 2:
        return None
    runs = {run.rank: run for run in context.trace.runs}
    fewest = min(counts)
    waiting = [(member, sequence) for member, count, sequence in zip(members, counts, sequences, strict=True)
               if count > fewest and "timed out" in (runs[member].error or "").lower() if member in runs]
    late = [member for member, count in zip(members, counts, strict=True) if count == fewest]
    if not waiting or any(member in runs and runs[member].exit_status == 0 and not runs[member].error for member in late):
        return None
    rank, sequence = waiting[0]
    call = sequence[fewest]
    last = _last_seen(context, late[0])
    where = _short(call.where)
    return Finding(
        analyzer="collectives",
        severity="critical",
        title=(f"Rank {rank} timed out in {call.kind} at {where} waiting for rank{'s' if len(late) > 1 else ''} "
               f"{', '.join(map(str, late))}, which never issued it"),
        explanation=(
            f"Every call the ranks shared agrees; rank {rank}'s next one waited past the group's timeout, because rank "
            f"{late[0]} never reached it" + (f": its last recorded work was at {last[0]}, {last[1]:.1f} s before its run ended, and "
                                              "nothing it did after that is recorded (host work, a sleep, a wait on something other "
                                              "than a collective)." if last is not None else ".")
        ),
        suggestion=(
            f"Look at what rank {late[0]} does after {last[0] if last is not None else 'its last collective'}: work only some ranks do "
            "(evaluation, checkpointing, logging) belongs outside the steps or on every rank, and a long one needs a larger "
            "`timeout` in init_process_group."
        ),
        evidence=tuple(Evidence(f"rank {member}: {plural(count, 'call')}", table="collectives") for member, count in zip(members, counts, strict=True)),
        cost_total_ns=float(context.wall_ns),
        file=call.where.file if call.where is not None else None,
        line=call.where.line if call.where is not None else None,
    )


def _last_seen(context: AnalysisContext, rank: int) -> tuple[str, float] | None:
    """A rank's last recorded op or collective: its line, and the seconds from it to the rank's end."""
    trace = context.trace
    run = next((run for run in trace.runs if run.rank == rank), None)
    rows = trace.sql(
        "SELECT frame_id, end_ns FROM (SELECT frame_id, start_ns + COALESCE(dur_ns, 0) AS end_ns FROM ops WHERE rank = ? AND frame_id IS NOT NULL "
        "UNION ALL SELECT frame_id, start_ns + COALESCE(dur_ns, 0) FROM collectives WHERE rank = ? AND frame_id IS NOT NULL) ORDER BY end_ns DESC LIMIT 1",
        (rank, rank))
    if not rows or run is None or run.end_ns is None:
        return None
    location = trace.frame(rows[0][0])
    return (_short(location), max(run.end_ns - rows[0][1], 0) / 1e9) if location is not None else None


def _left_finding(context: AnalysisContext, found: OutOfStep, where: SourceLocation | None) -> Finding:
    fewest = min(count for _, count in found.counts)
    short = [rank for rank, count in found.counts if count == fewest]
    waiting = [(rank, kind, line) for rank, kind, _, line in found.calls if kind != "-"]
    rank, kind, line = waiting[0]
    counts = ", ".join(f"rank {member} {plural(count, 'call')}" for member, count in found.counts)
    return Finding(
        analyzer="collectives",
        severity="critical",
        title=(f"Uneven inputs: rank{'s' if len(short) > 1 else ''} {', '.join(map(str, short))} finished after {plural(fewest, 'collective')} "
               f"on {found.group}, while rank {rank} went on to call {kind} at {line}"),
        explanation=(
            f"Every call the ranks shared agrees, but they issued different numbers of them ({counts}): the ranks that ran out of work "
            f"ended normally and left the group, so the next collective of the others had no partner and failed or waited for the "
            f"group's timeout. The ranks ran different numbers of iterations (more batches on some ranks, or a loop that ends on a "
            f"rank's own condition)."
        ),
        suggestion=(
            "Give every rank the same number of iterations: a DistributedSampler with drop_last=True (or truncating to the smallest "
            "rank's count, agreed with one all_reduce(MIN) before the loop), or DDP's `with model.join():` around the loop, whose "
            "finished ranks shadow the others' all-reduces."
        ),
        evidence=tuple(
            Evidence(f"rank {member}: {plural(count, 'call')} on {found.group}", table="collectives") for member, count in found.counts
        ),
        cost_total_ns=float(context.wall_ns),
        file=where.file if where is not None else None,
        line=where.line if where is not None else None,
    )


def _finding(context: AnalysisContext, found: OutOfStep, where: SourceLocation | None) -> Finding:
    first = found.calls[0]
    if all(kind == first[1] and line == first[3] for _, kind, _, line in found.calls) and len({nbytes for _, _, nbytes, _ in found.calls}) > 1:
        return _size_finding(context, found, where)
    others = [call for call in found.calls[1:] if call[1:] != first[1:]] or list(found.calls[1:])
    differs = "; ".join(f"rank {rank}: {kind} of {format_bytes(nbytes)} at {line}" if kind != "-" else f"rank {rank}: no call"
                        for rank, kind, nbytes, line in others)
    counts = ", ".join(f"rank {rank} {plural(count, 'call')}" for rank, count in found.counts)
    uneven = len({count for _, count in found.counts}) > 1
    return Finding(
        analyzer="collectives",
        severity="critical",
        title=(f"Ranks issue collectives out of step: call {found.position} on {found.group} is {first[1]} at {first[3]} on rank {first[0]}, "
               f"but {differs}"),
        explanation=(
            "A process group pairs its members' collectives by their order, not by their line: from this call on, each rank's "
            "collective is paired with a different one of the others'. Calls of the same size silently combine different tensors; "
            "calls of different sizes or kinds fail or hang"
            + (f", and the ranks issued different numbers of calls on the group ({counts}), so one rank waited for a call the "
               "other never issued." if uneven else f" ({counts}).")
        ),
        suggestion=(
            f"Make every rank issue the same collectives in the same order: the call at {first[3]} (or the one at "
            f"{others[0][3] if others and others[0][3] != '-' else 'the other rank'}) sits in a branch that not every rank takes. Issue it on "
            "every rank (a rank with nothing to contribute passes zeros), or move it out of the rank-dependent branch."
        ),
        evidence=tuple(
            Evidence(f"rank {rank}: call {found.position} is {kind} ({format_bytes(nbytes)}) at {line}" if kind != "-" else f"rank {rank}: no call {found.position}",
                     table="collectives")
            for rank, kind, nbytes, line in found.calls
        ),
        cost_total_ns=float(context.wall_ns),
        file=where.file if where is not None else None,
        line=where.line if where is not None else None,
    )


def _size_finding(context: AnalysisContext, found: OutOfStep, where: SourceLocation | None) -> Finding:
    """Every member issued the same call from the same line, with tensors of different sizes: a length that depends on
    each rank's data (a `bincount` of its labels, a `nonzero`, a smaller last batch), not a branch some rank skipped."""
    kind, line = found.calls[0][1], found.calls[0][3]
    sizes = ", ".join(f"rank {rank} {format_bytes(nbytes)}" for rank, _, nbytes, _ in found.calls)
    return Finding(
        analyzer="collectives",
        severity="critical",
        title=f"Ranks pass tensors of different sizes to one collective: call {found.position} on {found.group} is {kind} at {line} ({sizes})",
        explanation=(
            f"Every rank issued this {kind} from {line}, in step with the others, but each with a tensor of its own size: the tensor's "
            f"length comes from the rank's own data (a `bincount` of its labels, a `nonzero` or mask count, a smaller last batch). "
            f"{'An' if kind[:1] in 'aeiou' else 'A'} {kind} needs one size on every member, so the call failed or hung (on some backends it silently combines the shorter "
            "tensor with part of the longer)."
        ),
        suggestion=(
            f"Give the tensor at {line} one size on every rank: a fixed length where the data sets it (`torch.bincount(x, "
            "minlength=num_classes)`, `F.one_hot(x, num_classes).sum(0)`, padding to a fixed maximum), or all_gather the lengths "
            "first and pad every rank's tensor to the largest."
        ),
        evidence=tuple(Evidence(f"rank {rank}: call {found.position} is {call_kind} ({format_bytes(nbytes)}) at {call_line}", table="collectives")
                       for rank, call_kind, nbytes, call_line in found.calls),
        cost_total_ns=float(context.wall_ns),
        file=where.file if where is not None else None,
        line=where.line if where is not None else None,
    )


def _short(where: SourceLocation | None) -> str:
    return where.short if where is not None else "an unknown line"


def _members(ranks_text: str | None) -> list[int]:
    return [int(part) for part in (ranks_text or "").split(",") if part.strip().lstrip("-").isdigit()]
