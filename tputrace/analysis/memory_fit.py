"""Whether a run's peak fits a target chip's HBM once XLA pads arrays to the chip's native tiles, and, where it
does not, which changes would fit it, each estimated from what was live at the peak.

Padding: the last two dims of an array are padded to the chip's (sublane, lane) tile ((8, 128) for 32-bit types,
(16, 128) for 16-bit, (32, 128) for 8-bit); a vector is laid out as one row. A program's working memory has no
shape in the trace: it is padded by the ratio the shaped buffers live at the peak pad by (an estimate).

Estimates, from the peak's padded bytes by kind: activations, temporaries and working memory scale with the batch;
checkpointing a module keeps only its largest activation of those it holds at the peak; bfloat16 halves float32
bytes (re-padded to the 16-bit tile); FSDP divides parameters, gradients and optimizer state by the ranks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from tputrace.analysis.chips import Chip, round_up
from tputrace.analysis.memory_peak import PeakBreakdown
from tputrace.derived.memory_timeline import BufferLifetime
from tputrace.dtypes import NUMPY_NAMES, element_bytes
from tputrace.wording import format_bytes

LANE = 128
BATCH_SCALED = frozenset({"activation", "temporary", "program_temporary"})
SHARDED = frozenset({"parameter", "gradient", "optimizer_state"})
DIVISORS = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class FitChange:
    """One change and its estimated effect on the padded peak."""

    change: str  # batch, checkpoint, bfloat16, shard
    description: str
    peak_bytes: int
    saves_bytes: int
    fits: bool
    module: str | None = None


@dataclass(frozen=True)
class MemoryFit:
    """A chip's peak against the target's HBM, padded to native tiles, and the changes that would fit it."""

    chip: int
    target: str
    hbm_bytes: int
    peak_bytes: int
    padded_peak_bytes: int
    fits: bool
    over_bytes: int
    changes: tuple[FitChange, ...]


def padded_bytes(shape: tuple[int, ...], dtype: str | None, target: Chip) -> int:
    """Bytes of an array of `shape` and `dtype` laid out in the target's native tiles."""
    item = element_bytes(NUMPY_NAMES.get(dtype or "")) or 4
    sublane, lane = target.tile_of_size(item)
    if not shape:
        return sublane * lane * item if item else 0
    rows = shape[-2] if len(shape) >= 2 else 1
    outer = 1
    for size in shape[:-2]:
        outer *= size
    return outer * round_up(max(rows, 1), sublane) * round_up(max(shape[-1], 1), lane) * item if all(shape) else 0


def fit(breakdown: PeakBreakdown, live: Sequence[BufferLifetime], target: Chip, batch: int | None = None) -> MemoryFit:
    """Whether the peak in `breakdown` (whose live buffers are `live`) fits `target`, and what would fit it;
    `batch`, when known, bounds how many times smaller a batch can be."""
    padded_by_kind: dict[str, int] = defaultdict(int)
    f32_padded_by_kind: dict[str, int] = defaultdict(int)
    bf16_padded_by_kind: dict[str, int] = defaultdict(int)
    shaped_raw = shaped_padded = 0
    for buffer in live:
        if buffer.shape is None:
            continue
        padded = padded_bytes(buffer.shape, buffer.dtype, target)
        padded_by_kind[buffer.kind] += padded
        shaped_raw += buffer.bytes
        shaped_padded += padded
        if buffer.dtype == "float32":
            f32_padded_by_kind[buffer.kind] += padded
            bf16_padded_by_kind[buffer.kind] += padded_bytes(buffer.shape, "bfloat16", target)
    ratio = shaped_padded / shaped_raw if shaped_raw else 1.0
    working = sum(buffer.bytes for buffer in live if buffer.shape is None)
    padded_by_kind["program_temporary"] += int(working * ratio)
    padded_peak = sum(padded_by_kind.values())
    hbm = int(target.hbm_bytes)
    changes: list[FitChange] = []
    changes += _batch(padded_by_kind, hbm, batch)
    changes += _checkpoints(breakdown, ratio, padded_peak, hbm)
    changes += _bfloat16(padded_by_kind, f32_padded_by_kind, bf16_padded_by_kind, working, ratio, padded_peak, hbm)
    changes += _sharding(padded_by_kind, padded_peak, hbm)
    changes.sort(key=lambda change: (not change.fits, -change.saves_bytes))
    return MemoryFit(breakdown.chip, target.label, hbm, breakdown.bytes, padded_peak, padded_peak <= hbm,
                     max(0, padded_peak - hbm), tuple(changes))


