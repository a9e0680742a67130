"""What the recorder reads from the device (`DeviceReadings`: memory in use and tensor shapes) and the
backend's readings of it (`BackendReadings`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol


class DeviceReadings(Protocol):
    """What the recorder reads from the device it records."""

    def memory_in_use(self) -> Iterable[tuple[int, int, int]]:
        """(chip, live bytes, peak bytes) of each chip in use."""
        ...

    def shape_text(self, tensor: Any) -> str:
        """A tensor's dtype and shape as the trace writes them: `f32[2,3]`."""
        ...

    def chip_of(self, tensor: Any) -> int:
        """The chip a tensor is on."""
        ...


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
