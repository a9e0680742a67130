"""Fragmented fusion: flushes in the middle of a step that cut it into many small programs.

In DeferAndFuse mode a step ideally runs as a couple of fused programs (forward and backward up to
the optimizer, then the optimizer). Every host read (`.item()`, `print`, `if tensor`) or other trigger
in between ends the pending graph: the chip gets smaller programs, XLA fuses less, and the host waits.
Flushes by CPU fallbacks are reported by the fallbacks analyzer and not counted here.

Cost (an estimate): the host time spent flushing the extra programs (cache hits only: compiles are
the recompiles analyzer's) plus the syncs' stalls at the cutting lines, less the compiles that ran
during those stalls (the recompiles analyzer's too: a data-dependent size that compiles a program per
count would otherwise be counted twice).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tputrace.analysis import unrolled_loops
from tputrace.analysis.call_sites import line_text
from tputrace.analysis.collective_phases import collective_phases
from tputrace.analysis.collective_overlap import run_cause_kinds
from tputrace.analysis.context import AnalysisContext, in_list, outside_fallbacks
from tputrace.analysis.findings import AnalysisResult, Finding
from tputrace.analysis.item_fixes import item_spelling
from tputrace.analysis.read_elements import element_reads_fix
from tputrace.analysis.read_once import VALUE_READS
from tputrace.analysis.syncs import known_library_read, library_suggestion, library_where
from tputrace.analysis.sync_modules import change_in_module, inside_module, module_of_read, then
from tputrace.store.aggregates import SYNC_COMPILE_NS
from tputrace.wording import format_ns

NAME = "fusion"
NATURAL_TRIGGERS = ("step", "backward_end", "exit", "explicit", "optimizer_init", "optimizer_state")
OWNED_ELSEWHERE = ("fallback",)
MIN_CUTS_PER_STEP = 3.0

SUGGESTIONS: dict[str, str] = {
    "bool": "replace Python control flow on tensor values (`if x.any():`) with `torch.where`, or check once per step",
    "item": "read values with `{read}` every N steps, not between layers or every step, and compute what you read "
            "before `optimizer.step()`: then it runs in the step's program, not in one of its own after it",
    "print": "print every N steps, not between layers or every step, values computed before `optimizer.step()`: then "
             "they run in the step's program, not in one of their own after it",
    "tolist": "call `.tolist()` every N steps, not between layers or every step, on values computed before "
              "`optimizer.step()`: then they run in the step's program, not in one of their own after it",
    "numpy": "call `.numpy()` every N steps, not between layers or every step, on values computed before "
             "`optimizer.step()`: then they run in the step's program, not in one of their own after it",
    "cpu": "move values to the CPU every N steps, not between layers or every step, and compute them before "
           "`optimizer.step()` (a metric kept on the chip, summed there): then they run in the step's program, not in "
           "one of their own after it",
    "data_dependent": "use fixed-shape ops instead of value-dependent shapes (nonzero, masked_select, unique, bincount)",
    "size_cap": "the pending graph hit the size cap; this is rare and usually fine",
    "value_check": "tputrace checked an op's arguments on the host, once per new input signature; nothing to change",
    "transfer": "keep tensors on one chip within a step",
    "collective": "each collective ends the pending fused program, whose results it sends: issue fewer and larger ones a step",
    "compiled_graph": "eager ops that feed a torch.compile graph run first as a program of their own; move them into the compiled function",
}
# The collective cut's advice by what the steady steps' collectives mostly are.
COLLECTIVE_SUGGESTIONS: dict[str, str] = {
    "all_reduce": ("each all-reduce ends the pending fused program, whose results it sends: issue fewer a step (one flattened "
                   "all-reduce rather than one per tensor, larger DDP buckets, `no_sync()` while accumulating gradients)"),
    "by_hand": ("each all-reduce ends the pending fused program, whose results it sends: issue fewer a step (one flattened "
                "all-reduce rather than one per tensor, or DistributedDataParallel, whose buckets reduce the gradients in a "
                "few large calls)"),
    "activations": ("each all-reduce ends the pending fused program, whose results it sends; these move the model's "
                    "activations in its forward pass (tensor parallelism) and their backward's mirror, not gradients: issue "
                    "fewer a step (one per block, a column-parallel layer feeding a row-parallel one)"),
    "sharded": ("each all-gather and reduce-scatter ends the pending fused program, whose results it sends; a sharded model "
                "(FSDP) makes them per wrapped group, before each group's forward and after its backward: wrap fewer, larger "
                "groups (`fully_shard` on each block rather than on each layer, a size-based wrap policy with a larger "
                "minimum) so each step is cut fewer times, and let the next group's all-gather be issued early "
                "(FSDP2's forward and backward prefetch)"),
}
SHARDED_KINDS = ("all_gather", "reduce_scatter")
BUFFER_BROADCASTS = ("DDP broadcasts the model's buffers from rank 0 before each forward here, a collective that ends the "
                     "pending program: make the model with `broadcast_buffers=False` (the sharding finding says when that "
                     "is safe)")


@dataclass(frozen=True)
class CuttingLine:
    """Flushes of one trigger at one line that cut steady steps, per step."""

    trigger: str
    where: str
    count_per_step: float
    ops_per_program: float


@dataclass(frozen=True)
class FusionData:
    """Programs per steady step and their size, flushes per step by trigger, and the lines that cut steps."""

    programs_per_step: float
    ops_per_program: float
    flushes_per_step_by_trigger: dict[str, float] = field(default_factory=dict)
    cuts_per_step: float = 0.0
    cutting_lines: tuple[CuttingLine, ...] = ()  # the most frequent


def analyze(context: AnalysisContext) -> AnalysisResult[FusionData]:
    trace = context.trace
    steady_where, steady_params = context.steady_where()
    excluded = ", ".join(f"'{trigger}'" for trigger in NATURAL_TRIGGERS + OWNED_ELSEWHERE)
    totals = trace.sql(
        "SELECT COUNT(*), COALESCE(SUM(n_ops), 0), COUNT(DISTINCT step) FROM flushes WHERE " + steady_where,
        steady_params,
    )[0]
    steady_count = max(context.steady_count, 1)
    programs_per_step = totals[0] / steady_count if totals[0] else 0.0
    ops_per_program = totals[1] / totals[0] if totals[0] else 0.0
    triggers = trace.sql(
        "SELECT trigger, COUNT(*) FROM flushes WHERE " + steady_where + " GROUP BY trigger ORDER BY 2 DESC", steady_params
    )
    by_trigger = {trigger: count / steady_count for trigger, count in triggers}
    cuts = trace.sql(
        "SELECT trigger, frame_id, COUNT(*), COALESCE(SUM(n_ops), 0) FROM flushes "
        f"WHERE {steady_where} AND trigger NOT IN ({excluded}) GROUP BY trigger, frame_id ORDER BY 3 DESC",
        steady_params,
    )
    cuts_per_step = sum(row[2] for row in cuts) / steady_count
    lines = [
        CuttingLine(trigger, context.where(frame_id), count / steady_count, n_ops / count if count else 0.0)
        for trigger, frame_id, count, n_ops in cuts
    ]
    data = FusionData(programs_per_step, ops_per_program, by_trigger, cuts_per_step, tuple(lines[:50]))
    if not context.steps or cuts_per_step < MIN_CUTS_PER_STEP:
        return AnalysisResult(NAME, data, tuple(unrolled_loops.findings(context)))
    frame_ids = sorted({frame_id for _, frame_id, _, _ in cuts if frame_id is not None})
    cost_ns, flush_ns, stall_ns = _cost(context, frame_ids, excluded, steady=False)
    steady_cost = _cost(context, frame_ids, excluded, steady=True)[0]
    top_trigger, top_frame, top_count, _ = cuts[0]
    share = context.share_of_steps_less_compiles(steady_cost)
    severity = context.severity(share)
    # Many cuts make a warning even where their measured cost is small, but for cuts by collectives alone: a
    # sharded model's collectives (FSDP's per group) are its algorithm's, and their cost is what the share says.
    if severity == "info" and cuts_per_step >= 2 * MIN_CUTS_PER_STEP and any(row[0] != "collective" for row in cuts):
        severity = "warning"
    evidence = tuple(
        context.evidence_at(
            f"{trigger} flush {count / steady_count:.3g} per step, {n_ops / count:.1f} ops per program",
            frame_id, table="flushes",
        )
        for trigger, frame_id, count, n_ops in cuts[:6]
    )
    where_top = context.where(top_frame)
    hint = _collective_hint(context, top_frame) if top_trigger == "collective" else _read_hint(context, top_frame, top_trigger)
    module = module_of_read(context, top_frame, top_trigger)
    change = f"{change_in_module(context, top_frame, module, where_top)}{hint}" if module else f"At {where_top}: {hint}"
    libraries = _library_reads(context, top_frame, top_trigger)
    known_read = known_library_read(context, top_frame, top_trigger)
    if known_read is not None:
        # A read torch's own code makes inside the call (a distribution's argument checks): its switch, not an `if`.
        change = f"At {where_top} the reads are {known_read[0]}: {then(known_read[1]).rstrip('.')}"
    elif libraries:
        # The reads are a library's that the line calls (a Trainer's loop): its lines and its setting, not the user's `if`.
        inside = ", ".join(library_where(context, frame_id) or "?" for frame_id in libraries[:3])
        known = library_suggestion(context, libraries[0], top_trigger)
        change = (f"At {where_top} the reads are made inside a library, at {inside}: "
                  + (known.rstrip(".") if known else "look for its setting that turns them off or makes them less often")
                  + ("; the syncs findings take each of its lines in turn" if len(libraries) > 1 else ""))
    finding = Finding(
        analyzer=NAME,
        severity=severity,
        title=(
            f"Fragmented fusion: each step is cut into {programs_per_step:.3g} programs, "
            f"{top_count / steady_count:.3g} per step by {top_trigger} at {where_top}"
        ),
        explanation=(
            f"Each steady step ran {programs_per_step:.3g} programs of {ops_per_program:.1f} ops on "
            f"average; {cuts_per_step:.3g} per step were cut mid-step by host reads or other triggers "
            f"({len(cuts)} lines), so XLA fuses less and the host waits for each piece. Flushing the extra programs "
            f"took {format_ns(flush_ns)} and their syncs stalled {format_ns(stall_ns)} besides compiling (estimate of the cost: "
            f"{context.share_text(share)})." + (inside_module(module) if module else "")
        ),
        suggestion=f"{change}. Then each step runs as one or two fused programs.",
        **context.loop_cost(steady_cost, cost_ns),
        evidence=evidence,
        module=module,
        **context.location_fields(top_frame),
    )
    return AnalysisResult(NAME, data, (finding,))


def _read_hint(context: AnalysisContext, frame_id: int | None, trigger: str) -> str:
    """The advice for cuts by `trigger` at `frame_id`'s line, in the words of what the line reads: its elements one
    at a time (`[t.item() for t in parts]`, `for row in rows:` then `float(row)`), read once; an `item` read spelled
    as the run's copy of the line spells it (`float(loss)`)."""
    hint = SUGGESTIONS.get(trigger, "move the host read after the step")
    if trigger not in VALUE_READS:
        return hint
    count = context.trace.sql("SELECT COUNT(*) FROM syncs WHERE rank = ? AND frame_id IS ? AND kind = ?",
                              (context.rank, frame_id, trigger))[0][0]
    elements = element_reads_fix(context, frame_id, int(count))
    if elements is not None:
        return elements[0].lower() + elements[1:].rstrip(".")
    if trigger != "item":
        return hint
    return hint.format(read=item_spelling(line_text(context.location(frame_id), context.trace) or ""))