def _batch(padded_by_kind: dict[str, int], hbm: int, batch: int | None) -> list[FitChange]:
    """The smallest power-of-two division of the batch that fits (at most the batch itself, when known)."""
    scaled = sum(padded_by_kind[kind] for kind in BATCH_SCALED)
    fixed = sum(padded_by_kind.values()) - scaled
    divisors = [divisor for divisor in DIVISORS if batch is None or divisor <= batch]
    if not scaled or not divisors:
        return []
    for divisor in divisors:
        peak = fixed + scaled // divisor
        if peak <= hbm or divisor == divisors[-1]:
            sizes = f" ({batch} -> {batch // divisor} a step)" if batch else ""
            return [FitChange("batch", f"a batch {divisor}x smaller per step{sizes}, with {divisor} gradient-accumulation "
                                       f"steps (activations and temporaries, {format_bytes(scaled)}, scale with the batch)",
                              peak, fixed + scaled - peak, peak <= hbm)]
    return []


def _checkpoints(breakdown: PeakBreakdown, ratio: float, padded_peak: int, hbm: int) -> list[FitChange]:
    """Checkpointing the repeated blocks (entries of a ModuleList or Sequential): each keeps its largest
    activation-like part at the peak and recomputes the rest in backward."""
    held: dict[str, list[int]] = defaultdict(list)
    for part in breakdown.parts:
        if part.kind not in BATCH_SCALED or part.module is None:
            continue
        block = _block(part.module)
        if block is not None:
            held[block].append(int(part.bytes * ratio))
    saves = {block: sum(parts) - max(parts) for block, parts in held.items() if sum(parts) > max(parts)}
    if not saves:
        return []
    ranked = sorted(saves.items(), key=lambda item: -item[1])
    total = sum(saves.values())
    blocks = [block for block, _ in ranked]
    each = ", ".join(f"{block} {format_bytes(saved)}" for block, saved in ranked[:6])
    changes = [FitChange("checkpoint", f"activation checkpointing (torch.utils.checkpoint) on {_names(blocks)}: saves {each}",
                         padded_peak - total, total, padded_peak - total <= hbm, module=blocks[0])]
    block, saved = ranked[0]
    if len(ranked) > 1:
        changes.append(FitChange("checkpoint", f"activation checkpointing on {block} alone", padded_peak - saved, saved,
                                 padded_peak - saved <= hbm, module=block))
    return changes


def _block(module: str) -> str | None:
    """The shallowest entry of a module list on `module`'s path (`Model.blocks.3` of `Model.blocks.3.mlp.0`)."""
    names = module.split(".")
    for index in range(1, len(names)):
        if names[index].isdigit():
            return ".".join(names[: index + 1])
    return ".".join(names[:2]) if len(names) >= 2 else None


def _names(blocks: list[str]) -> str:
    return ", ".join(blocks) if len(blocks) <= 4 else f"{', '.join(blocks[:3])} and {len(blocks) - 3} more"


def _bfloat16(padded_by_kind: dict[str, int], f32: dict[str, int], bf16: dict[str, int], working: int, ratio: float,
              padded_peak: int, hbm: int) -> list[FitChange]:
    """Autocast to bfloat16 (activations, temporaries, working memory) and a model kept in bfloat16 throughout."""
    shaped_scaled = sum(f32[kind] for kind in BATCH_SCALED)
    autocast_saves = shaped_scaled - sum(bf16[kind] for kind in BATCH_SCALED) + int(working * ratio) // 2
    whole_saves = autocast_saves + sum(f32[kind] - bf16[kind] for kind in padded_by_kind if kind not in BATCH_SCALED)
    changes = []
    if autocast_saves > 0:
        changes.append(FitChange("bfloat16", "bfloat16 activations (torch.autocast(\"tpu\", dtype=torch.bfloat16))",
                                 padded_peak - autocast_saves, autocast_saves, padded_peak - autocast_saves <= hbm))
    if whole_saves > autocast_saves:
        changes.append(FitChange("bfloat16", "the model, gradients and optimizer state in bfloat16 too (model.to(torch.bfloat16))",
                                 padded_peak - whole_saves, whole_saves, padded_peak - whole_saves <= hbm))
    return changes


def _sharding(padded_by_kind: dict[str, int], padded_peak: int, hbm: int) -> list[FitChange]:
    sharded = sum(padded_by_kind[kind] for kind in SHARDED)
    if not sharded:
        return []
    for ranks in DIVISORS:
        peak = padded_peak - sharded + sharded // ranks
        if peak <= hbm or ranks == DIVISORS[-1]:
            return [FitChange("shard", f"FSDP (fully_shard) over {ranks} chips: parameters, gradients and optimizer state "
                                       f"{format_bytes(sharded // ranks)} per rank instead of {format_bytes(sharded)}",
                              peak, padded_peak - peak, peak <= hbm)]
    return []
