"""What caused each collective (a DDP bucket, an FSDP gather, a DTensor redistribution), as the args of the
exports' collective events: cause kind, phase, module, placements and the line that decides it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tputrace.store.records import CollectiveCauseRecord

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

CauseArgs = tuple[tuple[str, str | int | None], ...]


def cause_column(trace: Trace) -> str:
    """The collectives' cause column for a SELECT: `cause_id`, or NULL in a file from before it."""
    has_cause = any(row[1] == "cause_id" for row in trace.sql("PRAGMA table_info(collectives)"))
    return "cause_id" if has_cause else "NULL"


def placements_text(cause: CollectiveCauseRecord) -> str | None:
    """`src -> dst` placements of a redistribution; the one side recorded, or None."""
    if cause.src_placements and cause.dst_placements:
        return f"{cause.src_placements} -> {cause.dst_placements}"
    return cause.src_placements or cause.dst_placements


def cause_args(trace: Trace, rank: int) -> dict[int, CauseArgs]:
    """Per cause id of `rank`: its args (None values left for the caller to drop)."""
    args: dict[int, CauseArgs] = {}
    for cause in trace.records("collective_causes", where="rank = ?", params=(rank,)):
        if not isinstance(cause, CollectiveCauseRecord):
            continue
        origin = cause.origin
        args[cause.id] = (
            ("cause", cause.kind), ("cause_phase", cause.phase), ("cause_module", cause.module),
            ("cause_placements", placements_text(cause)),
            ("cause_line", f"{origin.file}:{origin.line}" if origin is not None and origin.file else None),
        )
    return args
