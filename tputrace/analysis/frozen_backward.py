"""A backward through parameters no optimizer steps: a frozen model (a distillation's teacher, a fixed feature
extractor, a target network) run with autograd on, whose output reaches the loss, or weights left out of the optimizer.

The parameters an optimizer steps are the `buffers` rows labelled `gradient` or `optimizer_state` at its steps; the
other parameters (labelled `parameter` when their module's forward first ran) are frozen in this run. When the
backward (the matrix products at the lines that made the stepped gradients, `loss.backward()`) runs products whose
result has a frozen matrix's shape, and no stepped parameter's, contracting over the rows the frozen layers' forward
took, autograd computed those weights' gradients: work no step uses, besides the graph and saved activations the
forward kept for it (an input gradient through a frozen weight, as LoRA's backward runs, has those rows as its result's
and is no weight gradient even when its result's shape matches another weight's). A layer frozen with `requires_grad_(False)`
gets no such product, though the backward may pass through it to reach a trained layer before it. The finding is at
the frozen modules' forward line (their products that take those weights), costing the weight-gradient products; the
backward's other products taking the weights (input gradients) are told apart, waste too unless a trained layer feeds
the frozen model. Weight gradients are read from 2-D products (linear layers) and from convolutions' backward
(`aten.convolution_backward` of a frozen weight whose weight-gradient output is present: its output_mask asked for it),
costing the convolution's weight-gradient FLOPs; its input gradient, when present, is a product through the weight.
The cost is those products' chip time as the run measured it (attributed by FLOP share): the work is wasted on any
chip; where the chips were XLA:CPU, the finding also gives the products' roofline time on the target.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Finding
from tputrace.analysis.matmuls import MatmulGroup, chip_time, matmul_groups
from tputrace.analysis.product_times import on_cpu_chips, projected_ns
from tputrace.analysis.shapes import op_family, parse_specs
from tputrace.wording import format_ns, plural

NAME = "frozen_backward"
MIN_STEP_SHARE = 0.005  # of a step: a smaller waste stays in the data
_TRAINED_KINDS = ("gradient", "optimizer_state")


@dataclass(frozen=True)
class FrozenBackward:
    """The backward's products on frozen weights and the forward line that made them need it."""

    forward_at: str
    modules: tuple[str, ...]
    frozen_parameters: int
    weight_gradients: int  # the backward's products whose result is a frozen weight's gradient
    cost_ns: float  # their chip time
    through_products: int  # the backward's other products that take a frozen weight (input gradients)
    through_ns: float
    projected_ns: float | None = None  # on XLA:CPU chips: the weight-gradient products' roofline time on the target


@dataclass(frozen=True)
class FrozenBackwardData:
    backward: FrozenBackward | None = None


def analyze(context: AnalysisContext) -> AnalysisResult[FrozenBackwardData]:
    if not context.trace.has_table("buffers") or not context.steps:
        return AnalysisResult(NAME, FrozenBackwardData())
    frozen, trained, backward_frames = _parameters(context)
    if not frozen or not backward_frames:
        return AnalysisResult(NAME, FrozenBackwardData())
    frozen_shapes = {shape for shapes in frozen.values() for shape in shapes} - trained
    groups = matmul_groups(context)
    in_backward = [group for group in groups if group.frame_id in backward_frames]
    conv_outputs = _convolution_gradients(context) if any(_is_conv_backward(group) for group in in_backward) else {}
    forward = [group for group in groups if group.frame_id not in backward_frames and group.module in frozen
               and _takes_weight(group, frozen[group.module] - trained)]
    rows = {product.m for group in forward for product in group.products}
    made = {id(group): _makes_weight(group, frozen_shapes, conv_outputs, rows) for group in in_backward}
    # a product that can be read either way (the rows equal the weight's output size) counts only beside a certain one
    certain = any(kind == "certain" for kind in made.values())
    backward = [group for group in in_backward if made[id(group)] == "certain" or (certain and made[id(group)])]
    through = [group for group in in_backward if group not in backward and _takes_weight(group, frozen_shapes)]
    # a convolution's backward that made a frozen weight's gradient and its input's: the input gradient, as many
    # FLOPs as the weight's, is a product through the weight
    through += [group for group in backward
                if _is_conv_backward(group) and conv_outputs.get(group.inputs, (False, False))[0]]
    if not backward or not forward:
        return AnalysisResult(NAME, FrozenBackwardData())
    times = chip_time(context)
    cost = sum(times.attributed_ns(context, group) for group in backward)
    by_line: dict[int | None, float] = defaultdict(float)
    for group in forward:
        by_line[group.frame_id] += group.flops
    forward_frame = max(by_line, key=lambda frame: by_line[frame])
    modules = tuple(sorted({group.module for group in forward if group.module and group.frame_id == forward_frame}))
    weights = sum(len({tuple(sorted(shape)) for shape in frozen[module]}) for module in modules)
    data = FrozenBackward(context.where(forward_frame), modules, weights,
                          sum(group.calls * len(group.products) for group in backward), cost,
                          sum(group.calls * len(group.products) for group in through),
                          sum(times.attributed_ns(context, group) for group in through),
                          sum(projected_ns(context, group) for group in backward) if on_cpu_chips(context) else None)
    finding = _finding(context, data, forward_frame, backward) if _share(context, cost)[0] >= MIN_STEP_SHARE else None
    return AnalysisResult(NAME, FrozenBackwardData(data), (finding,) if finding else ())


