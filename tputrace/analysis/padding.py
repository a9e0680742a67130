"""Tile and MXU padding waste: matmul, conv and attention dims that do not fill the target's tiles.

On the target, the contracted dim (k) and the output features (n) are fed to an MXU of `mxu` x `mxu`
multiply-accumulators, and arrays live in HBM as (sublane, 128) tiles ((8, 128) for 32-bit types,
(16, 128) for 16-bit): a dim that is not a multiple is padded. For each product the analyzer compares
the target's roofline time with and without the padding (an estimate: the larger of compute time and
HBM time). Memory-bound products lose little to MXU padding; compute-bound ones lose the padded FLOPs.
The cost of a group is that wasted share of its chip time (see `matmuls`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from tputrace.analysis.chips import Chip, round_up
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding
from tputrace.analysis.input_features import InputFeatures, copied_feature_sizes
from tputrace.analysis.matmuls import MatmulGroup, chip_time, matmul_groups
from tputrace.analysis.shapes import Matmul, parse_specs
from tputrace.dtypes import DTYPE_BYTES
from tputrace.wording import format_ns, plural

NAME = "padding"
LANE = 128
MIN_REPORTED_SHARE = 0.005  # of a step: smaller wastes stay in the data, not in the findings
# What an output width that is a small multiple of another width usually is, by the factor.
_WIDTH_MULTIPLES = {
    2: "2 x a width is a fused pair of projections, such as a gated MLP's gate and up",
    3: "3 x the model's width is a fused q/k/v projection",
    4: "4 x the model's width is an MLP's hidden layer",
}


@dataclass(frozen=True)
class ProductPadding:
    """One product on the target: padded FLOPs and the roofline time lost to padding."""

    product: Matmul
    off_dims: tuple[tuple[str, int, int], ...]  # (role, size, alignment) of each dim off its alignment
    flops: float
    padded_flops: float
    time_ns: float
    padded_time_ns: float

    @property
    def flop_waste(self) -> float:
        return 1.0 - self.flops / self.padded_flops if self.padded_flops else 0.0

    @property
    def time_waste(self) -> float:
        return 1.0 - self.time_ns / self.padded_time_ns if self.padded_time_ns else 0.0


def pad_product(product: Matmul, chip: Chip, *, only: int | None = None) -> ProductPadding:
    """`product` as the target runs it: m to the sublane tile, k and n to the MXU size, and each operand's
    lane dim to 128 in HBM. With `only`, just the dims of that size (at or above their alignment) are
    padded: the share of the padding that one dim causes."""
    sublane = chip.tile(product.dtype)[0]
    m, k, n = product.m, product.k, product.n

    def padded(size: int, align: int) -> int:
        if only is not None and (size != only or size < align):
            return size
        return round_up(size, align)

    off = tuple(
        (role, size, align)
        for role, size, align in (("m", m, sublane), ("k", k, chip.mxu), ("n", n, chip.mxu))
        if size % align
    )
    size = DTYPE_BYTES.get(product.dtype, 4)
    flops = product.flops
    padded_flops = 2.0 * product.batch * padded(m, sublane) * padded(k, chip.mxu) * padded(n, chip.mxu)
    padded_bytes = product.batch * size * (
        padded(m, sublane) * padded(k, LANE) + padded(k, sublane) * padded(n, LANE) + padded(m, sublane) * padded(n, LANE)
    )
    time_ns = chip.roofline_ns(flops, product.bytes, product.dtype)
    padded_time_ns = chip.roofline_ns(padded_flops, float(padded_bytes), product.dtype)
    return ProductPadding(product, off, flops, padded_flops, time_ns, max(padded_time_ns, time_ns))


def aligned_sizes(size: int, align: int) -> tuple[int, int | None]:
    """The aligned sizes around `size`: (next multiple up, next multiple down or None below `align`)."""
    up = round_up(size, align)
    down = (size // align) * align
    return up, (down if down > 0 else None)


@dataclass(frozen=True)
class PaddedProduct:
    """One matmul-like op shape at one line: its padding on the target and the chip time it loses (estimates)."""

    op: str
    inputs: str
    module: str | None
    where: str
    calls: int
    flops: float
    padded_flop_share: float
    time_waste_estimate: float
    cost_ns: float
    off_dims: tuple[tuple[int, int], ...]  # (size, alignment) of each dim off its tile or MXU


@dataclass(frozen=True)
class PaddingData:
    products: tuple[PaddedProduct, ...] = ()  # the costliest
    padded_flop_share: float = 0.0
    chip_time: str | None = None  # how the chip time was found; None without matmuls


def analyze(context: AnalysisContext) -> AnalysisResult[PaddingData]:
    groups = matmul_groups(context)
    if not groups:
        return AnalysisResult(NAME, PaddingData())
    times = chip_time(context)
    target = context.target
    # One finding per dim size, over every role it plays (a hidden size is k in one product, n or m in
    # another). Only dims at or above their alignment count: a dim below it (a batch of 32, 10 classes)
    # cannot be rounded down and its padding is inherent to its size; that stays in the data.
    by_size: dict[int, list[tuple[MatmulGroup, float, float]]] = defaultdict(list)
    alignment: dict[int, int] = {}
    total_flops = sum(group.flops for group in groups)
    wasted_flops = 0.0
    rows: list[PaddedProduct] = []
    for group in groups:
        paddings = [pad_product(product, target) for product in group.products]
        padded_time = sum(padding.padded_time_ns for padding in paddings)
        lost_time = sum(padding.padded_time_ns - padding.time_ns for padding in paddings)
        fraction = lost_time / padded_time if padded_time else 0.0
        chip_ns = times.attributed_ns(context, group)
        group_wasted = group.calls * sum(padding.padded_flops - padding.flops for padding in paddings)
        wasted_flops += group_wasted
        off_dims = {(size, align) for padding in paddings for _, size, align in padding.off_dims}
        rows.append(PaddedProduct(
            group.op, group.inputs, group.module, context.where(group.frame_id), group.calls, group.flops,
            group_wasted / (group.flops + group_wasted) if group.flops + group_wasted else 0.0, fraction,
            fraction * chip_ns, tuple(sorted(off_dims)),
        ))
        for size in sorted({size for size, align in off_dims if size >= align}):
            alignment[size] = max([alignment.get(size, 0)] + [align for dim, align in off_dims if dim == size and size >= align])
            alone = [pad_product(product, target, only=size) for product in group.products]
            lost = sum(padding.padded_time_ns - padding.time_ns for padding in alone)
            wasted = group.calls * sum(padding.padded_flops - padding.flops for padding in alone)
            by_size[size].append((group, chip_ns * lost / padded_time if padded_time else 0.0, wasted))
    data = PaddingData(
        tuple(sorted(rows, key=lambda row: -row.cost_ns)[:100]),
        wasted_flops / (total_flops + wasted_flops) if total_flops else 0.0,
        ("the chip's work inside strict mode's op times, attributed by FLOP share" if times.inferred
         else "measured, attributed by FLOP share") if times.measured else "target roofline estimate",
    )
    input_rows = _input_rows(groups)
    classes = _class_counts(context)
    data_sizes = copied_feature_sizes(context)
    fed_to_mxu = _below_mxu(groups, target.mxu)
    multiples = _multiples_of_widths(groups)
    findings = (_finding(context, size, alignment[size], entries, input_rows.get(size), data_sizes.get(size),
                         fed_to_mxu.get(size, 0), multiples.get(size))
                for size, entries in by_size.items() if size not in classes)
    return AnalysisResult(NAME, data, tuple(finding for finding in findings if finding is not None))


def _class_counts(context: AnalysisContext) -> set[int]:
    """The number of classes of each classification loss (the class dim of `nll_loss`'s or `multi_margin_loss`'s
    input): the labels set it, not the model, so a head's products padded at it have no other size to take."""
    loss_sids = [sid for (sid,) in context.trace.sql(
        "SELECT id FROM strings WHERE text LIKE 'aten.nll\\_loss%' ESCAPE '\\' OR text LIKE 'aten.multi\\_margin\\_loss%' ESCAPE '\\'"
    )]
    if not loss_sids:
        return set()
    classes: set[int] = set()
    for (inputs_sid,) in context.trace.sql(
        f"SELECT DISTINCT inputs_sid FROM ops WHERE rank = ? AND op_sid IN ({', '.join('?' for _ in loss_sids)})",
        (context.rank, *loss_sids),
    ):
        specs = [spec for spec in parse_specs(context.trace.string(inputs_sid)) if spec is not None and spec.shape]
        scores = next((spec for spec in specs if spec.dtype.startswith(("f", "bf"))), None)
        if scores is not None and len(scores.shape) >= 2:
            classes.add(scores.shape[1])
    return classes


