"""Which of a rank's own collectives (no recorded cause) move the model's activations rather than its gradients: those
issued in the forward pass (a tensor-parallel layer's `torch.distributed.nn.functional.all_reduce`, a plain call inside
a module's `forward`), and the calls their backward issues in turn. Advice meant for gradient reductions (DDP buckets,
`no_sync`, flattening the gradients) does not fit them.

From what the trace records: a call issued inside a backward pass has the line that called `backward()` (the frame of
the pass's `backward_end` flush, or, without flushes, of its `*_backward` ops); a call not inside one is in the forward
pass when it started before its step's backward did (the first op at a backward line), and a gradient reduction by hand
when it started after (between the backward and the optimizer step). A line where the rank also ran ops inside a
module's `forward` (a differentiable collective's copy of its input) is in the forward pass whatever the steps (a run
without steps has no step to compare with). A recorded run without any backward pass reduces no gradients; an
imported capture, whose backward passes are not marked, is not judged. The calls a backward pass issues are the mirror of the forward's where the rank issued forward collectives
and DDP issued none (a differentiable collective's backward is a collective), and gradient reductions otherwise (a
gradient hook's all-reduce).
"""

from __future__ import annotations

from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext

_CACHE_KEY = "collective_phases"
# The kinds a layer split over ranks communicates with; sends and receives (pipeline stages), broadcasts and barriers
# have fixes of their own.
MODEL_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class CollectivePhases:
    """The rank's user collective lines (kind, frame id) by phase."""

    forward: frozenset[tuple[str, int | None]]
    backward: frozenset[tuple[str, int | None]]  # issued inside backward: the mirror of forward calls, or gradient hooks
    backward_mirrors_forward: bool

    def moves_activations(self, kind: str, frame_id: int | None) -> bool:
        """Whether the line's calls are the model's own communication, not a gradient reduction."""
        line = (kind, frame_id)
        return line in self.forward or (self.backward_mirrors_forward and line in self.backward)

    def backward_lines(self) -> frozenset[tuple[str, int | None]]:
        return self.backward if self.backward_mirrors_forward else frozenset()


def collective_phases(context: AnalysisContext) -> CollectivePhases:
    """The analysed rank's user collective lines by phase (computed once per rank)."""
    cached = context.cache.get(_CACHE_KEY)
    if isinstance(cached, CollectivePhases):
        return cached
    phases = _phases(context)
    context.cache[_CACHE_KEY] = phases
    return phases


def _phases(context: AnalysisContext) -> CollectivePhases:
    trace, rank = context.trace, context.rank
    if trace.meta.get("imported"):  # a capture's backward passes are not marked as a recording's are
        return CollectivePhases(frozenset(), frozenset(), False)
    backward_frames = {frame_id for (frame_id,) in trace.sql(
        "SELECT DISTINCT frame_id FROM flushes WHERE rank = ? AND trigger = 'backward_end'", (rank,))} if trace.has_table("flushes") else set()
    if not backward_frames:
        backward_frames = {frame_id for (frame_id,) in trace.sql(
            "SELECT DISTINCT o.frame_id FROM ops o JOIN strings s ON s.id = o.op_sid WHERE o.rank = ? AND s.text LIKE '%\\_backward%' ESCAPE '\\'",
            (rank,))}
    backward_frames.discard(None)
    caused = " AND cause_id IS NULL" if trace.has_column("collectives", "cause_id") else ""
    kinds = ", ".join(f"'{kind}'" for kind in MODEL_KINDS)
    calls = trace.sql(f"SELECT kind, frame_id, step, start_ns FROM collectives WHERE rank = ? AND kind IN ({kinds}){caused}", (rank,))
    backward_starts: dict[int, int] = {}
    if backward_frames:
        marks = ", ".join("?" * len(backward_frames))
        backward_starts = {step: start for step, start in trace.sql(
            f"SELECT step, MIN(start_ns) FROM ops WHERE rank = ? AND frame_id IN ({marks}) GROUP BY step", (rank, *backward_frames))}
    forward: set[tuple[str, int | None]] = set()
    backward: set[tuple[str, int | None]] = set()
    after: set[tuple[str, int | None]] = set()  # after the backward: gradients reduced by hand
    for kind, frame_id, step, start_ns in calls:
        line = (kind, frame_id)
        if frame_id is None:
            continue
        if frame_id in backward_frames:
            backward.add(line)
        elif not backward_frames or (step in backward_starts and start_ns < backward_starts[step]):
            forward.add(line)
        else:
            after.add(line)
    forward -= after | backward  # a line with calls on both sides of a backward is not only the forward's
    frames = {frame_id for _, frame_id in after if frame_id is not None}
    if frames:
        marks = ", ".join("?" * len(frames))
        in_modules = {frame_id for (frame_id,) in trace.sql(
            f"SELECT DISTINCT frame_id FROM ops WHERE rank = ? AND module_sid IS NOT NULL AND frame_id IN ({marks})", (rank, *frames))}
        forward |= {line for line in after if line[1] in in_modules}
    ddp = trace.has_table("collective_causes") and bool(trace.sql(
        "SELECT 1 FROM collective_causes WHERE rank = ? AND kind LIKE 'ddp%' LIMIT 1", (rank,)))
    mirrors = bool(forward) and not ddp
    return CollectivePhases(frozenset(forward), frozenset(backward), mirrors)


def forward_fix(context: AnalysisContext, kind: str, frame_id: int | None) -> str:
    """The change for a line whose collectives move activations: a sharding plan that communicates less, overlap, or no
    split at all; never the gradient advice (DDP buckets, `no_sync`, flattening gradients)."""
    phases = collective_phases(context)
    at = context.where(frame_id)
    in_backward = (kind, frame_id) in phases.backward_lines()
    mirror = ""
    if not in_backward and phases.backward_lines():
        lines = sorted({context.where(line_frame) for _, line_frame in phases.backward_lines()})
        mirror = f" (its backward issues the matching calls at {', '.join(lines)})"
    what = (f"The {kind} calls at {at} run inside the backward pass as the mirror of the forward pass's collectives"
            if in_backward else f"The {kind} at {at} runs in the model's forward pass{mirror}")
    if kind == "all_to_all":
        # an exchange of activations between ranks that hold different parts of the model (experts, heads, sequence)
        return (f"{what}: it exchanges activations between the ranks that hold different parts of the model (expert or "
                "sequence parallelism), not gradients, so gradient bucketing and `no_sync` do not apply to it. Overlap it "
                "with compute that does not need its result (issue it asynchronously and wait just before the use), and "
                "exchange fewer, larger messages (one exchange per layer).")
    return (f"{what}: they move activations between the ranks that split the layers (tensor parallelism), not gradients, so "
            "gradient bucketing and `no_sync` do not apply to them. Communicate once per block: a column-parallel layer (weights split "
            "by output features) feeding a row-parallel one needs a single all-reduce after the pair (`ColwiseParallel` then "
            "`RowwiseParallel` in `parallelize_module`); sequence parallelism (`SequenceParallel`) turns it into a "
            "reduce-scatter and an all-gather, with the elementwise work between them on shards. Overlap what remains with "
            "compute that does not need its result (issue it asynchronously and wait just before the use); where the model "
            "fits on each chip, replicate it (data parallelism) and these calls go.")