def _parameters(context: AnalysisContext) -> tuple[dict[str, set[tuple[int, ...]]], set[tuple[int, ...]], set[int]]:
    """The frozen matrices' shapes by module (each in both orientations: a product may take it transposed), the
    stepped parameters' shapes, and the lines that made the stepped gradients (the backward's)."""
    trace = context.trace
    shapes: dict[str, set[tuple[int, ...]]] = defaultdict(set)
    trained_counts: set[tuple[str, int]] = set()
    backward_frames: set[int] = set()
    params: list[tuple[str, tuple[int, ...]]] = []
    for kind, module_sid, shape_sid, frame_id in trace.sql(
        "SELECT DISTINCT kind, module_sid, shape_sid, frame_id FROM buffers WHERE rank = ? AND module_sid IS NOT NULL "
        "AND kind IN ('parameter', ?, ?)", (context.rank, *_TRAINED_KINDS),
    ):
        module = trace.string(module_sid) or ""
        shape = tuple(int(size) for size in (trace.string(shape_sid) or "").split(",") if size.strip().isdigit())
        if not shape:
            continue
        if kind == "parameter":
            params.append((module, shape))
        else:
            trained_counts.add((module, _numel(shape)))
            if kind == "gradient" and frame_id is not None:
                backward_frames.add(frame_id)
    trained: set[tuple[int, ...]] = set()
    for module, shape in params:
        oriented = {shape, shape[::-1]}
        if (module, _numel(shape)) in trained_counts:
            trained |= oriented
        elif len(shape) >= 2:
            shapes[module] |= oriented
    return dict(shapes), trained, backward_frames


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _is_conv_backward(group: MatmulGroup) -> bool:
    return op_family(group.op) == "aten.convolution_backward"


def _convolution_gradients(context: AnalysisContext) -> dict[str, tuple[bool, bool]]:
    """For each `aten.convolution_backward` signature in the loop, whether it made its input's gradient and its
    weight's (the outputs its output_mask asked for; an output not asked for is recorded as `None`)."""
    trace = context.trace
    where, params = context.loop_where("o")
    made: dict[str, tuple[bool, bool]] = {}
    for inputs_sid, outputs_sid in trace.sql(
        "SELECT DISTINCT o.inputs_sid, o.outputs_sid FROM ops o JOIN strings s ON s.id = o.op_sid "
        f"WHERE {where} AND s.text LIKE 'aten.convolution_backward%'", params,
    ):
        outputs = parse_specs(trace.string(outputs_sid))
        input_grad, weight_grad = made.get(trace.string(inputs_sid) or "", (False, False))
        made[trace.string(inputs_sid) or ""] = (input_grad or (len(outputs) > 0 and outputs[0] is not None),
                                                weight_grad or (len(outputs) > 1 and outputs[1] is not None))
    return made


def _makes_weight(group: MatmulGroup, weights: set[tuple[int, ...]], conv_outputs: dict[str, tuple[bool, bool]],
                  rows: set[int]) -> str | None:
    """Whether a product of `group` is a frozen weight's gradient: "certain", "ambiguous" or None. A linear layer's
    weight gradient `dy.T @ x` has the weight's shape and contracts over the rows of its forward's input (`rows`); its
    input gradient `dy @ w` takes the weight as its second operand and has those rows, so a result of a weight's shape
    with other rows (tokens as many as another weight's inputs) is no weight's gradient. Where both readings fit (the
    rows equal the weight's output size), the product is ambiguous. A convolution's backward made the gradient when its
    weight operand is frozen and its output_mask asked for the weight's gradient."""
    if _is_conv_backward(group):
        specs = parse_specs(group.inputs)
        weight = specs[2] if len(specs) > 2 else None
        made = weight is not None and weight.shape in weights and conv_outputs.get(group.inputs, (False, False))[1]
        return "certain" if made else None
    kinds = set()
    for product in group.products:
        if product.batch != 1 or (product.m, product.n) not in weights or product.k not in rows:
            continue
        kinds.add("ambiguous" if (product.k, product.n) in weights and product.m in rows else "certain")
    return "certain" if "certain" in kinds else "ambiguous" if kinds else None


