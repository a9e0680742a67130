"""Host syncs: lines where the host waited for a value from a chip, inside the training loop.

Syncs a CPU fallback makes (kind `fallback`, or `data_dependent` for an op such as nonzero that
ran on the host, inside the fallback's time) are part of the fallback's time and belong to the fallbacks analyzer; copies
between chips (kind `transfer`) to the transfers; syncs on a line where torch.compile broke the graph, to the graph breaks. Kind `value_check` is tputrace's own: the host
checking an op's arguments (DEFER_NEVER_AND_LAUNCH_BLOCKING's value checks, or confirming a meta
kernel's refusal), which the user's code did not ask for. The cost of a sync is
its stall: the time the host waited instead of dispatching the next work (an upper bound on what
removing it saves, since the chip still has to run the program), less the compiles that ran during
the wait, which the compiles analyzer counts.
"""

from __future__ import annotations

import re

from dataclasses import dataclass

from tputrace.analysis.backward_reads import backward_selections, backward_text, host_part_gradients, host_part_text
from tputrace.analysis.call_sites import line_text
from tputrace.analysis.data_sizes import data_dependent_fix
from tputrace.analysis.read_decisions import decision_after, decision_fix
from tputrace.analysis.evaluation_reads import evaluation_modules, evaluation_suggestion, periodic_suggestion
from tputrace.analysis.library_set_up import made_by_library_set_up
from tputrace.analysis.line_reads import ENVIRONMENT_READ, INNER_STOPPING_READ, NON_FINITE_SKIP_READ, NON_FINITE_STOP_READ, SKIP_READ, STOPPING_READ, line_read
from tputrace.analysis.optimizer_cycle import optimizer_cycle
from tputrace.analysis.read_elements import element_reads_fix
from tputrace.analysis.read_once import VALUE_READS, once_suggestion, reads_once
from tputrace.analysis.read_together import together_text
from tputrace.analysis.context import MIN_LISTED_COST_NS, AnalysisContext, Cost, in_list, outside_fallbacks, per_call_text, per_step_text, step_period
from tputrace.analysis.sync_modules import change_in_module, inside_module, module_of_read, modules_of_reads, then
from tputrace.analysis.findings import MEASURED_ON_HOST, AnalysisResult, Evidence, Finding
from tputrace.analysis.imported import context_import_facts
from tputrace.analysis.item_fixes import APPENDS, BEFORE_THE_STEP, TOKEN_READS, item_suggestion, token_suggestion
from tputrace.analysis.syncs_after_loop import after_loop_finding, after_loop_reads
from tputrace.store.aggregates import SYNC_COMPILE_NS
from tputrace.wording import format_ns, plural

NAME = "syncs"
EXCLUDED_KINDS = ("fallback", "transfer", "value_check")
# A sync's stall, less the compiles that ran inside it: those belong to the compiles analyzer, and a
# one-time compile would otherwise make a rare read look like a costly one.
STALL = f"(s.dur_ns - {SYNC_COMPILE_NS})"
# A sync on a line where torch.compile broke the graph belongs to the graph_breaks analyzer.
AT_A_GRAPH_BREAK = (
    "EXISTS (SELECT 1 FROM graph_breaks g JOIN frames gf ON gf.id = g.frame_id JOIN frames sf ON sf.id = s.frame_id "
    "WHERE g.rank = s.rank AND gf.file_sid = sf.file_sid AND gf.line = sf.line)"
)

SUGGESTIONS: dict[str, str] = {
    "item": "Keep the value on the chip: accumulate `loss.detach()` into a tensor and call `.item()` every N steps "
            "or after the loop, so the host can queue the next step while the chip works." + BEFORE_THE_STEP,
    "print": "Printing a tensor copies it to the host and waits for it; log every N steps, or collect detached "
             "values and print them after the loop.",
    "bool": "`if tensor:` (or `while`, `assert`) on a chip value waits for the chip; keep the decision on the chip "
            "with `torch.where`, or check it every N steps.",
    "data_dependent": "An op whose output shape depends on values (nonzero, masked_select, unique, bincount, "
                      "repeat_interleave, boolean indexing) waits for the chip to learn its size; use a fixed-shape "
                      "form (`torch.where(condition, x, y)`, multiplying by a mask, `minlength`/`output_size` known "
                      "in advance); `torch.where(condition)` with one argument is `nonzero`, and waits too.",
    "tolist": "`.tolist()` copies to the host and waits; do it every N steps or after the loop.",
    "numpy": "`.numpy()` copies to the host and waits; do it every N steps or after the loop.",
    "cpu": "`.cpu()` / `.to('cpu')` copies to the host and waits; keep the value on the chip or move it less often.",
    "host_outputs": "A torch.compile graph returns values that torch keeps on the CPU, copied back after every call, so "
                    "the host waits for the chip. Most often they are an optimizer's step counts in a compiled "
                    "`optimizer.step()`: make the optimizer `capturable=True` (Adam, AdamW, ...), which keeps them on "
                    "the chip; otherwise keep such state on the chip.",
    "synchronize": "`torch.tpu.synchronize()` (`torch.cuda.synchronize()` under `--as-cuda`) waits for every program "
                   "launched, and the host queues nothing meanwhile: a GPU script's step timing needs it, a traced run "
                   "does not (`tputrace run` records each step's time). Remove it from the loop, or call it every N steps.",
}
# A graph's CPU outputs where no optimizer step was compiled: numbers the graph took as inputs, and what it computed
# from them.
HOST_OUTPUTS_OF_NUMBERS = (
    "A torch.compile graph returns values that torch keeps on the CPU, copied back after every call, so the host waits "
    "for the chip. No optimizer step is compiled here: they are CPU scalars the graph computes from the Python numbers "
    "it takes (a float Dynamo made dynamic, such as a temperature or a loss scale, and what the forward keeps of it for "
    "the backward): pass such a number as a tensor on the device (`torch.tensor(value, device=...)`)."
)