def _collective_hint(context: AnalysisContext, frame_id: int | None) -> str:
    """The collective cut's advice by the kind of most of the steady steps' collectives at the cutting line (of all
    lines, where the line has none recorded): all-reduces (DDP, or gradients reduced by hand) or all-gathers and
    reduce-scatters (a sharded model's groups); a line where DDP broadcasts its buffers before each forward is told
    of `broadcast_buffers=False` first."""
    if not context.trace.has_table("collectives"):
        return SUGGESTIONS["collective"]
    where, params = context.steady_where()
    at_line = f"{where} AND frame_id = ?"
    counts = dict(context.trace.sql(f"SELECT kind, COUNT(*) FROM collectives WHERE {at_line} GROUP BY kind", (*params, frame_id)))
    if not counts:
        counts = dict(context.trace.sql(f"SELECT kind, COUNT(*) FROM collectives WHERE {where} GROUP BY kind", params))
    elif _buffer_broadcast_steps(context, frame_id) * 2 >= max(context.steady_count, 1):
        return BUFFER_BROADCASTS + "; " + (COLLECTIVE_SUGGESTIONS["all_reduce"] if counts.get("all_reduce") else SUGGESTIONS["collective"])
    sharded = sum(counts.get(kind, 0) for kind in SHARDED_KINDS)
    reduced = counts.get("all_reduce", 0)
    if sharded > reduced:
        return COLLECTIVE_SUGGESTIONS["sharded"]
    if reduced:
        if collective_phases(context).moves_activations("all_reduce", frame_id):
            return COLLECTIVE_SUGGESTIONS["activations"]
        ddp = any(kind.startswith("ddp") for kind in run_cause_kinds(context))
        return COLLECTIVE_SUGGESTIONS["all_reduce" if ddp else "by_hand"]
    return SUGGESTIONS["collective"]


