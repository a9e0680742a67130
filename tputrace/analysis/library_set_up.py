"""Copies, syncs and collectives a library's set-up makes once inside a step, at the user's line that called it.

A library that issues collectives for the user (DDP, FSDP: the trace gives such a collective a cause of its kind) does some of
its set-up inside the loop: DDP's forward after the first backward rebuilds its gradient buckets, copying the new
bucket order to the chip, broadcasting it and reading it back (`.cpu()`). Those land at the user's forward line, in
that one step. A step is such a library's one-off at a line when a collective with a cause ran there in that step
that no other step repeats at that line (the same kind, size and cause kind). A copy in such a step of a size the
line copies in no other step, and a line's syncs of a kind that all fall in such steps, are the library's set-up, not
the script's: no change to the line removes them; copies and syncs that recur in other steps stay the line's own.
The one-off collectives are no steady step's communication either.
"""

from __future__ import annotations

from tputrace.analysis.context import AnalysisContext

# Causes of the collectives a wrapping library issues on its own, outside its gradient reductions (not a DTensor op
# the script calls: `redistribute`).
LIBRARY_CAUSES = ("ddp_init", "ddp_forward", "fsdp_all_gather", "join")
_CACHE_KEY = "library_set_up_steps"
_COPIES_KEY = "library_set_up_copies"


Signature = tuple[str, int, str]  # a collective's kind, bytes and its cause's kind


def one_off_work(context: AnalysisContext) -> dict[int, dict[int, frozenset[Signature]]]:
    """Per frame id and step: the library's collectives (by signature) at that frame in that step that no other step
    repeats there; only steps with such work are listed."""
    cached = context.cache.get(_CACHE_KEY)
    if isinstance(cached, dict):
        return cached
    trace = context.trace
    by_frame: dict[int, dict[int, set[Signature]]] = {}
    if trace.has_table("collectives") and trace.has_table("collective_causes"):
        for frame_id, step, kind, nbytes, cause_kind in trace.sql(
                "SELECT c.frame_id, c.step, c.kind, c.bytes, k.kind FROM collectives c JOIN collective_causes k "
                f"ON k.id = c.cause_id WHERE c.rank = ? AND c.frame_id IS NOT NULL AND c.step IS NOT NULL AND k.kind IN "
                f"({', '.join('?' for _ in LIBRARY_CAUSES)})", (context.rank, *LIBRARY_CAUSES)):
            by_frame.setdefault(frame_id, {}).setdefault(int(step), set()).add((kind or "", int(nbytes or 0), cause_kind or ""))
    work: dict[int, dict[int, frozenset[Signature]]] = {}
    for frame_id, done in by_frame.items():
        for step, signatures in done.items():
            elsewhere: set[Signature] = set().union(*(other for other_step, other in done.items() if other_step != step))
            if signatures - elsewhere:
                work.setdefault(frame_id, {})[step] = frozenset(signatures - elsewhere)
    context.cache[_CACHE_KEY] = work
    return work


def one_off_steps(context: AnalysisContext) -> dict[int, frozenset[int]]:
    """Per frame id: the steps in which a library's collective at that frame did work no other step repeats there."""
    return {frame_id: frozenset(steps) for frame_id, steps in one_off_work(context).items()}


def one_off_collective(context: AnalysisContext, frame_id: int | None, step: int, kind: str, nbytes: int,
                       cause_kind: str | None) -> bool:
    """Whether a collective is a library's one-off set-up at its line (DDP broadcasting its rebuilt bucket order)."""
    if frame_id is None or cause_kind is None:
        return False
    return (kind, nbytes, cause_kind) in one_off_work(context).get(frame_id, {}).get(step, frozenset())


def made_by_library_set_up(context: AnalysisContext, table: str, frame_id: int | None, condition: str = "",
                           params: tuple[object, ...] = ()) -> bool:
    """Whether every record of `table` (transfers or syncs, narrowed by the SQL `condition` with `params`) at
    `frame_id` in the loop's steps falls in a step where a library did one-off collective work at that line."""
    once = one_off_steps(context).get(frame_id) if frame_id is not None else None
    if not once:
        return False
    where, where_params = context.loop_line_where()
    extra = f" AND {condition}" if condition else ""
    steps = {int(step) for step, in context.trace.sql(
        f"SELECT DISTINCT step FROM {table} WHERE {where} AND frame_id = ?{extra}", (*where_params, frame_id, *params))}
    return bool(steps) and steps <= once


def own_copies(context: AnalysisContext, alias: str) -> str:
    """SQL condition on `transfers` (columns prefixed `alias.`) leaving out the host-to-chip copies of a library's
    one-off set-up: those in a one-off step of a size the line copies in no other step."""
    kept = context.cache.get(_COPIES_KEY)
    cached: list[tuple[int, int, int]] = kept if isinstance(kept, list) else []
    if not isinstance(kept, list):
        for frame_id, once in one_off_steps(context).items():
            sizes: dict[int, set[int]] = {}
            for step, nbytes in context.trace.sql(
                    "SELECT DISTINCT step, bytes FROM transfers WHERE rank = ? AND frame_id = ? AND direction = 'h2d' "
                    "AND step IS NOT NULL", (context.rank, frame_id)):
                sizes.setdefault(int(nbytes or 0), set()).add(int(step))
            cached += [(frame_id, step, nbytes) for nbytes, steps in sizes.items() if len(steps) == 1
                       for step in steps if step in once]
        context.cache[_COPIES_KEY] = cached
    if not cached:
        return "1"
    prefix = f"{alias}." if alias else ""
    values = ", ".join(f"({int(frame_id)}, {int(step)}, {int(nbytes)})" for frame_id, step, nbytes in cached)
    return f"NOT (({prefix}frame_id, {prefix}step, COALESCE({prefix}bytes, 0)) IN (VALUES {values}))"