def host_outputs_advice(context: AnalysisContext) -> str:
    """The advice for a graph's CPU outputs: an optimizer's step counts where a torch.optim step was compiled."""
    optimizer = context.trace.sql(
        "SELECT 1 FROM compiles c JOIN frames f ON f.id = c.frame_id JOIN strings s ON s.id = f.file_sid "
        "WHERE c.rank = ? AND c.kind = 'dynamo_frame' AND s.text LIKE '%torch/optim/%' LIMIT 1", (context.rank,))
    return SUGGESTIONS["host_outputs"] if optimizer else HOST_OUTPUTS_OF_NUMBERS


_PERIODIC_KINDS = frozenset({"item", "print", "tolist", "numpy", "cpu"})
# A capture's waits for its own device (a GPU's `cudaStreamSynchronize`, `cudaDeviceSynchronize`, a blocking copy).
DEVICE_SYNCHRONIZE = ("The host waited for the {device} to finish the work queued on it (`torch.cuda.synchronize()`, "
                      "`event.synchronize()`, a blocking copy or a library's stream synchronize), and queued nothing "
                      "meanwhile: remove the wait from the loop, call it every N steps, or copy with "
                      "`non_blocking=True` into pinned memory.")

# GradScaler's check of the gradients for inf, which its `step` reads (`unscale_` runs it, at its own line when the
# script unscales before clipping).
UNSCALE_OPS = ("aten._amp_foreach_non_finite_check_and_unscale_",)
SCALER_WITH_BFLOAT16 = (
    "The script autocasts to `torch.bfloat16` already, which has float32's range and needs no loss scaling: drop the "
    "GradScaler (`loss.backward()`, any clipping and `optimizer.step()` directly, with no `scale`, `unscale_` or "
    "`update`) and its read every step with it."
)
# Reads a library makes inside the call at a line, known by the ops the call runs there (all of them) and the
# sync's kind: what the read is, and the change that removes it.
# torch.linalg's solvers check the `info` of their `_ex` form on the host, to raise for a singular (or, for Cholesky, a
# not positive-definite) input; the `_ex` form itself returns `info` on the chip.
_LINALG_CHECKED = {"cholesky": "cholesky_ex(A)", "inv": "inv_ex(A)", "solve": "solve_ex(A, B)"}
LIBRARY_READS: dict[tuple[tuple[str, ...], str], tuple[str, str]] = {
    **{((f"aten.linalg_{name}_ex", "aten.any"), "bool"): (
        f"`torch.linalg.{name}` checking on the host whether its result's `info` says the input was singular (or not "
        "positive-definite), to raise",
        f"Call `torch.linalg.{unchecked}`, which returns the same result and `info` without the check, so nothing is "
        "read: check `info` every N steps, or after the loop, if a failed solve must stop the run.",
    ) for name, unchecked in _LINALG_CHECKED.items()},
    (UNSCALE_OPS, "item"): (
        "`torch.amp.GradScaler.step` reading whether the float16 gradients overflowed (`found_inf`) to decide "
        "whether to skip the optimizer step",
        "On a TPU, autocast to `torch.bfloat16` instead of `torch.float16`: bfloat16 has float32's range and needs "
        "no loss scaling, so drop the GradScaler (`loss.backward()` and `optimizer.step()` directly) and its read "
        "every step with it.",
    ),
    (("aten._is_all_true",), "bool"): (
        "`torch.distributions` checking a distribution's parameters, or the value given to `log_prob`, against "
        "their constraints (`validate_args`, on by default: `if not torch._is_all_true(valid)`), or a "
        "`torch._check_tensor_all`",
        "Turn the distributions' checks off in the loop once a run has passed them: "
        "`torch.distributions.Distribution.set_default_validate_args(False)` before the loop, or "
        "`validate_args=False` for each distribution made in it (a `torch._check_tensor_all` of your own: check "
        "every N steps).",
    ),
    (("aten._foreach_norm", "aten.isnan", "aten.isinf", "aten.logical_or"), "bool"): (
        "`torch.nn.utils.clip_grad_norm_(..., error_if_nonfinite=True)` reading whether the total gradient norm is "
        "NaN or infinite, to raise",
        "Drop `error_if_nonfinite=True` (the default is False): the clipping itself runs on the chip without a read. "
        "To catch a non-finite norm, keep the norm `clip_grad_norm_` returns and check `torch.isfinite(norm)` every N "
        "steps.",
    ),
    (("aten.isnan", "aten._is_any_true"), "item"): (
        "autograd's anomaly detection (`torch.autograd.set_detect_anomaly(True)` or `torch.autograd.detect_anomaly()`) "
        "checking the output of every backward function for NaN, one read each",
        "Anomaly detection is a debugging mode: turn it off for training (`torch.autograd.set_detect_anomaly(False)`, "
        "or drop the call) and turn it on only to find where a NaN first appears. To catch a NaN loss while training, "
        "keep `torch.isfinite(loss)` on the chip and check it every N steps.",
    ),
    (("aten.triu", "aten.eq.Tensor", "aten.all"), "bool"): (
        "`nn.TransformerEncoder` (or `nn.TransformerDecoder`) comparing the attention mask passed to it with a "
        "causal mask of its size to decide `is_causal` (`_detect_is_causal_mask`: `bool((mask == causal).all())`)",
        "Tell the encoder what the mask is, so it compares nothing: `encoder(x, mask=mask, is_causal=True)` for a "
        "causal mask (`is_causal=False` for another).",
    ),
    (("aten.batch_norm_stats", "aten.batch_norm_elemt"), "data_dependent"): (
        "`nn.SyncBatchNorm` dropping the gathered statistics of ranks whose batch is empty (`count_all[mask]`, a boolean "
        "mask whose count the host waits for), once per layer in each training forward",
        "The read changes nothing unless a rank's batch is empty, and torch has no switch for it: where each rank's "
        "batch is large enough for statistics of its own, train with plain `nn.BatchNorm*d` (drop "
        "`convert_sync_batchnorm`), or use `nn.GroupNorm`, which needs neither the read nor the layer's all-gathers; "
        "to keep synced statistics, use a norm of your own that all-reduces each layer's per-channel sums, sums of "
        "squares and count in one tensor, with no mask.",
    ),
}