def _below_mxu(groups: list[MatmulGroup], mxu: int) -> dict[int, int]:
    """The sizes below the MXU's width that are the contracted or output dim (k, n) of some products (an attention
    head's width in `q @ k.T` and `attn @ v`), each with its number of such product shapes: the MXU pads them to its
    width whatever their value, so no nearby multiple of the sublane tile changes that padding."""
    counts: dict[int, int] = defaultdict(int)
    for group in groups:
        for size in {size for product in group.products for size in (product.k, product.n) if size < mxu}:
            counts[size] += 1
    return dict(counts)


def _input_rows(groups: list[MatmulGroup]) -> dict[int, MatmulGroup]:
    """The sizes that are only ever the rows (m) of a module's products, never their features (k or n), each with
    the module's costliest such product: the rows of the layers' inputs, the batch (times the sequence length of an
    input flattened to rows), which the data chooses, not the model. A weight's gradient contracts over them."""
    forward = [group for group in groups if group.module is not None]
    features = {size for group in forward for product in group.products for size in (product.k, product.n)}
    rows: dict[int, MatmulGroup] = {}
    for group in sorted(forward, key=lambda group: -group.flops):
        for product in group.products:
            if product.m not in features:
                rows.setdefault(product.m, group)
    return rows


def _finding(context: AnalysisContext, size: int, align: int, entries: list[tuple[MatmulGroup, float, float]],
             rows_of: MatmulGroup | None, copied: InputFeatures | None, mxu_products: int = 0,
             multiple: tuple[int, int] | None = None) -> Finding | None:
    """The finding for one padded dim size; `copied` is the tensor each step brings in (copied from the host or made
    on the chip) whose features the size is (the data fixes it: no other size is suggested), `rows_of` the module whose
    input rows it is, `mxu_products` the number of product shapes whose k or n it is, below the MXU's width, and
    `multiple` (factor, width) where the size is an output width that is a small multiple of a width the model uses
    elsewhere (a fused q/k/v projection's 3 x d_model, an MLP's 4 x d_model)."""
    cost = sum(cost for _, cost, _ in entries)
    share = context.share_of_step(cost)
    basis = ("chip's work inside strict mode's op times" if chip_time(context).inferred else "measured chip time")
    groups = {id(group): (group, wasted) for group, _, wasted in entries}
    dim_flops = sum(group.flops for group, _ in groups.values())
    dim_wasted = sum(wasted for _, wasted in groups.values())
    flop_share = dim_wasted / (dim_flops + dim_wasted) if dim_flops else 0.0
    if share < MIN_REPORTED_SHARE:
        return None
    # The line to point at: the forward call (it has a module) with the largest cost.
    ordered = sorted(entries, key=lambda entry: (entry[0].module is None, -entry[1]))
    anchor = ordered[0][0] if rows_of is None else rows_of
    up, down = aligned_sizes(size, align)
    nearest = up if down is None or up - size <= size - down else down
    other = down if nearest == up else up
    what = "the MXU" if align == context.target.mxu else f"the {align}-row tile"
    modules = sorted({group.module for group, _, _ in entries if group.module})
    evidence = [
        context.evidence_at(
            f"{group.op}({group.inputs}) in {group.module or 'no module'}: {plural(group.calls, 'call')}, "
            f"{format_ns(cost)} of chip time lost (estimate)",
            group.frame_id, module=group.module, table="ops",
        )
        for group, cost, _ in sorted(entries, key=lambda entry: -entry[1])[:5]
    ]
    evidence.append(Evidence(
        f"{size} pads to {up} on {context.target.label}: {flop_share:.1%} of these products' FLOPs are padding"
    ))
    alternative = f" (or {other})" if other else ""
    fixed = copied is not None and rows_of is None
    suggestion = _suggestion(size, align, nearest, alternative, anchor, rows_of is not None, context.target.mxu)
    if mxu_products and align != context.target.mxu and rows_of is None and copied is None:
        suggestion = _far_below_mxu(size, align, up, mxu_products, context.target.mxu)
    elif multiple is not None and rows_of is None and copied is None:
        suggestion = _multiple_of_width(size, align, *multiple, anchor)
    if copied is not None and rows_of is None:
        suggestion = (
            f"{size} is the size of the input's features, which the data fixes: {copied.origin_text()}, {size} "
            f"features once flattened, so the model has no other size to give this dim. Accept the padding to {up} as "
            f"the cost of the input's size (padding the input with zero features to {up} by hand, `F.pad`, costs the "
            f"same; trimming the data to fewer features loses information); the sizes the model chooses (its hidden sizes) are "
            f"where a multiple of {align} avoids padding."
        )
    return Finding(
        analyzer=NAME,
        severity="info" if fixed else context.severity(share, warning=0.02),
        title=(
            f"Tile padding: {'input rows' if rows_of else 'input features' if fixed else 'dim'} {size} is off {what} of {context.target.label} ({align}); "
            f"{flop_share:.1%} of its matmul FLOPs are padding"
        ),
        explanation=(
            f"Matrix products with a dim of {size} ({len(groups)} op shapes"
            f"{', in ' + ', '.join(modules[:4]) if modules else ''}) are padded to {up} on the target, a multiple "
            f"of {align}: {flop_share:.1%} of their FLOPs are padding. On {context.target.label} that costs an "
            f"estimated {format_ns(cost)} of chip time ({share:.1%} of a step; roofline estimate applied to the "
            f"{basis})."
        ),
        suggestion=suggestion,
        cost_total_ns=cost,
        cost_per_step_ns=context.per_step(cost),
        evidence=tuple(evidence),
        module=anchor.module,
        **context.location_fields(anchor.frame_id),
    )


