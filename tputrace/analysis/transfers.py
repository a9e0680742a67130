"""Transfers in the loop: host-to-chip copies made every step, per line.

Copies made inside a CPU fallback (its inputs going out and its results coming back) belong to the
fallback and are left out. A line that uploads the same number of bytes every step is likely a
constant built on the host each step (a mask, a position table, a scalar tensor). A line that copied
only in the warm-up step of a loop of two steps (where it counts as steady) is set-up, not the loop; so are the
copies a library's one-off set-up makes at a line (DDP's bucket rebuild, see `library_set_up`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputrace.analysis.batch_copies import LineCopies, merge_batches
from tputrace.analysis.call_sites import line_text
from tputrace.analysis.context import MIN_LISTED_COST_NS, AnalysisContext, outside_fallbacks, per_step_text, step_period
from tputrace.analysis.findings import AnalysisResult, Finding
from tputrace.analysis.library_set_up import own_copies
from tputrace.analysis.line_reads import environment_steps
from tputrace.wording import format_bytes, format_ns, plural

NAME = "transfers"

_OUTSIDE_FALLBACKS = outside_fallbacks("t")
# A host random draw on a copying line: `torch.randn(8, 16).to("tpu")`, `torch.randint(0, T, (8,)).cuda()`.
_HOST_DRAW = re.compile(r"\b(?P<draw>torch\.(?:randn|rand|randint|randperm|normal|bernoulli|poisson))\((?P<arguments>[^()]*(?:\([^()]*\)[^()]*)*)\)")
# A tensor made on the host from sizes alone, copied: `torch.triu(torch.ones(n, n), 1).to(x.device)` (a causal mask).
_HOST_FACTORY = re.compile(r"\b(?P<made>torch\.(?:ones|zeros|full|arange|eye|linspace|empty))\("
                           r"(?P<arguments>[^()]*(?:\([^()]*\)[^()]*)*)\)")
# Rows of a host tensor copied: `data[idx].to("tpu")`, `images[perm[i:i + 64]].cuda()` (an in-memory dataset's batch).
_HOST_ROWS = re.compile(r"(?<![\w.])(?P<source>[A-Za-z_]\w*(?:\.\w+)*)\[(?P<index>[^\[\]]*(?:\[[^\[\]]*\][^\[\]]*)*)\]"
                        r"\s*\.(?:to|cuda)\(")
_FIELD = re.compile(r"^\s*(?:-?\d+|'[^']*'|\"[^\"]*\")\s*$")
_LIKE_DRAWS = ("torch.randn", "torch.rand")
_FROM_TENSOR_DRAWS = ("torch.bernoulli", "torch.poisson")  # they take no `device=`: they draw where their input is


def _steps_by_line(context: AnalysisContext) -> dict[int, dict[int, int]]:
    """Each loop line's host-to-chip copies per step, through the trailing `end` step (`loop_line_where`)."""
    where, params = context.loop_line_where("t")
    by_line: dict[int, dict[int, int]] = {}
    for frame_id, step, count in context.trace.sql(
            f"SELECT t.frame_id, t.step, COUNT(*) FROM transfers t WHERE {where} AND t.direction = 'h2d' "
            f"AND {_OUTSIDE_FALLBACKS} AND {own_copies(context, 't')} GROUP BY t.frame_id, t.step", params):
        by_line.setdefault(frame_id, {})[int(step)] = int(count)
    return by_line


def _fixed_sizes(context: AnalysisContext, frame_id: int, steady_where: str,
                 steady_params: tuple[object, ...]) -> list[int] | None:
    """The sizes in bytes of a line's copies when every steady step copied the same ones (one tensor of one size, or
    several tensors each of its own fixed size: a batch's fields, a few constants); None when they change."""
    by_step: dict[int, set[tuple[int, int]]] = {}
    for step, nbytes, count in context.trace.sql(
            f"SELECT t.step, t.bytes, COUNT(*) FROM transfers t WHERE {steady_where} AND t.frame_id = ? "
            f"AND t.direction = 'h2d' AND {_OUTSIDE_FALLBACKS} AND {own_copies(context, 't')} GROUP BY t.step, t.bytes", (*steady_params, frame_id)):
        by_step.setdefault(int(step), set()).add((int(nbytes or 0), int(count)))
    copied = list(by_step.values())
    if not copied or any(sizes != copied[0] for sizes in copied[1:]):
        return None
    return sorted(size for size, count in copied[0] for _ in range(count))


