"""Float32 matmuls on a bfloat16-native MXU.

The MXU multiplies bfloat16; a float32 product takes six bfloat16 passes at PyTorch's default
precision ("highest"), three at `torch.set_float32_matmul_precision("high")` and one at "medium"
(`chips.PRECISION_PASSES`). Per product, the analyzer compares the target's roofline time at the
setting it ran at with the same product's compute at bfloat16 speed (bytes unchanged: autocast keeps
float32 weights and casts on the fly), an estimate, and takes that share of the product's chip time: measured on a
TPU, the target's roofline time where the run's chips were XLA:CPU (`product_times`), whose own times say nothing of
the MXU's passes. Memory-bound products gain nothing and are left out, and so are products that already ran at
"medium". For products at "highest" it also estimates the lighter change, "high".
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import PROJECTED_FOR_TARGET, AnalysisResult, Finding
from tputrace.analysis.matmuls import MatmulGroup, chip_time, matmul_groups
from tputrace.analysis.product_times import group_chip_ns, on_cpu_chips, projected_step_share
from tputrace.analysis.shapes import Matmul
from tputrace.wording import format_ns, plural

NAME = "precision"
MIN_REPORTED_SHARE = 0.005
_AT_HIGH = ' at matmul precision "high"'
_PASSES = {"highest": "six bfloat16 passes", "high": "three bfloat16 passes"}


def saving_fraction(product: Matmul, context: AnalysisContext, precision: str = "highest", to: str = "medium") -> float:
    """Share of a float32 product's target time at matmul precision `precision` that compute at `to`
    would save; "medium" is compute at bfloat16 speed (0 when memory-bound)."""
    target = context.target
    ran_ns = target.roofline_ns(product.flops, product.bytes, "f32", precision)
    reduced_ns = target.roofline_ns(product.flops, product.bytes, "f32", to)
    return max(1.0 - reduced_ns / ran_ns, 0.0) if ran_ns else 0.0


def _weighted(fractions: list[float], products: tuple[Matmul, ...]) -> float:
    weights = [product.flops for product in products]
    return sum(f * w for f, w in zip(fractions, weights)) / sum(weights) if sum(weights) else 0.0


@dataclass(frozen=True)
class Fp32Product:
    """One float32 matmul-like op shape at one line: its precision setting and what lower precision would save
    of its chip time (shares, estimates)."""

    op: str
    inputs: str
    module: str | None
    where: str
    calls: int
    flops: float
    matmul_precision: str
    compute_bound_on_target: bool
    saving_estimate: float
    high_saving_estimate: float
    chip_ns: float


@dataclass(frozen=True)
class PrecisionData:
    fp32_matmul_flop_share: float
    products: tuple[Fp32Product, ...] = ()  # those that would save the most
    saving_estimate_ns: float = 0.0  # computing in bfloat16 ("medium")
    high_saving_estimate_ns: float = 0.0  # at "high", for products that ran at "highest"
    chip_time: str = "measured"  # or "target roofline estimate": the products' chip time the savings are shares of


def analyze(context: AnalysisContext) -> AnalysisResult[PrecisionData]:
    groups = [group for group in matmul_groups(context) if all(product.dtype == "f32" for product in group.products)]
    all_flops = sum(group.flops for group in matmul_groups(context))
    flop_share = sum(group.flops for group in groups) / all_flops if all_flops else 0.0
    if not groups:
        return AnalysisResult(NAME, PrecisionData(flop_share))
    times = chip_time(context)
    projected = on_cpu_chips(context)
    by_module: dict[tuple[str | None, int | None], list[tuple[MatmulGroup, float, float]]] = defaultdict(list)
    rows: list[Fp32Product] = []
    high_cost = 0.0
    for group in groups:
        fraction = _weighted([saving_fraction(product, context, group.precision) for product in group.products], group.products)
        chip_ns = group_chip_ns(context, times, group)
        high_fraction = 0.0
        if group.precision == "highest":
            high_fraction = _weighted([saving_fraction(product, context, to="high") for product in group.products], group.products)
        rows.append(Fp32Product(
            group.op, group.inputs, group.module, context.where(group.frame_id), group.calls, group.flops,
            group.precision, fraction > 0, fraction, high_fraction, chip_ns,
        ))
        if fraction > 0:
            by_module[(group.module, group.frame_id)].append((group, fraction * chip_ns, chip_ns))
            high_cost += high_fraction * chip_ns
    products = tuple(sorted(rows, key=lambda row: -row.saving_estimate * row.chip_ns)[:100])
    entries = [entry for entries in by_module.values() for entry in entries]
    cost = sum(saving for _, saving, _ in entries)
    step_share = projected_step_share(context, cost) if projected else None
    share = context.share_of_step(cost) if step_share is None else step_share
    data = PrecisionData(flop_share, products, cost, high_cost, "target roofline estimate" if projected or not times.measured else "measured")
    if not entries or share < MIN_REPORTED_SHARE:
        return AnalysisResult(NAME, data)
    # Point at the forward call (it has a module) that would save the most.
    ranked = sorted(by_module.items(), key=lambda item: (item[0][0] is None, -sum(saving for _, saving, _ in item[1])))
    (module, frame_id), _ = ranked[0]
    chip_ns = sum(chip for _, _, chip in entries)
    flops = sum(group.flops for group, _, _ in entries)
    modules = sorted({group.module for group, _, _ in entries if group.module})
    evidence = tuple(
        context.evidence_at(
            f"{group.op}({group.inputs}) in {group.module or 'no module'}: {plural(group.calls, 'call')}, "
            f"{format_ns(saving)} of {format_ns(chip)} saved in bfloat16 (estimate)",
            group.frame_id, module=group.module, table="ops",
        )
        for group, saving, chip in sorted(entries, key=lambda entry: -entry[1])[:5]
    )
    where = context.where(frame_id)
    chip_step = f"'s projected chip time on {context.target.label}"
    at_highest = any(group.precision == "highest" for group, _, _ in entries)
    finding = Finding(
        analyzer=NAME,
        severity=context.severity(share),
        title=(
            f"Float32 matmuls on a bfloat16 MXU: {flops / max(context.step_count, 1) / 1e9:.3g} GFLOP per step in "
            f"float32{'' if at_highest else _AT_HIGH}{' in ' + module if module else ''} at {where}"
        ),
        explanation=(
            f"{len(entries)} compute-bound matmul shapes ({', '.join(modules[:4]) or 'no module'}) run in float32"
            f"{_precision_counts(entries)}. {context.target.label}'s MXU multiplies bfloat16, so each float32 product "
            f"takes several passes (peak float32 at \"highest\" is estimated at {context.target.peak_fp32_flops / 1e12:.0f} "
            f"TFLOP/s against {context.target.peak_bf16_flops / 1e12:.0f} in bfloat16). "
            f"{_chip_time_text(context, chip_ns, projected)}, of which bfloat16 compute would save about "
            f"{format_ns(cost)} ({share:.0%} of a step{'' if step_share is None else chip_step}; estimate)."
        ),
        suggestion=_suggestion(at_highest, high_cost),
        cost_total_ns=cost,
        cost_basis=PROJECTED_FOR_TARGET,
        cost_per_step_ns=context.per_step(cost),
        evidence=evidence,
        module=module,
        **context.location_fields(frame_id),
    )
    return AnalysisResult(NAME, data, (finding,))


def _chip_time_text(context: AnalysisContext, chip_ns: float, projected: bool) -> str:
    """What the products' chip time is: measured, or on XLA:CPU chips the target's roofline time."""
    if projected:
        return (f"On {context.target.label} they would take about {format_ns(chip_ns)} of chip time (roofline estimate "
                "from their FLOPs and bytes: this run's chips were XLA:CPU, whose times say nothing of the MXU)")
    return f"They account for {format_ns(chip_ns)} of chip time"


def _precision_counts(entries: list[tuple[MatmulGroup, float, float]]) -> str:
    """E.g. ' (matmul precision: 3 at "highest": six bfloat16 passes; 1 at "high": three bfloat16 passes)'."""
    counts = Counter(group.precision for group, _, _ in entries)
    parts = [f'{counts[name]} at "{name}": {_PASSES[name]}' for name in _PASSES if counts[name]]
    return f" (matmul precision: {'; '.join(parts)})" if parts else ""


def _suggestion(at_highest: bool, high_cost: float) -> str:
    """The lighter change first: a lower float32 matmul precision keeps the model in float32."""
    autocast = (
        "run the forward pass under `torch.autocast(device_type=\"tpu\", dtype=torch.bfloat16)` (keep the loss "
        "and optimizer in float32), or cast the model with `model.to(torch.bfloat16)` if the accuracy allows."
    )
    if at_highest:
        return (
            "The lighter change: `torch.set_float32_matmul_precision(\"high\")` runs float32 products as three "
            f"bfloat16 passes (bf16_3x, close to float32 accuracy) instead of six, saving about {format_ns(high_cost)} "
            "(estimate); `\"medium\"` runs one pass, bfloat16 compute on float32 tensors. Or " + autocast
        )
    return (
        "They already run at `torch.set_float32_matmul_precision(\"high\")`: `\"medium\"` runs one bfloat16 pass "
        "instead of three, the saving estimated here. Or " + autocast
    )