# A scheduler stepped with a value (`scheduler.step(loss)`): ReduceLROnPlateau reads it with `float(metrics)`.
_SCHEDULER_STEP = re.compile(r"\b\w*(?:sched|plateau|lr_)\w*\.step\(\s*[^)\s]", re.IGNORECASE)
# A step given an optimizer (`scaler.step(optimizer)`).
_STEP_OF_AN_OPTIMIZER = re.compile(r"\.step\(\s*[A-Za-z_][\w.]*\s*\)")
PLATEAU_READ = (
    "`ReduceLROnPlateau.step(metric)` reading the metric on the host (`float(metrics)`) to compare it with the best "
    "so far",
    "Step the plateau scheduler less often, with a metric worth its read: once per epoch or every N steps, with a "
    "validation loss or a mean of the training losses kept on the chip (`running += loss.detach()`), not each step's "
    "loss; or use a schedule that reads nothing (`CosineAnnealingLR`, `OneCycleLR`).",
)
# A run without steps (no optimizer step, no `tputrace.step()`) is an inference or decoding loop: no loss to accumulate.
NO_STEP_SUGGESTIONS: dict[str, str] = {
    "item": "Keep the value on the chip: a read every iteration makes the host wait for each iteration's program "
            "before it queues the next. Sum a metric or count on the chip (`correct += (pred == y).sum()`) and read it "
            "after the loop; for a stopping check (`if token.item() == eos`), check every N iterations (the iterations "
            "past the stop are cheap next to a wait each), or keep a `done` mask on the chip and run a fixed number of "
            "iterations.",
    "bool": "`if tensor:` (or `while`, `assert`) on a chip value waits for the chip at every iteration. For a stopping "
            "check (`if (next_token == eos).all(): break`), check every N iterations (the iterations past the stop are "
            "cheap next to a wait each), or keep a `done` mask on the chip and run a fixed number of iterations; for "
            "another decision, make it on the chip with `torch.where`.",
}

# (a library file's path ending, sync kind) -> what to change, for reads that a library makes where its user can
# turn them off.
LIBRARY_SUGGESTIONS: tuple[tuple[str, str, str], ...] = (
    ("transformers/trainer.py", "bool",
     "Transformers' Trainer checks each step's loss for NaN and inf on the host (`logging_nan_inf_filter`, on by "
     "default), a wait every step: set `TrainingArguments(logging_nan_inf_filter=False)`."),
    ("transformers/trainer.py", "item",
     "Transformers' Trainer reads the loss (and the gradient norm) on the host when it logs, every `logging_steps` "
     "steps: log less often (a larger `logging_steps`)."),
    ("transformers/masking_utils.py", "bool",
     "Transformers' SDPA mask (`_ignore_causal_mask_sdpa`) reads on the host whether the `attention_mask` masks any "
     "token, to skip building the causal mask, a wait at every forward of a model given an `attention_mask`: load the "
     "model with `attn_implementation=\"eager\"`, whose mask is always built and never read, or pass no "
     "`attention_mask` for batches without padding."),
)