def host_random_draw(text: str | None) -> str | None:
    """`torch.randn` when the line draws random numbers on the host (a draw without `device=`), else None."""
    draw = _HOST_DRAW.search(text or "")
    return draw["draw"] if draw is not None and "device" not in draw["arguments"] else None


@dataclass(frozen=True)
class TransferLine:
    """Host-to-chip copies at one line: per steady step, and in all of the loop's steps."""

    where: str
    count_per_step: float
    bytes_per_step: float
    time_per_step_ns: float
    steps: int
    same_size_every_time: bool
    total_bytes: int
    total_ns: int


@dataclass(frozen=True)
class TransfersData:
    lines: tuple[TransferLine, ...] = ()  # the costliest lines (none for a run without steps)
    bytes_per_step: float = 0.0


def analyze(context: AnalysisContext) -> AnalysisResult[TransfersData]:
    trace = context.trace
    if not context.steps:
        return AnalysisResult(NAME, TransfersData())
    placed: list[tuple[int | None, Finding]] = []  # each line's finding
    steady_where, steady_params = context.steady_where("t")
    loop_where, loop_params = context.loop_where("t")
    steady_rows = trace.sql(
        "SELECT t.frame_id, COUNT(*), COALESCE(SUM(t.bytes), 0), COALESCE(SUM(t.dur_ns), 0), COUNT(DISTINCT t.step), "
        f"MIN(t.bytes), MAX(t.bytes), MAX(t.step) FROM transfers t WHERE {steady_where} "
        f"AND t.direction = 'h2d' AND {_OUTSIDE_FALLBACKS} AND {own_copies(context, 't')} GROUP BY t.frame_id ORDER BY 4 DESC",
        steady_params,
    )
    loop_totals = {
        frame_id: (count, nbytes, dur_ns, loop_steps)
        for frame_id, count, nbytes, dur_ns, loop_steps in trace.sql(
            "SELECT t.frame_id, COUNT(*), COALESCE(SUM(t.bytes), 0), COALESCE(SUM(t.dur_ns), 0), COUNT(DISTINCT t.step) "
            "FROM transfers t "
            f"WHERE {loop_where} AND t.direction = 'h2d' AND {_OUTSIDE_FALLBACKS} AND {own_copies(context, 't')} "
            "GROUP BY t.frame_id",
            loop_params,
        )
    }
    steady_count = max(context.steady_count, 1)
    environments = environment_steps(context)
    line_steps = _steps_by_line(context)
    lines: list[TransferLine] = []
    batch_fields: list[LineCopies] = []  # lines copying every step with the general advice: fields of a batch
    warm_up = context.warm_up_in_steady
    for frame_id, count, nbytes, dur_ns, steps_with, min_bytes, max_bytes, last_step in steady_rows:
        if last_step == warm_up:
            continue  # copied before the loop's second step only: set-up (a model's `.to`), not the loop
        total_count, total_bytes, total_ns, loop_steps = loop_totals.get(frame_id, (count, nbytes, dur_ns, steps_with))
        per_step_bytes = nbytes / steady_count
        per_step_count = count / steady_count
        sizes = _fixed_sizes(context, frame_id, steady_where, steady_params)
        constant_size = sizes is not None
        lines.append(TransferLine(context.where(frame_id), per_step_count, per_step_bytes, dur_ns / steady_count,
                                  steps_with, constant_size, total_bytes, total_ns))
        steps_copied = line_steps.get(frame_id, {})  # with the `end` step, where a copy after the last step lands
        loop_steps = max(loop_steps, len(steps_copied))
        cost = context.line_cost(dur_ns, total_ns, loop_steps, count)
        once = context.once_in_loop(loop_steps, count)
        if cost["cost_total_ns"] < MIN_LISTED_COST_NS:
            continue
        steady = context.steady_line_range
        every = None if steady is None else step_period(
            {step: copies for step, copies in steps_copied.items() if steady[0] <= step <= steady[1]}, *steady)
        rate = per_step_text(count, steady_count, "copy", "copies", every=every)
        share = context.share_of_steps_less_compiles(dur_ns)
        severity = context.severity(share)
        where = context.where(frame_id)
        every_step = steps_with >= steady_count
        text = line_text(context.location(frame_id), context.trace)
        rows = _HOST_ROWS.search(text or "")
        rows = None if rows is None or _FIELD.match(rows["index"]) else rows  # `batch[0]`, `batch["ids"]`: a field
        draw = None if rows is not None else host_random_draw(text)
        factory = _HOST_FACTORY.search(text or "") if rows is None and draw is None else None
        made = factory["made"] if factory is not None and "device" not in factory["arguments"] else None
        same = ("the same size every time" if sizes is not None and len(sizes) == 1 else
                f"{len(sizes)} tensors of fixed sizes ({', '.join(format_bytes(size) for size in sizes)}), each the "
                "same size every step" if sizes is not None else "")
        read_back = _reads_back(context, frame_id)
        what = (same + ": " + ("values the line read from the chip" if read_back else
                                                f"random numbers drawn on the host by `{draw}`" if draw else
                                                f"rows of the host tensor `{rows['source']}`" if rows else
                                                f"a constant built on the host by `{made}`" if made else
                                                "a constant built on the host, or the input batch" if len(sizes or ()) == 1
                                                else "constants built on the host, or the input batch's tensors")
                if constant_size else "sizes that change from step to step")
        general = False
        if max_bytes == 0:
            what = ("every copy empty: tensors of no elements made from host data, e.g. `torch.tensor([], "
                    "device=...)`; each moves nothing and still costs a transfer")
            suggestion = (
                f"Make the empty tensors at {where} on the chip (`torch.empty(0, device=...)`), or once before the "
                f"loop; when a library makes them on every call, turn off what needs them (a Hugging Face model "
                f"builds its key/value cache this way on every forward unless `use_cache=False`, which training "
                f"does not need)."
            )
        elif once:
            suggestion = (
                "It was copied in one step only, so it costs its time once, not every step: if it is a value the "
                "loop makes on a condition (a table, a mask), make it on the chip (`device=...`) or before the loop."
            )
        elif total_count in environments and total_count > context.step_count:
            suggestion = (
                f"The line copies what the environment on the host returns (its observation), once per environment "
                f"step, as {environments[total_count]} steps it: the copy stays while the environment runs on the host. "
                "Make fewer, larger copies: step many environments at once (a vectorized environment, "
                "`gymnasium.vector`) and copy all their observations as one array per step, with one read of all their "
                "actions."
            )
        elif read_back:
            suggestion = (
                "The line reads values from the chip (`.item()`, `.tolist()`) and copies them back in a new tensor "
                "(`torch.tensor([loss.item(), ...], device=...)`) every step, a wait and a copy for values the chip "
                "had: keep them there, `torch.stack([loss.detach(), accuracy])`, and reduce or log that tensor (an "
                "all-reduce runs on it as it is), reading it every N steps or after the loop."
            )
        elif rows is not None:
            suggestion = (
                f"The line copies rows picked from the host tensor `{rows['source']}` (`{rows['source']}[...]`) every "
                f"step, an in-memory dataset's batch: if `{rows['source']}` fits in the chip's memory, copy it to the "
                "chip once before the loop and pick the rows there, with indices made on the chip "
                "(`torch.randint(..., device=...)`, `torch.randperm(n, device=...)`), so a step copies nothing; "
                "else copy the next batch while the current step runs."
            )
        elif draw in _FROM_TENSOR_DRAWS:
            suggestion = (
                f"The line draws random numbers on the host (`{draw}(...)`) and copies them to the chip every step: "
                f"`{draw}` draws where its input is, so make that input on the chip (`torch.full_like(x, p)` or "
                "`torch.full(shape, p, device=x.device)` for a tensor x already there)"
                + (", or draw the mask as `torch.rand_like(x) < p`" if draw == "torch.bernoulli" else "")
                + ", so nothing is copied and the step's program makes them."
            )
        elif draw is not None:
            suggestion = (
                f"The line draws random numbers on the host (`{draw}(...)`) and copies them to the chip every step: "
                f"draw them on the chip instead (`{draw}(..., device=x.device)`"
                + (f", or `{draw}_like(x)` shaped like a tensor x already there" if draw in _LIKE_DRAWS else "")
                + "), so nothing is copied and the step's program makes them."
            )
        elif made is not None:
            suggestion = (
                f"The line builds a tensor on the host (`{made}(...)` without `device=`) and copies it to the chip every "
                f"step: build it on the chip (`{made}(..., device=x.device)`), or once, before the loop (a buffer "
                "made in the module's `__init__` with `register_buffer`, at the largest size and sliced), so nothing is "
                "copied."
            )
        elif constant_size:
            general = every_step
            suggestion = (
                f"If it is a constant (a mask, a table, a `torch.tensor(...)`), build it on the chip once, before "
                f"the loop (create it with `device=...`, keep it with `register_buffer`, or cache it) instead of "
                f"copying it from the host at {where} every step; if it is the input batch, copy the next batch "
                f"while the current step runs."
            )
        else:
            general = every_step
            suggestion = (
                f"If this is input data, prefetch the next batch to the chip while the current step runs; if it is "
                f"derived from values already on the chip, compute it there instead of at {where} on the host."
            )
        finding = Finding(
            analyzer=NAME,
            severity=severity,
            title=(
                f"Host-to-chip copy in one step at {where}: {format_bytes(total_bytes)}" if once
                else f"Host-to-chip copies in the loop at {where}: {format_bytes(per_step_bytes)} per step, {rate}"
            ),
            explanation=(
                f"{where} copied {format_bytes(total_bytes)} from the host to the chip in {plural(total_count, 'copy', 'copies')} "
                f"({'every step' if every_step else f'in {steps_with} of {steady_count} steady steps'}"
                f"{'' if once else '; ' + what}), "
                f"taking {format_ns(total_ns)} ({_steady_part(context, total_ns, dur_ns, share)})."
            ),
            suggestion=suggestion,
            **cost,
            evidence=(
                context.evidence_at(
                    f"h2d: {rate}, "
                    + (f"{format_bytes(min_bytes)} each" if min_bytes == max_bytes else
                       f"of fixed sizes {', '.join(format_bytes(size) for size in sizes)} every step" if sizes else
                       f"{format_bytes(min_bytes)} to {format_bytes(max_bytes)} each"),
                    frame_id, table="transfers",
                ),
            ),
            **context.location_fields(frame_id),
        )
        placed.append((frame_id, finding))
        if general and frame_id is not None:
            batch_fields.append(LineCopies(frame_id, per_step_count, per_step_bytes, dur_ns, finding))
    merged = merge_batches(context, batch_fields)  # a batch's lines: one finding at its first, none at the others
    findings = [kept for kept in (merged[frame_id] if frame_id in merged else finding for frame_id, finding in placed)
                if kept is not None]
    data = TransfersData(tuple(lines[:50]), sum(line.bytes_per_step for line in lines))
    return AnalysisResult(NAME, data, tuple(findings))


def _steady_part(context: AnalysisContext, total_ns: float, steady_ns: float, share: float) -> str:
    """The steady steps' share of the copies' time, and their own time where the warm-up's copies (a first copy that
    waited for its program's compile) took most of the total, so the share is not read as the total's."""
    if context.steps and total_ns > 2 * steady_ns:
        return f"{format_ns(steady_ns)} of it in the steady steps, {context.share_text(share)}"
    return context.share_text(share)


def _reads_back(context: AnalysisContext, frame_id: int | None) -> bool:
    """Whether the line read values from the chip in the steady steps (`torch.tensor([loss.item()], device=...)`)."""
    where, params = context.steady_where()
    return frame_id is not None and bool(context.trace.sql(
        f"SELECT 1 FROM syncs WHERE {where} AND frame_id = ? AND kind IN ('item', 'tolist', 'cpu', 'numpy') LIMIT 1",
        (*params, frame_id)))
