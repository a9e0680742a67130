"""The backend's readings for the recorder (`tputrace.recording.interface.DeviceReadings`): memory in use and tensor shapes."""

from __future__ import annotations

from typing import Any


class BackendReadings:
    """`DeviceReadings` read from the loaded backend."""

    def memory_in_use(self) -> list[tuple[int, int, int]]:
        from tputrace.backend.core import memory

        return [(chip, memory.live_bytes(chip), memory.peak_bytes(chip)) for chip in memory.chips_in_use()]

    def shape_text(self, tensor: Any) -> str:
        from tputrace.backend.core.dtypes import short_name

        return f"{short_name(tensor.dtype)}[{','.join(str(size) for size in tensor.shape)}]"

    def chip_of(self, tensor: Any) -> int:
        return tensor._buf.chip