def _takes_weight(group: MatmulGroup, weights: set[tuple[int, ...]]) -> bool:
    """Whether a product of `group` has a weight of `weights` as its second operand (k, n) or result (m, n), or the
    op takes a tensor of such a shape (a convolution's weight)."""
    if any((product.k, product.n) in weights for product in group.products):
        return True
    return any(spec is not None and len(spec.shape) > 2 and spec.shape in weights for spec in parse_specs(group.inputs))


def _finding(context: AnalysisContext, data: FrozenBackward, forward_frame: int | None,
             backward: list[MatmulGroup]) -> Finding:
    share, basis = _share(context, data.cost_ns)
    modules = ", ".join(data.modules[:4]) + (", ..." if len(data.modules) > 4 else "")
    backward_at = context.where(backward[0].frame_id)
    evidence = [context.evidence_at(
        f"{group.op}({group.inputs}) in the backward: {plural(group.calls, 'call')}, a frozen weight's gradient", group.frame_id,
        table="ops") for group in sorted(backward, key=lambda group: -group.flops)[:4]]
    return Finding(
        analyzer=NAME,
        severity=context.severity(share),
        title=(f"Backward through parameters no optimizer steps: the forward at {data.forward_at} ({modules}) ran with "
               f"autograd on, and {backward_at} computes gradients for it that nothing uses"),
        explanation=(
            f"No optimizer steps the {plural(data.frozen_parameters, 'weight')} of {modules}, yet their forward at "
            f"{data.forward_at} kept its graph and the backward at {backward_at} computed their gradients: "
            f"{plural(data.weight_gradients, 'weight-gradient product')} in the loop whose results no step uses (the weights' "
            f"`.grad` is never stepped), an estimated {format_ns(data.cost_ns)} of chip time ({share:.1%} of {basis}; "
            f"their elementwise backward comes on top){_projected_text(context, data)}, besides the activations the "
            "forward saved for them."
            + (f" The backward also ran {plural(data.through_products, 'product')} through those weights "
               f"({format_ns(data.through_ns)}), waste as well unless a trained layer feeds the model's input."
               if data.through_products else "")
        ),
        suggestion=(
            f"If {_roots(data.modules)} is frozen on purpose (a distillation's teacher, a fixed feature extractor), call "
            f"it (its forward runs at {data.forward_at}) under `torch.no_grad()` (or `torch.inference_mode()`), or "
            "`.detach()` its output, and freeze it with `requires_grad_(False)` (and `eval()` for a teacher): the loss "
            "then takes its output as a constant and the backward stops there. If its weights should train, pass them "
            "to the optimizer."
        ),
        cost_total_ns=data.cost_ns,
        cost_per_step_ns=context.per_step(data.cost_ns),
        evidence=tuple(evidence),
        module=data.modules[0] if data.modules else None,
        **context.location_fields(forward_frame),
    )


def _share(context: AnalysisContext, cost_ns: float) -> tuple[float, str]:
    """The products' chip time as a share of the median step, and what it is a share of (`a step`). Where the chip's
    measured busy time per step passed the step's time on the host clock (a queue of programs the host ran ahead of,
    as XLA:CPU executions can be), the share is of that busy time, the clock the cost was measured on, so it never
    passes 100%."""
    step_share = context.share_of_step(cost_ns)
    times = chip_time(context)
    if not times.measured:
        return min(step_share, 1.0), "a step"
    busy_share = cost_ns / times.execution_ns
    return (step_share, "a step") if step_share <= busy_share else (min(busy_share, 1.0), "the chip's busy time in the loop")


def _projected_text(context: AnalysisContext, data: FrozenBackward) -> str:
    """Beside a cost measured on XLA:CPU chips, what the products would take on the target (a roofline estimate)."""
    if data.projected_ns is None:
        return ""
    return (f", measured on this run's XLA:CPU chips: on {context.target.label} they would take about "
            f"{format_ns(data.projected_ns)} (roofline estimate from their FLOPs and bytes)")


def _roots(modules: tuple[str, ...]) -> str:
    """`Teacher` for `Teacher.body.0` and `Teacher.head`: the models the modules belong to."""
    roots = sorted({module.split(".", 1)[0] for module in modules})
    return " and ".join(f"the `{root}` model" for root in roots) if roots else "the frozen model"