@dataclass(frozen=True)
class SyncLine:
    """The host syncs of one kind at one line in the loop; per-step figures are the steady steps' (None
    without steps)."""

    where: str
    kind: str
    library: str | None  # where a library the line called made the read (`trainer.py:1956 in _run_epoch`), if one did
    count: int
    stall_ns: int
    pending_ops: int
    steps: int
    count_per_step: float | None
    stall_per_step_ns: float | None


@dataclass(frozen=True)
class SyncsData:
    lines: tuple[SyncLine, ...] = ()  # the costliest lines
    total_stall_ns: int = 0
    total_syncs: int = 0


def analyze(context: AnalysisContext) -> AnalysisResult[SyncsData]:
    trace = context.trace
    where, params = context.loop_line_where("s")
    steady_where, steady_params = context.steady_where("s")
    excluded = ", ".join(f"'{kind}'" for kind in EXCLUDED_KINDS)
    own = f"s.kind NOT IN ({excluded}) AND {outside_fallbacks('s')} AND NOT {AT_A_GRAPH_BREAK}"
    # Reads a library made for the line (a Trainer's) are grouped by where in the library (a file before the column: NULL).
    library = "s.library_frame_id" if trace.has_column("syncs", "library_frame_id") else "NULL"
    rows = trace.sql(
        f"SELECT s.frame_id, s.kind, {library}, COUNT(*), COALESCE(SUM({STALL}), 0), COALESCE(SUM(s.pending_ops), 0), "
        f"COUNT(DISTINCT s.step) FROM syncs s WHERE {where} AND {own} GROUP BY s.frame_id, s.kind, {library} "
        f"HAVING {context.loop_line_having('s')} ORDER BY 5 DESC",
        params,
    )
    steady_rows = trace.sql(
        f"SELECT s.frame_id, s.kind, {library}, COUNT(*), COALESCE(SUM({STALL}), 0), MAX(s.step) FROM syncs s "
        f"WHERE {steady_where} AND {own} GROUP BY s.frame_id, s.kind, {library}",
        steady_params,
    )
    steady = {(frame_id, kind, library_frame_id): (count, stall_ns) for frame_id, kind, library_frame_id, count, stall_ns, _ in steady_rows}
    # synced in the warm-up step only of a loop of two steps (where it counts as steady): set-up, not the loop
    set_up = {(frame_id, kind, library_frame_id) for frame_id, kind, library_frame_id, _, _, last_step in steady_rows
              if last_step == context.warm_up_in_steady}
    steady_count = max(context.steady_count, 1)
    lines: list[SyncLine] = []
    costly: list[tuple[int | None, str, int | None, int, int, int, int, float | None, int, int, Cost]] = []
    for frame_id, kind, library_frame_id, count, stall_ns, pending_ops, steps_with in rows:
        steady_syncs, steady_stall = steady.get((frame_id, kind, library_frame_id), (0, 0))
        per_step = steady_syncs / steady_count if context.steps else None
        lines.append(SyncLine(
            context.where(frame_id), kind, library_where(context, library_frame_id), count, stall_ns, pending_ops, steps_with,
            per_step, steady_stall / steady_count if context.steps else None,
        ))
        if stall_ns <= 0 or (frame_id, kind, library_frame_id) in set_up:
            continue
        if made_by_library_set_up(context, "syncs", frame_id, f"kind = ? AND {library.removeprefix('s.')} IS ?", (kind, library_frame_id)):
            continue  # read by a library's one-off set-up at the line (DDP's bucket rebuild), not by the line
        if not context.steps and count == 1 and _reads_the_end(context, frame_id):
            continue  # a run without steps reading its result once at its end (`print(out.cpu())`): nothing to save
        cost = context.line_cost(steady_stall, stall_ns, steps_with, steady_syncs)
        # the steady steps' rate over all the loop's steps passes what was measured where the warm-up step's reads
        # stalled less (their wait was mostly compiles, left out): the cost is never more than the stall measured
        cost["cost_total_ns"] = min(cost["cost_total_ns"], float(stall_ns))
        if cost["cost_total_ns"] < MIN_LISTED_COST_NS:
            continue  # e.g. syncs of the warm-up step only, whose stall was its compiles: nothing to save per step
        costly.append((frame_id, kind, library_frame_id, count, stall_ns, pending_ops, steps_with, per_step, steady_syncs, steady_stall,
                       cost))
    modules_of_reads(context, [(frame_id, kind) for frame_id, kind, *_ in costly])  # the lines' modules, in one pass
    together = _read_together(context, [(frame_id, kind, library_frame_id) for frame_id, kind, library_frame_id, *_ in costly])
    keys = [(frame_id, kind, library_frame_id) for frame_id, kind, library_frame_id, *_ in costly]
    backwards, split_at = backward_selections(context, keys), host_part_gradients(context, keys)
    findings = [_finding(context, *line, read_with_keys=together.get(line[:3], ()), backward_of=backwards.get(line[:3], ()),
                         host_part_at=split_at.get(line[:3], ())) for line in costly]
    in_loop = {(frame_id, kind, library_frame_id) for frame_id, kind, library_frame_id, *_ in rows}
    for frame_id, kind, _, count, stall_ns, pending_ops in after_loop_reads(context, own, STALL, library, in_loop):
        findings.append(after_loop_finding(context, NAME, frame_id, kind, count, stall_ns, pending_ops,
                                           _after_loop_suggestion(context, frame_id, kind)))
    data = SyncsData(tuple(lines[:50]), sum(line.stall_ns for line in lines), sum(line.count for line in lines))
    return AnalysisResult(NAME, data, tuple(findings))


