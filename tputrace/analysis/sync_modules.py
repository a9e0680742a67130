"""The module a host read happened in: the nn.Module that ran the last op of the read's line before it.

A trace's line is the first frame in the user's code. When that line calls a model (`loss =
model(**batch).loss`) and the read (`if mask.all():`) is in the model's own code, a library's, the
line holds no `if` to change: the finding must say which module made the read. The ops table records
each op's module path; the op the same line dispatched just before the sync names it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tputrace.analysis.context import AnalysisContext, in_list

SAMPLED_SYNCS = 3  # syncs of one line and kind looked at
LINES_PER_SCAN = 8  # lines whose syncs one scan of the ops table looks at (each adds conditions every row evaluates)
CACHE_KEY = "sync_modules"

Line = tuple[int | None, str]
"""A sync line: its frame id and its kind."""


def module_of_read(context: AnalysisContext, frame_id: int | None, kind: str) -> str | None:
    """The module path most of the sampled `kind` syncs at `frame_id` were made in, or None (no module ran there)."""
    return modules_of_reads(context, [(frame_id, kind)])[(frame_id, kind)]


def modules_of_reads(context: AnalysisContext, lines: Sequence[Line]) -> dict[Line, str | None]:
    """`module_of_read` of each of `lines`, found together: two scans of the ops table for up to
    `LINES_PER_SCAN` lines (the ops have no index by time), and kept for the analysis's other analyzers."""
    known: dict[Line, str | None] = context.cache.setdefault(CACHE_KEY, {})  # type: ignore[assignment]
    missing = list(dict.fromkeys(line for line in lines if line not in known))
    for line in missing:
        if line[0] is None:
            known[line] = None
    missing = [line for line in missing if line[0] is not None]
    for first in range(0, len(missing), LINES_PER_SCAN):
        known.update(_modules_of(context, missing[first:first + LINES_PER_SCAN]))
    return {line: known[line] for line in lines}


def _modules_of(context: AnalysisContext, lines: Sequence[Line]) -> dict[Line, str | None]:
    trace = context.trace
    samples = {line: [start for (start,) in trace.sql(
        "SELECT start_ns FROM syncs WHERE rank = ? AND frame_id = ? AND kind = ? ORDER BY start_ns LIMIT ?",
        (context.rank, line[0], line[1], SAMPLED_SYNCS),
    )] for line in lines}
    # The last op of each sample's line at or before it: its start (the latest), then its module (the
    # op with the highest seq that started then), as `ORDER BY start_ns DESC, seq DESC LIMIT 1` would.
    marks = list(dict.fromkeys((line[0], start) for line, starts in samples.items() for start in starts))
    latest: dict[tuple[int | None, int], int | None] = {}
    if marks:
        frames = list(dict.fromkeys(frame_id for frame_id, _ in marks))
        (row,) = trace.sql(
            "SELECT " + ", ".join("MAX(start_ns) FILTER (WHERE frame_id = ? AND start_ns <= ?)" for _ in marks)
            + f" FROM ops WHERE rank = ? AND frame_id IN {in_list(frames)}",
            (*(value for mark in marks for value in mark), context.rank, *frames),
        )
        latest = dict(zip(marks, row))
    found = sorted({(frame_id, start) for (frame_id, _), start in latest.items() if start is not None})
    module_sids: dict[tuple[int | None, int], int | None] = {}
    if found:
        values = ", ".join("(?, ?)" for _ in found)
        module_sids = {(frame_id, start): module_sid for frame_id, start, _, module_sid in trace.sql(
            f"SELECT frame_id, start_ns, MAX(seq), module_sid FROM ops WHERE rank = ? AND (frame_id, start_ns) IN "
            f"(VALUES {values}) GROUP BY frame_id, start_ns",
            (context.rank, *(value for mark in found for value in mark)),
        )}
    modules: dict[Line, str | None] = {}
    for line, starts in samples.items():
        counted: Counter[str] = Counter()
        for start in starts:
            op_start = latest.get((line[0], start))
            module_sid = module_sids.get((line[0], op_start)) if op_start is not None else None
            module = trace.string(module_sid) if module_sid is not None else None
            if module:
                counted[module] += 1
        top = counted.most_common(1)
        modules[line] = top[0][0] if top and top[0][1] * 2 > len(starts) else None
    return modules


def inside_module(module: str) -> str:
    """A sentence for a finding's explanation: the read was made while `module` ran."""
    return f" The read was made inside {module} (the module that ran the line's last op before it)."


def change_in_module(context: AnalysisContext, frame_id: int | None, module: str, where: str) -> str:
    """A suggestion's opening for a read made inside `module`: the `if` may be in its code, not at `where`.
    A line in a `forward` (the user's own module, since a trace's line is the first frame in the user's
    code) is the module's code itself, so the read is there, unless the line's ops also ran outside `module`: then
    the line is a parent's forward calling `module`."""
    location = context.location(frame_id)
    if location is not None and location.function == "forward" and not _calls_a_child(context, frame_id, module):
        return f"The read is in the forward of {module}, at {where}: "
    return (f"If {where} only calls {module}, the read is in that module's own code (a library's, when it is not "
            f"yours): change it there, or use the library's option that avoids reading the value on the host. "
            f"Where the read is yours: ")


def _calls_a_child(context: AnalysisContext, frame_id: int | None, module: str) -> bool:
    """Whether the line's ops ran in `module` and in modules outside it (`self.head(self.body(x))`, the read in
    `body`): the line is then in the forward of a module above `module`, which it calls."""
    modules = [context.trace.string(module_sid) or "" for (module_sid,) in context.trace.sql(
        "SELECT DISTINCT module_sid FROM ops WHERE rank = ? AND frame_id = ? AND module_sid IS NOT NULL",
        (context.rank, frame_id),
    )]
    return any(other != module and not other.startswith(module + ".") for other in modules)


def then(text: str) -> str:
    """`text` to follow `change_in_module`'s opening: its first letter lower-cased."""
    return text[:1].lower() + text[1:]
