"""Float32 matmuls on a bfloat16-native MXU.

The MXU multiplies bfloat16; a float32 product at PyTorch's default precision takes several bfloat16
passes (see `chips.FP32_PASSES`). Per product, the analyzer compares the target's roofline time in
float32 with the same product's compute at bfloat16 speed (bytes unchanged: autocast keeps float32
weights and casts on the fly), an estimate. Memory-bound products gain nothing and are left out.
"""

from __future__ import annotations

from collections import defaultdict

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Finding
from tputrace.analysis.matmuls import MatmulGroup, chip_time, matmul_groups
from tputrace.analysis.shapes import Matmul
from tputrace.summary import format_ns

NAME = "precision"
MIN_REPORTED_SHARE = 0.005


def saving_fraction(product: Matmul, context: AnalysisContext) -> float:
    """Share of a float32 product's target time that bfloat16 compute would save (0 when memory-bound)."""
    target = context.target
    fp32_ns = target.roofline_ns(product.flops, product.bytes, "f32")
    memory_ns = product.bytes / target.hbm_bandwidth * 1e9
    bf16_ns = max(product.flops / target.peak_bf16_flops * 1e9, memory_ns)
    return 1.0 - bf16_ns / fp32_ns if fp32_ns else 0.0


def analyze(context: AnalysisContext) -> AnalysisResult:
    result = AnalysisResult(NAME)
    groups = [group for group in matmul_groups(context) if all(product.dtype == "f32" for product in group.products)]
    all_flops = sum(group.flops for group in matmul_groups(context))
    result.data["fp32_matmul_flop_share"] = sum(group.flops for group in groups) / all_flops if all_flops else 0.0
    if not groups:
        return result
    times = chip_time(context)
    by_module: dict[tuple[str | None, int | None], list[tuple[MatmulGroup, float, float]]] = defaultdict(list)
    rows = []
    for group in groups:
        fractions = [saving_fraction(product, context) for product in group.products]
        weights = [product.flops for product in group.products]
        fraction = sum(f * w for f, w in zip(fractions, weights)) / sum(weights) if sum(weights) else 0.0
        chip_ns = times.attributed_ns(context, group)
        rows.append({
            "op": group.op, "inputs": group.inputs, "module": group.module, "where": context.where(group.frame_id),
            "calls": group.calls, "flops": group.flops, "compute_bound_on_target": fraction > 0,
            "saving_estimate": fraction, "chip_ns": chip_ns,
        })
        if fraction > 0:
            by_module[(group.module, group.frame_id)].append((group, fraction * chip_ns, chip_ns))
    result.data["products"] = sorted(rows, key=lambda row: -row["saving_estimate"] * row["chip_ns"])[:100]
    entries = [entry for entries in by_module.values() for entry in entries]
    cost = sum(saving for _, saving, _ in entries)
    share = context.share_of_step(cost)
    result.data["saving_estimate_ns"] = cost
    if not entries or share < MIN_REPORTED_SHARE:
        return result
    # Point at the forward call (it has a module) that would save the most.
    ranked = sorted(by_module.items(), key=lambda item: (item[0][0] is None, -sum(saving for _, saving, _ in item[1])))
    (module, frame_id), _ = ranked[0]
    chip_ns = sum(chip for _, _, chip in entries)
    flops = sum(group.flops for group, _, _ in entries)
    modules = sorted({group.module for group, _, _ in entries if group.module})
    evidence = tuple(
        context.evidence_at(
            f"{group.op}({group.inputs}) in {group.module or 'no module'}: {group.calls} calls, "
            f"{format_ns(saving)} of {format_ns(chip)} saved in bfloat16 (estimate)",
            group.frame_id, module=group.module, table="ops",
        )
        for group, saving, chip in sorted(entries, key=lambda entry: -entry[1])[:5]
    )
    where = context.where(frame_id)
    result.findings.append(Finding(
        analyzer=NAME,
        severity=context.severity(share),
        title=(
            f"Float32 matmuls on a bfloat16 MXU: {flops / max(context.step_count, 1) / 1e9:.3g} GFLOP per step in "
            f"float32{' in ' + module if module else ''} at {where}"
        ),
        explanation=(
            f"{len(entries)} compute-bound matmul shapes ({', '.join(modules[:4]) or 'no module'}) run in float32. "
            f"{context.target.label}'s MXU multiplies bfloat16, so each float32 product takes several passes "
            f"(peak float32 is estimated at {context.target.peak_fp32_flops / 1e12:.0f} TFLOP/s against "
            f"{context.target.peak_bf16_flops / 1e12:.0f} in bfloat16). They account for {format_ns(chip_ns)} of "
            f"chip time, of which bfloat16 would save about {format_ns(cost)} ({share:.0%} of a step; estimate)."
        ),
        suggestion=(
            "Run the forward pass under `torch.autocast(device_type=\"tpu\", dtype=torch.bfloat16)` (keep the loss "
            "and optimizer in float32), or cast the model with `model.to(torch.bfloat16)` if the accuracy allows."
        ),
        cost_total_ns=cost,
        cost_per_step_ns=context.per_step(cost),
        evidence=evidence,
        module=module,
        **context.location_fields(frame_id),
    ))
    return result