def _after_loop_suggestion(context: AnalysisContext, frame_id: int | None, kind: str) -> str:
    """What to change for a line's reads in a loop after the training loop: a decoding loop's token kept on the chip,
    else the advice for a loop without steps."""
    text = line_text(context.location(frame_id), context.trace) or ""
    return (token_suggestion(text) if kind in ("item", "tolist") else None) or NO_STEP_SUGGESTIONS.get(kind) or (
        SUGGESTIONS.get(kind, "Move the host read out of the loop, or do it every N iterations."))


def _reads_the_end(context: AnalysisContext, frame_id: int | None) -> bool:
    """Whether the line's one read is the run's last: no op of another line was dispatched after it."""
    if frame_id is None:
        return False
    rows = context.trace.sql(
        "SELECT 1 FROM ops o JOIN frames f ON f.id = o.frame_id JOIN frames sf ON sf.id = ? WHERE o.rank = ? "
        "AND o.start_ns > (SELECT MIN(start_ns) FROM syncs WHERE rank = ? AND frame_id = ?) "
        "AND NOT (f.file_sid = sf.file_sid AND f.line = sf.line) LIMIT 1",
        (frame_id, context.rank, context.rank, frame_id),
    )
    return not rows


def _read_together(context: AnalysisContext, keys: list[tuple[int | None, str, int | None]]) -> dict[tuple[int | None, str, int | None], tuple[tuple[int | None, str, int | None], ...]]:
    """For each of the script's own reads of a value (`.item()`, `.tolist()`, ...), the other such lines that read as
    often in exactly the same loop steps (an evaluation's metrics, a loss and an accuracy logged together): each
    waits for the chip in turn, where one read of them all stacked would wait once."""
    reads = [key for key in keys if key[1] in _PERIODIC_KINDS and key[2] is None and key[0] is not None]
    if len(reads) < 2 or not context.steps:
        return {}
    where, params = context.loop_line_where("s")  # with the `end` step, where a read after the last step lands
    by_steps: dict[frozenset[tuple[int, int]], list[tuple[int | None, str, int | None]]] = {}
    for key in reads:
        steps = frozenset(context.trace.sql(
            f"SELECT s.step, COUNT(*) FROM syncs s WHERE {where} AND s.frame_id = ? AND s.kind = ? GROUP BY s.step",
            (*params, key[0], key[1])))
        if len(steps) >= 2:
            by_steps.setdefault(steps, []).append(key)
    together: dict[tuple[int | None, str, int | None], tuple[tuple[int | None, str, int | None], ...]] = {}
    for group in by_steps.values():
        ordered = sorted(group, key=lambda key: context.where(key[0]))
        for key in ordered if len({context.where(frame_id) for frame_id, *_ in group}) >= 2 else ():
            together[key] = tuple(other for other in ordered if context.where(other[0]) != context.where(key[0]))
    return together


