"""Live and peak bytes held by tpu tensors, per chip (what `torch.tpu.memory_allocated` reports)."""

from __future__ import annotations

from collections import defaultdict

_live_bytes: defaultdict[int, int] = defaultdict(int)
_peak_bytes: defaultdict[int, int] = defaultdict(int)


def allocate(chip: int, nbytes: int) -> None:
    live = _live_bytes[chip] + nbytes
    _live_bytes[chip] = live
    if live > _peak_bytes[chip]:
        _peak_bytes[chip] = live


def release(chip: int, nbytes: int) -> None:
    _live_bytes[chip] -= nbytes


def live_bytes(chip: int) -> int:
    return _live_bytes[chip]


def peak_bytes(chip: int) -> int:
    return _peak_bytes[chip]


def reset_peak(chip: int) -> None:
    _peak_bytes[chip] = _live_bytes[chip]


def chips_in_use() -> list[int]:
    return sorted(_live_bytes)
