"""The target chip a device model is drawn for (`TargetChip`), from `tputrace.analysis.chips`."""

from __future__ import annotations

from tputrace.analysis.chips import DEFAULT_TARGET, Chip, chip as chip_model
from tputrace.derived.op_cost import TargetChip

__all__ = ["DEFAULT_TARGET", "target_chip", "target_of"]

# JAX's device_kind for each generation, which XProf shows as the device type.
_DEVICE_KINDS = {"v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite", "v7": "TPU7x"}


def target_chip(name: str = DEFAULT_TARGET) -> TargetChip:
    """The chip called `name` (v5e, v5p, v6e, v7, ...); raises `TputraceError` naming the known ones."""
    return target_of(chip_model(name))


def target_of(model: Chip) -> TargetChip:
    """The peaks of `model` as the device model (`tputrace.derived`) uses them."""
    return TargetChip(
        name=model.name,
        device_type=_DEVICE_KINDS.get(model.name, model.label),
        peak_teraflops_per_second=model.peak_bf16_flops / 1e12,
        fp32_peak_teraflops_per_second=model.peak_fp32_flops / 1e12,
        hbm_gigabytes_per_second=model.hbm_bandwidth / 1e9,
        hbm_bytes=int(model.hbm_bytes),
        source=f"{model.label}: {model.sources.get('peak_bf16_flops', 'tputrace.analysis.chips')}",
    )