def _buffer_broadcast_steps(context: AnalysisContext, frame_id: int | None) -> int:
    """The steady steps in which DDP's forward broadcast at `frame_id`'s line (its buffers, every forward)."""
    if not context.trace.has_table("collective_causes"):
        return 0
    where, params = context.steady_where("c")
    return int(context.trace.sql(
        f"SELECT COUNT(DISTINCT c.step) FROM collectives c JOIN collective_causes k ON k.id = c.cause_id WHERE {where} "
        "AND c.frame_id = ? AND c.kind = 'broadcast' AND k.kind = 'ddp_forward'", (*params, frame_id))[0][0])


def _cost(context: AnalysisContext, frame_ids: list[int], excluded: str, *, steady: bool) -> tuple[float, float, float]:
    """(flush time + stall, flush time, stall) of the cutting flushes at `frame_ids`, in the steady steps or
    in all of the loop's steps. Syncs inside a CPU fallback are the fallback's, not a cut's; compiles inside
    a stall are the recompiles analyzer's."""
    trace = context.trace
    where, params = context.steady_where() if steady else context.loop_where()
    (flush_ns,) = trace.sql(
        "SELECT COALESCE(SUM(CASE WHEN cache_hit = 1 THEN dur_ns ELSE 0 END), 0) FROM flushes "
        f"WHERE {where} AND trigger NOT IN ({excluded})",
        params,
    )[0]
    stall_ns = 0
    if frame_ids:
        sync_where, sync_params = context.steady_where("s") if steady else context.loop_where("s")
        (stall_ns,) = trace.sql(
            f"SELECT COALESCE(SUM(s.dur_ns - {SYNC_COMPILE_NS}), 0) FROM syncs s WHERE {sync_where} AND s.kind != 'fallback' "
            f"AND s.frame_id IN {in_list(frame_ids)} AND {outside_fallbacks('s')}",
            tuple(sync_params) + tuple(frame_ids),
        )[0]
    return float(flush_ns + stall_ns), float(flush_ns), float(stall_ns)


def _library_reads(context: AnalysisContext, frame_id: int | None, kind: str) -> list[int]:
    """The library lines (`syncs.library_frame_id`) that made most of the steady steps' reads of `kind` at `frame_id`'s
    line, most reads first; empty when the user's code made most of them (or the trace predates the column)."""
    if frame_id is None or not context.trace.has_column("syncs", "library_frame_id"):
        return []
    where, params = context.steady_where("s")
    rows = context.trace.sql(
        f"SELECT s.library_frame_id, COUNT(*) FROM syncs s WHERE {where} AND s.frame_id = ? AND s.kind = ? "
        "GROUP BY s.library_frame_id ORDER BY 2 DESC",
        (*params, frame_id, kind),
    )
    in_libraries = sum(count for library, count in rows if library is not None)
    if in_libraries * 2 <= sum(count for _, count in rows):
        return []
    return [library for library, _ in rows if library is not None]
