"""What a rank's op times are, so that every view labels them alike: host dispatch (a recording; an import of a
profiler's host-side ops), or the device's own op times (an XProf import's XLA ops, each op's self time on the
chip); and whether a chip time share projected for a target chip is told beside them (a recording; an import
whose programs carry XLA's costs, unless measured on a TPU, whose own times need no projection)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.derived.imported_sources import imported_source

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

HOST_DISPATCH = "host dispatch"
DEVICE_OP_TIME = "device op time"


@dataclass(frozen=True)
class OpTimeKind:
    """How a rank's op times read: `device_ops` when they are the device's op times, not host dispatch;
    `chip_share` when a chip time share projected for a target is told beside them."""

    device_ops: bool
    chip_share: bool

    @property
    def label(self) -> str:
        """The op times' name: `host dispatch` or `device op time`."""
        return DEVICE_OP_TIME if self.device_ops else HOST_DISPATCH


def op_time_kind(trace: Trace, rank: int, programs_costed: bool | None = None) -> OpTimeKind:
    """What `rank`'s op times are; `programs_costed` (whether any program run had XLA's costs) is read from the
    trace when not given, and only for an imported rank."""
    source = imported_source(trace, rank)
    if source is None:
        return OpTimeKind(device_ops=False, chip_share=True)
    if programs_costed is None:
        programs_costed = bool(trace.sql(
            "SELECT 1 FROM executions e JOIN programs p ON p.id = e.program_id WHERE e.rank = ? "
            "AND (p.flops IS NOT NULL OR p.bytes_accessed IS NOT NULL) LIMIT 1", (rank,)))
    return OpTimeKind(device_ops=source.get("format") == "xplane",
                      chip_share=programs_costed and source.get("device") != "tpu")