def _suggestion(size: int, align: int, nearest: int, alternative: str, anchor: MatmulGroup, input_rows: bool,
                mxu: int) -> str:
    """What to change: the dim in the model, or for the layers' input rows, the batch that makes them."""
    fills = f"a multiple of {align} fills the {'MXU' if align == mxu else 'tiles'} with no padding"
    if input_rows:
        return (f"{size} is the number of rows {anchor.module} takes ({anchor.op}({anchor.inputs})): the batch size, "
                f"times the sequence length when the input is flattened to rows. The weights' gradients contract "
                f"over it, so the model's dims cannot fix it: choose a batch (and length) that make {nearest}"
                f"{alternative} rows ({fills}).")
    return f"Use {nearest}{alternative} instead of {size} for this dim{' in ' + anchor.module if anchor.module else ''}: {fills}."


def _far_below_mxu(size: int, align: int, up: int, mxu_products: int, mxu: int) -> str:
    """What is true of a dim far below the MXU that is also some products' rows: a multiple of the sublane tile
    removes the rows' padding only; the MXU pads the dim to its width wherever it is contracted or an output."""
    return (f"{size} is also the contracted or output dim of {plural(mxu_products, 'product shape')} (k or n, as an attention "
            f"head's width in `q @ k.T` and `attn @ v`), where the MXU pads it to {mxu} whatever its value below {mxu}: "
            f"{1 - size / mxu:.0%} of those products' multiply-accumulators idle. Changing {size} to a multiple of {align} "
            f"would remove only the rows' padding to {up} counted here, not the MXU's. Only a dim nearer {mxu} fills "
            "the MXU: for attention, fewer, wider heads (`d_model / nhead` nearer the MXU's width); where a small width is the "
            "model's choice, the padding is the cost of that size.")


