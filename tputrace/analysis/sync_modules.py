"""The module a host read happened in: the nn.Module that ran the last op of the read's line before it.

A trace's line is the first frame in the user's code. When that line calls a model (`loss =
model(**batch).loss`) and the read (`if mask.all():`) is in the model's own code, a library's, the
line holds no `if` to change: the finding must say which module made the read. The ops table records
each op's module path; the op the same line dispatched just before the sync names it.
"""

from __future__ import annotations

from collections import Counter

from tputrace.analysis.context import AnalysisContext

SAMPLED_SYNCS = 3  # syncs of one line and kind looked at (each costs a scan of the ops table)


def module_of_read(context: AnalysisContext, frame_id: int | None, kind: str) -> str | None:
    """The module path most of the sampled `kind` syncs at `frame_id` were made in, or None (no module ran there)."""
    if frame_id is None:
        return None
    trace = context.trace
    starts = [start for (start,) in trace.sql(
        "SELECT start_ns FROM syncs WHERE rank = ? AND frame_id = ? AND kind = ? ORDER BY start_ns LIMIT ?",
        (context.rank, frame_id, kind, SAMPLED_SYNCS),
    )]
    modules: Counter[str] = Counter()
    for start in starts:
        rows = trace.sql(
            "SELECT module_sid FROM ops WHERE rank = ? AND frame_id = ? AND start_ns <= ? ORDER BY start_ns DESC, seq DESC LIMIT 1",
            (context.rank, frame_id, start),
        )
        module = trace.string(rows[0][0]) if rows and rows[0][0] is not None else None
        if module:
            modules[module] += 1
    if not modules or modules.most_common(1)[0][1] * 2 <= len(starts):
        return None
    return modules.most_common(1)[0][0]


def inside_module(module: str) -> str:
    """A sentence for a finding's explanation: the read was made while `module` ran."""
    return f" The read was made inside {module} (the module that ran the line's last op before it)."


def change_in_module(module: str, where: str) -> str:
    """A suggestion's opening for a read made inside `module`: the `if` may be in its code, not at `where`."""
    return (f"If {where} only calls {module}, the read is in that module's own code (a library's, when it is not "
            f"yours): change it there, or use the library's option that avoids reading the value on the host. "
            f"Where the read is yours: ")


def then(text: str) -> str:
    """`text` to follow `change_in_module`'s opening: its first letter lower-cased."""
    return text[:1].lower() + text[1:]