def _finding(context: AnalysisContext, frame_id: int | None, kind: str, library_frame_id: int | None, count: int, stall_ns: int,
             pending_ops: int, steps_with: int, per_step: float | None, steady_syncs: int, steady_stall: int, cost: Cost, *,
             read_with_keys: tuple[tuple[int | None, str, int | None], ...] = (), backward_of: tuple[str, ...] = (),
             host_part_at: tuple[str, ...] = ()) -> Finding:
    where = context.where(frame_id)
    read_with = tuple(dict.fromkeys(context.where(other[0]) for other in read_with_keys))
    library = library_where(context, library_frame_id)
    share = context.share_of_steps_less_compiles(steady_stall)
    severity = context.severity(share)
    if severity == "info" and per_step is not None and per_step >= 1 and share >= 0.02:
        severity = "warning"
    if count == 1:
        severity = "info"  # one wait in the whole run, recurring nowhere
    steady_count = max(context.steady_count, 1)
    every = _period(context, frame_id, kind, library_frame_id) if per_step is not None else None
    rate = per_step_text(steady_syncs, steady_count, "time", every=every) if per_step is not None else plural(count, "time")
    # More a step reads as its rate (`4 times per step`), and n at a time every p steps as that period.
    every_step = per_step is not None and every is None and 0.99 <= per_step < 1.5 and steps_with >= context.steady_count
    once = context.once_in_loop(steps_with, steady_syncs)
    stalled = (f"{format_ns(stall_ns)} stalled" if once or not context.steps
               else f"{format_ns(steady_stall / steady_count)} stalled per step")
    inside = f", in {library}" if library else ""
    cycle = optimizer_cycle(context)
    per_iteration = every is not None and len(cycle) == every[1] and not once  # every iteration of a loop of k steps
    from_step = _from_step(context, frame_id, kind, library_frame_id) if every is None and not once and not every_step else None
    if from_step is not None:
        rate = f"{'every step' if from_step[0] == 1 else plural(from_step[0], 'time') + ' per step'} from step {from_step[1]}"
    how_often = ("in one step" if once else "every step" if every_step else
                 f"{plural(every[0], 'time')} per loop iteration" if per_iteration and every is not None else rate)
    title = f"Host sync {how_often} at {where} ({kind}{inside}): {stalled}"
    pending = pending_ops / count
    waits_for = (f"forces the {plural(round(pending), 'op')} still pending on average to run" if pending >= 1
                 else "is for programs already queued on the chip")
    in_steps = f" in {plural(steps_with, 'step')}" if context.steps else ""
    explanation = (
        f"At {where} the host waited for the chip ({kind} sync) {plural(count, 'time')}{in_steps}, "
        f"{format_ns(stall_ns)} in all ({context.share_text(share)}). Each wait {waits_for}, and the host queues "
        f"no more work meanwhile."
    )
    if per_iteration:
        explanation += (f" The loop steps {len(cycle)} optimizers in turn ({', '.join(cycle)}), so each of its iterations "
                        f"is {len(cycle)} steps: the line reads in every iteration.")
    if library:
        explanation += f" The value is read inside a library that {where} calls, at {library}."
    suggestion = (NO_STEP_SUGGESTIONS.get(kind) if not context.steps else None) or SUGGESTIONS.get(
        kind, "Move the host read out of the loop, or do it every N steps.")
    if kind == "host_outputs":
        suggestion = host_outputs_advice(context)
    text = line_text(context.location(frame_id), context.trace) or ""
    single = reads_once(count, kind)
    elements = element_reads_fix(context, frame_id, count) if kind in VALUE_READS else None
    decision = decision_after(context, frame_id) if kind in ("item", "tolist") and not single else None
    if single:
        suggestion = once_suggestion(kind)
    elif elements is not None:
        suggestion = elements
    elif decision is not None:
        suggestion = decision_fix(f"{where.rsplit(':', 1)[0]}:{decision.line}", decision)
    elif kind == "data_dependent":
        suggestion = data_dependent_fix(context, frame_id) or suggestion
    elif kind in ("item", "tolist") and token_suggestion(text):
        suggestion = TOKEN_READS
    elif kind == "item" and context.steps:
        suggestion = item_suggestion(text, suggestion)
    elif kind in _COPIES_OUT and context.steps and APPENDS.search(text):
        suggestion = KEPT_COPIES
    steady = context.steady_line_range
    steady_range = range(steady[0], steady[1] + 1) if steady else range(0)
    evaluating = (every is not None and every[1] >= 2 and kind in _PERIODIC_KINDS and not once and not single
                  and elements is None and bool(steady_range))
    evaluated = evaluation_modules(context, frame_id, kind, steady_range) if evaluating else ()
    # a metric read in the same steps as an evaluation's read (an accuracy after the loss, whose read ran the
    # forward) ends the same evaluation, though its own wait flushed only the metric's ops
    forward_read_at = None
    for other_frame, other_kind, _ in read_with_keys if evaluating and not evaluated else ():
        evaluated = evaluation_modules(context, other_frame, other_kind, steady_range)
        if evaluated:
            forward_read_at = context.where(other_frame)
            break
    if evaluated and every is not None:
        kept = kind in _COPIES_OUT and bool(APPENDS.search(text))
        suggestion = evaluation_suggestion(where, every, evaluated, kept=kept, forward_read_at=forward_read_at, text=text)
        severity = "info" if every[0] == 1 else severity  # one wait per evaluation is what the decision needs
    elif (every is not None and every[1] >= 2 and kind in _PERIODIC_KINDS and not once and not per_iteration and not single
          and elements is None):
        suggestion = periodic_suggestion(every, text)
    if read_with and not single and elements is None and not suggestion.startswith(("Keep the values on the chip", "Keep the value on the chip: append",
                                                         "Keep the running total on the chip")):
        suggestion += together_text(context, (frame_id, kind, library_frame_id), read_with_keys)
    facts = context_import_facts(context)
    if kind == "synchronize" and facts is not None and facts.device not in ("tpu", "cpu", "host"):
        suggestion = DEVICE_SYNCHRONIZE.format(device=facts.device)
    module = module_of_read(context, frame_id, kind)
    library_read = known_library_read(context, frame_id, kind)
    if library_read is STOPPING_READ and not context.steps:
        library_read = None  # a loop without steps (decoding) has its own advice for a stopping check
    if library_read is not None:
        explanation += f" The read is {library_read[0]}" + ("." if library_read in _LINE_CHECKS else f", inside the call at {where}.")
        suggestion = library_read[1]
    elif library_frame_id is not None:
        suggestion = library_suggestion(context, library_frame_id, kind) or (
            f"The read is the library's ({library}): look for its setting that turns the read off or makes it less "
            "often, or call it less often. " + suggestion)
    elif module is not None:
        explanation += inside_module(module)
        suggestion = change_in_module(context, frame_id, module, where) + then(suggestion)
    if backward_of:
        said, suggestion = backward_text(where, backward_of)
        explanation += said
    elif host_part_at:
        said, suggestion = host_part_text(where, host_part_at)
        explanation += said
    each = per_call_text(context, stall_ns, count, steady_stall, steady_syncs, "stall each")
    evidence = (
        context.evidence_at(f"{plural(count, kind + ' sync')}, {rate}, {each}", frame_id, table="syncs"),
        *((context.evidence_at(f"read inside the library at {library}", library_frame_id, table="syncs"),) if library else ()),
        # An imported capture does not say what a sync forced to run.
        *((Evidence(f"{plural(pending_ops, 'pending op')} forced to run by these syncs", table="syncs"),)
          if facts is None else ()),
    )
    return Finding(
        analyzer=NAME,
        severity=severity,
        title=title,
        explanation=explanation,
        suggestion=suggestion,
        **cost,
        cost_basis=MEASURED_ON_HOST,
        evidence=evidence,
        module=module,
        **context.location_fields(frame_id),
    )