def _multiples_of_widths(groups: list[MatmulGroup]) -> dict[int, tuple[int, int]]:
    """Each output width (n) of a module's products that is 2, 3 or 4 times a width the model's products use elsewhere
    (their k or n): a fused q/k/v projection's 3 x d_model, a gated MLP's 2 x hidden, an MLP's 4 x d_model. The size
    follows that width, so it changes only with it. The value is (factor, width), the width the most product shapes
    use where several fit. Convolutions are left out: a CNN doubles its channels by choice, each width its own."""
    forward = [group for group in groups if group.module is not None and "convolution" not in group.op]
    uses: dict[int, int] = defaultdict(int)
    for group in forward:
        for size in {size for product in group.products for size in (product.k, product.n)}:
            uses[size] += 1
    multiples: dict[int, tuple[int, int]] = {}
    for size in {product.n for group in forward for product in group.products}:
        fits = [(uses[size // factor], factor) for factor in (2, 3, 4) if size % factor == 0 and uses.get(size // factor)]
        if fits:
            _, factor = max(fits)
            multiples[size] = (factor, size // factor)
    return multiples


def _multiple_of_width(size: int, align: int, factor: int, width: int, anchor: MatmulGroup) -> str:
    """What to change for an output width that is `factor` x `width`: the width, to one that makes both tile."""
    aligned = [value for value in aligned_sizes(width, align)[::-1] if value]
    both = " or ".join(str(value) for value in aligned)
    step = align // math.gcd(factor, align)  # the widths whose multiple fills the MXU
    only = " or ".join(f"{value} ({factor} x {value} = {factor * value})"
                       for value in dict.fromkeys(aligned_sizes(width, step)[::-1]) if value and value not in aligned)
    takes = f" (the width {anchor.module} takes)" if anchor.module else ""
    text = (f"{size} is {factor} x {width}, a width the model uses elsewhere ({_WIDTH_MULTIPLES[factor]}), so it changes "
            f"only with {width}: change {width} itself{takes}, not {size} alone. A width that is a multiple of {align} "
            f"({both}) fills the MXU both as itself and as {factor} x it")
    if not only:
        return text + "."
    return text + f"; a multiple of {step} ({only}) fills it in the {factor} x products only."
