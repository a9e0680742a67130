"""The target chip a device model is drawn for (`TargetChip`), from `tputrace.analysis.chips`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tputrace.analysis.chips import DEFAULT_TARGET, Chip, chip as chip_model
from tputrace.derived.imported_sources import imported_source
from tputrace.derived.op_cost import TargetChip

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

__all__ = ["DEFAULT_TARGET", "capture_chip", "target_chip", "target_of"]

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




def capture_chip(trace: Trace, rank: int | None) -> Chip | None:
    """The chip an imported TPU capture was measured on, from its device planes' type (`TPU v6 Lite`: v6e), so that
    its report and summary are for that chip unless another is asked for; None for a recording, another device or
    a type no chip model has."""
    source = imported_source(trace, rank)
    if source is None or source.get("device") != "tpu" or not source.get("device_name"):
        return None
    kinds = {kind.lower(): name for name, kind in _DEVICE_KINDS.items()}
    names = {kinds.get(part.strip().lower()) for part in str(source["device_name"]).split(",")}
    return chip_model(names.pop()) if len(names) == 1 and None not in names else None