# Reads a line's own check makes (not inside a call on the line).
_LINE_CHECKS = (STOPPING_READ, INNER_STOPPING_READ, ENVIRONMENT_READ, SKIP_READ, NON_FINITE_SKIP_READ, NON_FINITE_STOP_READ)


def library_where(context: AnalysisContext, library_frame_id: int | None) -> str | None:
    """`trainer.py:1956 in _run_epoch` for a library's frame; None without one."""
    location = context.location(library_frame_id) if library_frame_id is not None else None
    if location is None:
        return None
    return f"{location.short} in {location.function}" if location.function else location.short


def library_suggestion(context: AnalysisContext, library_frame_id: int, kind: str) -> str | None:
    """What to change for a read a known library makes (`LIBRARY_SUGGESTIONS`), or None."""
    location = context.location(library_frame_id)
    path = (location.file or "").replace("\\", "/") if location is not None else ""
    return next((text for ending, read, text in LIBRARY_SUGGESTIONS if read == kind and path.endswith(ending)), None)


def known_library_read(context: AnalysisContext, frame_id: int | None, kind: str) -> tuple[str, str] | None:
    """What a `kind` library read at `frame_id`'s line is and how to remove it, when the line ran the ops of an entry of
    `LIBRARY_READS` in the loop (any call on the line: ops and syncs may record its columns differently)."""
    if frame_id is None:
        return None
    where, params = context.loop_where("o")
    for (op_prefixes, read_kind), read in LIBRARY_READS.items():
        if read_kind == kind and all(_ran_at_line(context, frame_id, prefix, where, params) for prefix in op_prefixes):
            return _scaler_read(context) if op_prefixes == UNSCALE_OPS else read
    text = line_text(context.location(frame_id), context.trace) or ""
    if kind == "item" and _SCHEDULER_STEP.search(text):
        return PLATEAU_READ
    if kind == "item" and _STEP_OF_AN_OPTIMIZER.search(text) and _ran_in_loop(context, UNSCALE_OPS[0], where, params):
        return _scaler_read(context)  # `scaler.step(opt)` after `scaler.unscale_(opt)` at another line
    own = line_read(context, frame_id, kind)
    if own is STOPPING_READ and context.steps and _reads_per_step(context, frame_id, kind) >= 2:
        return INNER_STOPPING_READ  # made several times in each step that makes it: an inner loop's stop
    return own


def _reads_per_step(context: AnalysisContext, frame_id: int, kind: str) -> float:
    """The line's reads of `kind` per loop step that had one (through the `end` step)."""
    where, params = context.loop_line_where("s")
    rows = context.trace.sql(f"SELECT COUNT(*), COUNT(DISTINCT s.step) FROM syncs s WHERE {where} AND s.frame_id = ? "
                             "AND s.kind = ?", (*params, frame_id, kind))
    count, steps = rows[0] if rows else (0, 0)
    return count / steps if steps else 0.0


