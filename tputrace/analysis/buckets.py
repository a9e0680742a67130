"""Bucketing a varying dim: which dims of a program's inputs change from compile to compile, and the
bucket sizes that would need fewer compiles, weighed against the padding FLOPs they add (an estimate
that assumes a program's FLOPs grow linearly with the dim)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tputrace.analysis.chips import round_up
from tputrace.analysis.shapes import TensorSpec, parse_specs

BUCKET_MULTIPLES = (8, 16, 32, 64, 128, 256, 512)
MAX_PROPOSED_PADDING = 0.25  # the proposal keeps padding FLOPs under this share when any option does
MAX_OPTION_PADDING = 1.0  # an option that more than doubles the FLOPs is not offered (512s for sizes near 100)


@dataclass(frozen=True)
class VaryingDim:
    """One logical dim that varies across a site's compiles: every (input, dim) with the same values."""

    positions: tuple[tuple[int, int], ...]
    values: tuple[int, ...]  # per compile, in compile order

    @property
    def label(self) -> str:
        index, dim = self.positions[0]
        more = len(self.positions) - 1
        return f"input {index} dim {dim}" + (f" (and {more} more input dims with the same values)" if more else "")

    @property
    def distinct(self) -> list[int]:
        return sorted(set(self.values))


class CompileWeight(Protocol):
    """What one compile of a varying dim weighs in a bucketing: how often its program ran, and its FLOPs per run
    (from XLA's cost analysis; 0 when unknown)."""

    @property
    def runs(self) -> int: ...

    @property
    def flops(self) -> float: ...


@dataclass(frozen=True)
class BucketOption:
    """One way to bucket a varying dim: the buckets, compiles needed, padding FLOPs added (estimates)."""

    rule: str
    buckets: tuple[int, ...]
    compiles: int
    compiles_saved: int
    padding_flops_estimate: float
    padding_share_estimate: float
    estimated_cost_ns: float


def signature_layout(signature: str) -> tuple[tuple[str, int] | None, ...]:
    """A signature's inputs without their sizes: each tensor's dtype and rank, None for a non-tensor. Signatures of
    one layout are one program at different shapes (see `varying_dims`)."""
    return tuple(None if spec is None else (spec.dtype, len(spec.shape)) for spec in parse_specs(signature))


def varying_dims(signatures: list[str]) -> list[VaryingDim]:
    """The dims that differ across signatures of the same inputs (same count, dtypes and ranks).

    Returns [] when the signatures are not one program at different shapes. (input, dim) pairs that
    took the same values in every compile are one logical dim (a sequence length shared by many inputs).
    """
    parsed = [parse_specs(signature) for signature in signatures]
    if len(parsed) < 2 or len({len(specs) for specs in parsed}) != 1:
        return []
    if len({tuple(sorted(map(repr, specs))) for specs in parsed}) == 1:
        return []  # the same inputs in another order (a backward whose ops ran in another order): no shape changed
    columns: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for index in range(len(parsed[0])):
        specs: list[TensorSpec | None] = [signature[index] for signature in parsed]
        if any(spec is None for spec in specs):
            if not all(spec is None for spec in specs):
                return []
            continue
        tensors = [spec for spec in specs if spec is not None]
        if len({spec.dtype for spec in tensors}) != 1 or len({len(spec.shape) for spec in tensors}) != 1:
            return []
        for dim in range(len(tensors[0].shape)):
            values = tuple(spec.shape[dim] for spec in tensors)
            if len(set(values)) > 1:
                columns.setdefault(values, []).append((index, dim))
    dims = [VaryingDim(tuple(positions), values) for values, positions in columns.items()]
    return sorted(dims, key=lambda dim: (-len(set(dim.values)), -len(dim.positions)))


def bucket_options(dim: VaryingDim, weights: Sequence[CompileWeight], mean_compile_ns: float,
                   exec_ns: float) -> list[BucketOption]:
    """Bucketings of `dim` (`weights`: one per compile, in its values' order) that need fewer compiles,
    cheapest (compiles + padding, estimated) first; those that make no sense for the sizes seen are left out
    (see `sensible`).

    Padding FLOPs assume a program's FLOPs grow linearly with the dim (attention grows faster, so this
    is a lower bound); the padding's time is that share of the measured execution time of the site.
    """
    by_value: dict[int, float] = {}
    for value, weight in zip(dim.values, weights):
        by_value[value] = by_value.get(value, 0.0) + weight.runs * (weight.flops or 1.0)
    distinct = sorted(by_value)
    base_flops = sum(by_value.values())
    have_flops = any(weight.flops for weight in weights)
    rules: list[tuple[str, dict[int, int]]] = []
    for multiple in BUCKET_MULTIPLES:
        rules.append((f"multiple of {multiple}", {value: round_up(value, multiple) for value in distinct}))
    rules.append(("power of two", {value: 1 << (value - 1).bit_length() if value > 0 else 0 for value in distinct}))
    options: dict[tuple[int, ...], BucketOption] = {}
    for rule, mapping in rules:
        buckets = tuple(sorted(set(mapping.values())))
        if len(buckets) >= len(distinct) or buckets in options:
            continue
        added = sum(flops * (mapping[value] / value - 1.0) for value, flops in by_value.items() if value > 0)
        share = added / base_flops if base_flops else 0.0
        cost = len(buckets) * mean_compile_ns + share * exec_ns
        options[buckets] = BucketOption(rule, buckets, len(buckets), len(distinct) - len(buckets),
                                        added if have_flops else 0.0, share, cost)
    return sorted(sensible(list(options.values())), key=lambda option: (option.estimated_cost_ns, option.compiles))


def sensible(options: list[BucketOption]) -> list[BucketOption]:
    """The options worth offering: none that more than doubles the FLOPs (`MAX_OPTION_PADDING`), and none that
    another beats on both counts (as few compiles or fewer, as little padding or less: a multiple of 256 when a
    multiple of 128 already makes one bucket)."""
    kept = [option for option in options if option.padding_share_estimate <= MAX_OPTION_PADDING]
    return [option for option in kept if not any(_dominates(other, option) for other in kept)]


def _dominates(better: BucketOption, option: BucketOption) -> bool:
    return (better.compiles <= option.compiles and better.padding_share_estimate <= option.padding_share_estimate
            and (better.compiles, better.padding_share_estimate) != (option.compiles, option.padding_share_estimate))


def propose(options: list[BucketOption], current_cost_ns: float) -> BucketOption | None:
    """The cheapest option (estimated) that keeps padding under `MAX_PROPOSED_PADDING`, else the one with the
    least padding; None when no option beats compiling every shape."""
    if not options:
        return None
    moderate = [option for option in options if option.padding_share_estimate <= MAX_PROPOSED_PADDING]
    if moderate:
        return moderate[0]
    least = min(options, key=lambda option: option.padding_share_estimate)
    return least if least.estimated_cost_ns < current_cost_ns else None