_COPIES_OUT = frozenset({"cpu", "numpy", "tolist"})
KEPT_COPIES = ("Keep the values on the chip while the loop runs: append the tensors themselves (detached, without "
               "`.cpu()`/`.numpy()`/`.tolist()`) and copy the list to the host once after the loop "
               "(`torch.cat(values).cpu()`), or every N steps, so the host can queue the next step while the chip works.")


def _scaler_read(context: AnalysisContext) -> tuple[str, str]:
    """GradScaler's read, and its fix: for a run that autocasts to bfloat16 already (its ops have bfloat16 tensors and
    no float16 ones), that the scaler is needless there."""
    what, fix = LIBRARY_READS[(UNSCALE_OPS, "item")]
    shapes = context.trace.sql(
        "SELECT EXISTS(SELECT 1 FROM strings WHERE text LIKE '%bf16[%'), "
        "EXISTS(SELECT 1 FROM strings WHERE text LIKE 'f16[%' OR text LIKE '% f16[%' OR text LIKE '%(f16[%')",
    )
    bfloat16, float16 = shapes[0] if shapes else (0, 0)
    return (what.replace("float16", "scaled"), SCALER_WITH_BFLOAT16) if bfloat16 and not float16 else (what, fix)


def _ran_in_loop(context: AnalysisContext, op_prefix: str, where: str, params: tuple[int, ...]) -> bool:
    """Whether an op named `op_prefix` (or an overload of it) ran in the loop, at any line."""
    op_sids = [sid for (sid,) in context.trace.sql(
        "SELECT id FROM strings WHERE text = ? OR substr(text, 1, ?) = ?", (op_prefix, len(op_prefix) + 1, op_prefix + "."),
    )]
    return bool(op_sids) and bool(context.trace.sql(
        f"SELECT 1 FROM ops o WHERE {where} AND o.op_sid IN {in_list(op_sids)} LIMIT 1", (*params, *op_sids),
    ))


def _ran_at_line(context: AnalysisContext, frame_id: int, op_prefix: str, where: str, params: tuple[int, ...]) -> bool:
    """Whether an op named `op_prefix` (or an overload of it) ran at `frame_id`'s line where `where` holds. The op
    names come from the (small) strings table, so the ops are read through their op_sid index, and only in runs
    that have such an op."""
    op_sids = [sid for (sid,) in context.trace.sql(
        "SELECT id FROM strings WHERE text = ? OR substr(text, 1, ?) = ?", (op_prefix, len(op_prefix) + 1, op_prefix + "."),
    )]
    return bool(op_sids) and bool(context.trace.sql(
        f"SELECT 1 FROM ops o JOIN frames f ON f.id = o.frame_id JOIN frames sf ON sf.id = ? WHERE {where} "
        f"AND o.op_sid IN {in_list(op_sids)} AND f.file_sid = sf.file_sid AND f.line = sf.line LIMIT 1",
        (frame_id, *params, *op_sids),
    ))


def _period(context: AnalysisContext, frame_id: int | None, kind: str, library_frame_id: int | None) -> tuple[int, int] | None:
    """(n, p) when the line's syncs of `kind` came n at a time in every p-th steady step (`if step % 2 == 0:`)."""
    steady = context.steady_line_range
    return None if steady is None else step_period(_line_counts(context, frame_id, kind, library_frame_id, steady), *steady)


def _from_step(context: AnalysisContext, frame_id: int | None, kind: str, library_frame_id: int | None) -> tuple[int, int] | None:
    """(n, first) when the line's syncs came n at a time in every step from a later steady step `first` to the loop's
    end (`if best is None or loss < best:`, which reads from the second iteration on), not in the steps before it."""
    steady = context.steady_line_range
    if steady is None:
        return None
    counts = _line_counts(context, frame_id, kind, library_frame_id, steady)
    steps = sorted(counts)
    if (len(steps) < 2 or steps[0] <= steady[0] or len(set(counts.values())) != 1
            or steps != list(range(steps[0], steady[1] + 1))):
        return None
    return counts[steps[0]], steps[0]


def _line_counts(context: AnalysisContext, frame_id: int | None, kind: str, library_frame_id: int | None,
                 steady: tuple[int, int]) -> dict[int, int]:
    """The line's syncs of `kind` per step of `steady` (first, last)."""
    library = "library_frame_id IS ?" if context.trace.has_column("syncs", "library_frame_id") else "? IS NULL"
    return {int(step): int(count) for step, count in context.trace.sql(
        f"SELECT step, COUNT(*) FROM syncs WHERE rank = ? AND frame_id IS ? AND kind = ? AND {library} "
        "AND step BETWEEN ? AND ? GROUP BY step",
        (context.rank, frame_id, kind, library_frame_id, *steady),
    )}
